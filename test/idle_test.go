//go:build integration

package test

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/ntb/shm"
)

const (
	idleConns   = 4
	idlePort    = 300
	idleWindow  = time.Second
	idleWindows = 3
	idleMaxCPU  = 2.0 // percent of one core, both processes together (DESIGN.md §4)
	pingMessage = "ping %d from the test"
	pongMessage = "pong %d from the child"
	// blockedRead is the frame of a Read waiting on a connection.
	blockedRead = "transport.(*Conn).Read"
)

// TestIdleCPU checks DESIGN.md's "a connected but idle pair uses < 2% CPU",
// in each core model: two processes joined by four connections, each with
// a Read blocked on every connection and nothing sent, use less than 2% of
// one core between them (user + system time, both processes) in the
// median of three one-second windows. Then one message each way on every
// connection shows that the blocked Reads still wake up.
//
// On the AMD VM (2026-11-25) a quiet machine read 0.6-1.1 % in every
// model (three runs). The worker models were held to 5 % for a while: a
// worker woke to look at its rings every 1.28 s, and the session's link
// wait every second, and each re-entered a blocking wait, which keeps the
// runtime's sysmon polling for 10 ms; they read 1.2-1.6 % quiet and
// 2.6-3.0 % under CI's load. (Their workers had looked every 10 ms and
// kept a pair at 21 % (CoreShared) and 44 % (CoreSplit) before that.)
func TestIdleCPU(t *testing.T) {
	for _, core := range []transport.CoreModel{transport.CoreInline, transport.CoreShared, transport.CoreSplit} {
		t.Run(core.String(), func(t *testing.T) { testIdleCPU(t, core) })
	}
}

func testIdleCPU(t *testing.T, core transport.CoreModel) {
	dir := fabricDir(t)
	ep := openEndCore(t, dir, shm.Side0, core)
	ch := startChild(t, "idle", childParams{Dir: dir, Side: shm.Side1, Listen: true, BasePort: idlePort, Conns: idleConns, Core: core})
	end, err := newLinkEnd(ep, false, idlePort, idleConns)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conns, err := end.connect(ctx, idleConns)
	require.NoError(t, err)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})

	type readResult struct {
		conn int
		got  string
		err  error
	}
	reads := make(chan readResult, idleConns)
	for i, c := range conns {
		go func() {
			b := make([]byte, len(fmt.Sprintf(pongMessage, i)))
			_, err := io.ReadFull(c, b)
			reads <- readResult{i, string(b), err}
		}()
	}
	require.True(t, ch.next(10*time.Second).Ready, "child ready")

	// Settle: every Read has spun out its budget and parked, here and in
	// the child (which said Ready once its own had). Collect the garbage
	// of earlier tests now, so the runtime does not do it inside the
	// window and bill the stack for it.
	if !awaitBlocked(blockedRead, idleConns) {
		t.Fatalf("the %d Reads did not all park within %v: %d blocked in %s", idleConns, waitfor.Timeout, blockedCount(blockedRead), blockedRead)
	}
	runtime.GC()
	childCPU := func() time.Duration {
		ch.command("cpu")
		return ch.next(10 * time.Second).CPU
	}
	// Three windows, judged by their median: on a shared machine a window
	// can catch a burst that is not the stack's (the runtime's scavenger,
	// a neighbour), while a stack that burns CPU idle does so in every one.
	var windows []float64
	for w := range idleWindows {
		child0 := childCPU()
		parent0, err := proc.CPUTime()
		require.NoError(t, err)
		start := time.Now()
		time.Sleep(idleWindow) // the window measured: the stack's CPU while nothing happens
		parent1, err := proc.CPUTime()
		require.NoError(t, err)
		elapsed := time.Since(start)
		child1 := childCPU()
		pct := func(d time.Duration) float64 { return 100 * d.Seconds() / elapsed.Seconds() }
		parent, child := parent1-parent0, child1-child0
		t.Logf("window %d: idle for %v with %d connections and a Read blocked on each, both ends: parent %v (%.2f%%), child %v (%.2f%%), pair %.2f%% of one core",
			w, elapsed.Round(time.Millisecond), idleConns, parent, pct(parent), child, pct(child), pct(parent+child))
		windows = append(windows, pct(parent+child))
	}
	select {
	case r := <-reads:
		t.Fatalf("read on connection %d returned while idle: %q, %v", r.conn, r.got, r.err)
	default:
	}
	slices.Sort(windows)
	median := windows[len(windows)/2]
	t.Logf("median of %d windows: %.2f%% of one core", len(windows), median)
	require.Less(t, median, idleMaxCPU, "CPU of the idle pair, percent of one core (median window)")

	// The parked Reads wake: one message each way on every connection.
	for i, c := range conns {
		_, err := c.Write([]byte(fmt.Sprintf(pingMessage, i)))
		require.NoError(t, err)
	}
	for range conns {
		select {
		case r := <-reads:
			require.NoError(t, r.err, "read on connection %d", r.conn)
			require.Equal(t, fmt.Sprintf(pongMessage, r.conn), r.got)
		case <-time.After(10 * time.Second):
			t.Fatal("no answer within 10s after idling")
		}
	}
	require.Equal(t, idleConns, ch.next(10*time.Second).Echoed)
	ch.finish(10 * time.Second)
}

// roleIdle is TestIdleCPU's child: a Read blocked on every connection, and
// when the test's message arrives, an answer. It reports its CPU time when
// asked.
func roleIdle(ctl *childCtl, p childParams) error {
	ep, conns, err := childConnect(ctl, p)
	if err != nil {
		return err
	}
	defer ep.Close()
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	echoed := make(chan error, len(conns))
	for i, c := range conns {
		go func() {
			want := fmt.Sprintf(pingMessage, i)
			b := make([]byte, len(want))
			if _, err := io.ReadFull(c, b); err != nil {
				echoed <- fmt.Errorf("connection %d: read: %w", i, err)
				return
			}
			if string(b) != want {
				echoed <- fmt.Errorf("connection %d: got %q, want %q", i, b, want)
				return
			}
			_, err := c.Write([]byte(fmt.Sprintf(pongMessage, i)))
			echoed <- err
		}()
	}
	if !awaitBlocked(blockedRead, len(conns)) {
		return fmt.Errorf("the %d Reads did not all park within %v: %d blocked in %s", len(conns), waitfor.Timeout, blockedCount(blockedRead), blockedRead)
	}
	ctl.emit(report{Ready: true})
	done := 0
	for {
		select {
		case cmd := <-ctl.cmds:
			if cmd != "cpu" {
				return fmt.Errorf("unknown command %q", cmd)
			}
			cpu, err := proc.CPUTime()
			if err != nil {
				return err
			}
			ctl.emit(report{CPU: cpu})
		case err := <-echoed:
			if err != nil {
				return err
			}
			if done++; done == len(conns) {
				ctl.emit(report{Echoed: done})
			}
		case <-ctl.quit:
			return nil
		}
	}
}
