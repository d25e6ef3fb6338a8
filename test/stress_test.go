//go:build integration

package test

import (
	"context"
	"fmt"
	"runtime/pprof"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/ntb/shm"
)

const (
	stressConns = 4
	stressMsgs  = 1_000_000 // in total: both directions, every connection
	shortMsgs   = 40_000    // with -short (and for -race)
	stressPort  = 100
)

// TestStress is the acceptance test of the data path: a million messages
// of 1 B - 256 KiB (log-uniform, ≈ 20.5 KiB on average: ≈ 21 GB in all)
// over four full-duplex connections between two processes, with readers
// that stall and read in small pieces at random. Every message is checked
// on arrival (seq, len, CRC-32C, payload), and at the end both processes'
// totals per connection and direction must agree: nothing lost,
// duplicated, reordered or corrupted, under back-pressure, and every stream
// ends with a clean io.EOF.
func TestStress(t *testing.T) {
	total := stressMsgs
	if testing.Short() {
		total = shortMsgs
	}
	perStream := total / (2 * stressConns)
	seed := seed(t)
	dir := fabricDir(t)
	budget := 4 * time.Minute
	if d, ok := t.Deadline(); ok {
		budget = max(min(budget, time.Until(d)-20*time.Second), 10*time.Second)
	}

	ep := openEnd(t, dir, shm.Side0)
	ch := startChild(t, "stress", childParams{Dir: dir, Side: shm.Side1, Listen: true, BasePort: stressPort,
		Conns: stressConns, Msgs: perStream, Seed: seed, Budget: budget})
	end, err := newLinkEnd(ep, false, stressPort, stressConns)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conns, err := end.connect(ctx, stressConns)
	require.NoError(t, err)

	// A hang becomes a deadline error, with both processes' goroutines in
	// the log, rather than the test binary's timeout.
	deadline := time.Now().Add(budget)
	for _, c := range conns {
		c.SetDeadline(deadline)
	}
	pool := newPool(seed)
	start := time.Now()
	sums, err := exchange(conns, seed, pool, fromParent, perStream)
	elapsed := time.Since(start)
	if err != nil {
		if strings.Contains(err.Error(), "deadline") {
			var b strings.Builder
			pprof.Lookup("goroutine").WriteTo(&b, 1)
			t.Logf("parent goroutines:\n%s", b.String())
			ch.dump()
		}
		t.Fatalf("after %v: %v", elapsed.Round(time.Millisecond), err)
	}

	r := ch.next(time.Minute)
	require.Len(t, r.Summary, stressConns, "child summary")
	var msgs, bytes int64
	for i, s := range sums {
		theirs := r.Summary[i]
		require.Equal(t, int64(perStream), s.Sent.Msgs, "connection %d: messages sent", i)
		require.Equal(t, s.Sent, theirs.Recvd, "connection %d: parent sent, child received", i)
		require.Equal(t, theirs.Sent, s.Recvd, "connection %d: child sent, parent received", i)
		msgs += s.Sent.Msgs + s.Recvd.Msgs
		bytes += s.Sent.Bytes + s.Recvd.Bytes
	}
	ch.finish(10 * time.Second)
	require.Equal(t, int64(total), msgs)
	t.Logf("%d messages (%d per connection and direction), %.2f GB of payload, mean %.0f B, in %v: %.0f msgs/s, %.0f MB/s",
		msgs, perStream, float64(bytes)/1e9, float64(bytes)/float64(msgs), elapsed.Round(time.Millisecond),
		float64(msgs)/elapsed.Seconds(), float64(bytes)/1e6/elapsed.Seconds())
}

// roleStress is the child of TestStress (and of the reconnection in
// TestKillPeer): it connects, runs the exchange, reports its totals and
// waits for the test to let it go.
func roleStress(ctl *childCtl, p childParams) error {
	ep, conns, err := childConnect(ctl, p)
	if err != nil {
		return err
	}
	defer ep.Close()
	if p.Budget > 0 {
		for _, c := range conns {
			c.SetDeadline(time.Now().Add(p.Budget))
		}
	}
	sums, err := exchange(conns, p.Seed, newPool(p.Seed), fromChild, p.Msgs)
	if err != nil {
		return fmt.Errorf("exchange: %w", err)
	}
	ctl.emit(report{Summary: sums})
	<-ctl.quit // the test may still be reading: stay attached until it is done
	return nil
}
