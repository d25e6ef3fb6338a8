//go:build integration

package test

import (
	"context"
	"crypto/sha256"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/tools/rack"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/socklike"
)

// TestRackFailover streams 1 GiB from an application on host a to one on
// host b through their proxies while the NTB link between the hosts is
// pulled and, later, restored. The stream moves to TCP and back to the
// link; the receiver checks the SHA-256 of every byte and measures the
// longest pause it saw.
func TestRackFailover(t *testing.T) {
	r := startRack(t, rack.Spec{Hosts: []string{"a", "b"}})
	a := r.Host("a")
	link := a.Config.Peers[0].Link
	srv := attachTo(t, r.Host("b"))
	ln, err := (&socklike.ListenConfig{Proxy: srv}).Listen(context.Background(), "tcp", ":7100")
	require.NoError(t, err)
	defer ln.Close()

	type result struct {
		n        int64
		sum      []byte
		maxPause time.Duration
		err      error
	}
	got := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- result{err: err}
			return
		}
		defer c.Close()
		h := sha256.New()
		buf := make([]byte, 256<<10)
		var res result
		last := time.Now()
		for {
			k, err := c.Read(buf)
			now := time.Now()
			if k > 0 {
				res.maxPause = max(res.maxPause, now.Sub(last))
				last = now
				h.Write(buf[:k])
				res.n += int64(k)
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				res.err = err
				break
			}
		}
		res.sum = h.Sum(nil)
		got <- res
	}()

	const total = 1 << 30
	cli := attachTo(t, a)
	c, err := (&socklike.Dialer{Proxy: cli}).Dial("tcp", "b:7100")
	require.NoError(t, err)
	admin := ctlapi.NewClient(a.Config.Path(config.AdminSocket))
	defer admin.Close()
	fault := func(down bool) {
		require.NoError(t, admin.Call(context.Background(), ctlapi.PathFault, ctlapi.FaultRequest{Link: link, Down: down}, nil))
	}
	sum := sha256.New()
	rng := rand.NewChaCha8([32]byte{1})
	buf := make([]byte, 256<<10)
	start := time.Now()
	var downAt, upAt time.Time
	for n := 0; n < total; n += len(buf) {
		rng.Read(buf)
		sum.Write(buf)
		_, err := c.Write(buf)
		require.NoError(t, err, "write at %d MiB", n>>20)
		switch {
		case n == total/4:
			downAt = time.Now()
			fault(true)
			t.Logf("link %s pulled at %d MiB, %v in", link, n>>20, time.Since(start).Round(time.Millisecond))
		case n == total/2:
			upAt = time.Now()
			fault(false)
			t.Logf("link %s restored at %d MiB, %v in", link, n>>20, time.Since(start).Round(time.Millisecond))
		}
	}
	require.NoError(t, c.(interface{ CloseWrite() error }).CloseWrite())
	var res result
	select {
	case res = <-got:
	case <-time.After(2 * time.Minute):
		t.Fatal("the receiver did not finish")
	}
	elapsed := time.Since(start)
	require.NoError(t, res.err)
	require.Equal(t, int64(total), res.n)
	require.Equal(t, sum.Sum(nil), res.sum, "1 GiB byte-exact across the failover and back")
	t.Logf("1 GiB in %v (%.0f MB/s), longest pause seen by the receiver %v (link pulled %v after start, restored %v later)",
		elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds()/1e6, res.maxPause.Round(time.Microsecond),
		downAt.Sub(start).Round(time.Millisecond), upAt.Sub(downAt).Round(time.Millisecond))
	require.Less(t, res.maxPause, time.Second, "the application sees at most a pause")

	// The proxies' logs record each switch and its pause.
	var moves []string
	for _, h := range []string{"a", "b"} {
		b, err := os.ReadFile(r.Host(h).LogPath("ntproxy"))
		require.NoError(t, err)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, "moved from") {
				moves = append(moves, h+": "+line[strings.Index(line, "leg "):])
			}
		}
	}
	t.Logf("switches:\n%s", strings.Join(moves, "\n"))
	joined := strings.Join(moves, "\n")
	require.Contains(t, joined, "moved from ntb to tcp")
	require.Contains(t, joined, "moved from tcp to ntb")
	// And a's metrics count them: at least one move there and back.
	require.Regexp(t, `ntstack_proxy_path_switches_total\{host="a"\} [2-9]`, scrape(t, r, "a"))
}
