//go:build integration

package test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/tools/rack"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/socklike"
)

// moveLog collects log lines and lets a test wait for one.
type moveLog struct {
	mu      sync.Mutex
	lines   []string
	changed chan struct{} // closed and replaced by each line
}

func newMoveLog() *moveLog { return &moveLog{changed: make(chan struct{})} }

func (l *moveLog) add(line string) {
	l.mu.Lock()
	l.lines = append(l.lines, line)
	close(l.changed)
	l.changed = make(chan struct{})
	l.mu.Unlock()
}

// wait waits until a line containing every one of want is logged (or was),
// within waitfor.Timeout, and returns it.
func (l *moveLog) wait(want ...string) (string, bool) {
	deadline := time.NewTimer(waitfor.Timeout)
	defer deadline.Stop()
	for seen := 0; ; {
		l.mu.Lock()
		lines, ch := l.lines, l.changed
		l.mu.Unlock()
		for ; seen < len(lines); seen++ {
			if containsAll(lines[seen], want) {
				return lines[seen], true
			}
		}
		select {
		case <-ch:
		case <-deadline.C:
			return "", false
		}
	}
}

func containsAll(s string, want []string) bool {
	for _, w := range want {
		if !strings.Contains(s, w) {
			return false
		}
	}
	return true
}

// TestRackDirectLinkDown streams 1 GiB over a direct-mode connection
// between applications on hosts a and b and pulls the NTB link between
// the hosts for 2 s a quarter of the way in: a direct link is a slice of
// that window, so the pull takes it down too. The connection moves to the
// fallback path through the proxies and back to its direct link: each
// move is seen as it happens, in the application's log and in Route, and
// the fallback in ntproxy's status; the receiver's SHA-256 matches, byte
// for byte, on the same net.Conn.
func TestRackDirectLinkDown(t *testing.T) {
	r := startRack(t, rack.Spec{Hosts: []string{"a", "b"}})
	a, b := r.Host("a"), r.Host("b")
	link := a.Config.Peers[0].Link
	appLog := newMoveLog()
	attach := func(h *rack.Host) *socklike.Proxy {
		p, err := socklike.AttachProxy(h.Config.Path(config.ProxySocket), socklike.Config{Logf: func(format string, args ...any) {
			line := h.Name + ": " + fmt.Sprintf(format, args...)
			t.Log("application on " + line)
			appLog.add(line)
		}})
		require.NoError(t, err)
		t.Cleanup(func() { p.Close() })
		return p
	}
	srv := attach(b)
	ln, err := (&socklike.ListenConfig{Proxy: srv}).Listen(context.Background(), "tcp", ":7400")
	require.NoError(t, err)
	defer ln.Close()
	got := make(chan sinkStats, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- sinkStats{err: err, h: sha256.New()}
			return
		}
		defer c.Close()
		got <- drain(c)
	}()

	cli := attach(a)
	nc, err := (&socklike.Dialer{Proxy: cli, Direct: true}).Dial("tcp", "b:7400")
	require.NoError(t, err)
	defer nc.Close()
	c := nc.(*socklike.Conn)
	// A first direct dial returns on the proxied path and moves onto its
	// link once that is up.
	waitfor.True(t, "the connection on its direct link", func() bool { return !strings.HasPrefix(c.Route().Reason, "on the proxied path until") })
	first := c.Route()
	require.Equal(t, "direct", first.Mode, "the connection is in direct mode before the fault: %+v", first)

	admin := ctlapi.NewClient(a.Config.Path(config.AdminSocket))
	defer admin.Close()
	fault := func(down bool) error {
		return admin.Call(context.Background(), ctlapi.PathFault, ctlapi.FaultRequest{Link: link, Down: down}, nil)
	}

	// The moves, as they happen: the log line each move writes once it
	// has taken place, and the Route and ntproxy status right then.
	type seen struct {
		line  string
		route socklike.Route
		at    time.Time
		ok    bool
	}
	var toFallback, toDirect seen
	var fallbackConns []ctlapi.ConnStat
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		if toFallback.line, toFallback.ok = appLog.wait("a: direct link", "moved to the fallback"); !toFallback.ok {
			return
		}
		toFallback.route, toFallback.at = c.Route(), time.Now()
		var snap ctlapi.Snapshot
		if admin.Call(context.Background(), ctlapi.PathSnapshot, nil, &snap) == nil {
			fallbackConns = snap.Conns
		}
		toDirect.line, toDirect.ok = appLog.wait("a: direct link", "moved back")
		toDirect.route, toDirect.at = c.Route(), time.Now()
	}()

	var downAt, upAt time.Time
	restored := make(chan error, 1)
	res := streamAcross(t, c, func() {
		downAt = time.Now()
		require.NoError(t, fault(true), "pull link %s", link)
		t.Logf("NTB link %s pulled for %v", link, linkDownHold)
	}, func() {
		// Holding the link down for linkDownHold is the fault under test,
		// not a wait for an event.
		time.AfterFunc(linkDownHold, func() {
			upAt = time.Now()
			restored <- fault(false)
		})
	})
	require.NoError(t, res.writeErr, "writing 1 GiB on the same direct-mode connection across the NTB link pulled for 2 s (issue 41: it moves to the fallback and back)")
	require.NoError(t, <-restored, "restore link %s", link)
	// Back on the direct link before the end of the stream, so that the
	// end goes over it.
	<-watched
	require.True(t, toFallback.ok, "no log line says the direct connection moved to the fallback while link %s was down", link)
	require.Equal(t, "proxy", toFallback.route.Mode, "Route once the connection moved to the fallback: %+v", toFallback.route)
	require.Contains(t, toFallback.route.Reason, "direct link", "Route's reason on the fallback names the direct link: %+v", toFallback.route)
	carried := false
	for _, cs := range fallbackConns {
		carried = carried || (cs.Mode == "proxy" && strings.Contains(cs.Reason, "through the proxies while it is"))
	}
	require.True(t, carried, "ntproxy on a shows no proxied connection carrying the direct one while the link is down: %+v", fallbackConns)
	require.True(t, toDirect.ok, "no log line says the connection moved back to its direct link after link %s came back", link)
	require.Equal(t, first, toDirect.route, "Route once the connection moved back to its direct link")
	require.NoError(t, c.CloseWrite())
	var s sinkStats
	select {
	case s = <-got:
	case <-time.After(2 * time.Minute):
		t.Fatal("the receiver did not reach the end of the 1 GiB stream within 2 minutes of the last write")
	}
	require.NoError(t, s.err, "the receiver's stream ended in an error, not io.EOF (issue 41: a direct connection survives a link pull)")
	require.Equal(t, int64(linkDownTotal), s.n, "bytes received over the direct connection across the link pull")
	require.Equal(t, res.sum, hex.EncodeToString(s.h.Sum(nil)), "SHA-256 of the 1 GiB received across the link pull (lost, duplicated or reordered bytes)")
	require.Equal(t, first, c.Route(), "the connection ends on its direct link")

	t.Logf("moves:\n%s (route %s/%s: %s)\n%s (route %s/%s)", toFallback.line, toFallback.route.Mode, toFallback.route.Path, toFallback.route.Reason,
		toDirect.line, toDirect.route.Mode, toDirect.route.Path)
	for _, h := range []*rack.Host{a, b} {
		bs, err := os.ReadFile(h.LogPath("ntproxy"))
		require.NoError(t, err)
		for _, line := range strings.Split(string(bs), "\n") {
			if strings.Contains(line, "direct link") {
				t.Logf("%s ntproxy: %s", h.Name, line)
			}
		}
	}
	t.Logf("on the fallback %v after the pull, back on the direct link %v after the link came back",
		toFallback.at.Sub(downAt).Round(time.Millisecond), toDirect.at.Sub(upAt).Round(time.Millisecond))
	t.Logf("1 GiB byte-exact in %v over a direct connection across the link pulled %v in for %v; the receiver's longest wait for data %v",
		res.elapsed.Round(time.Millisecond), downAt.Sub(res.start).Round(time.Millisecond), upAt.Sub(downAt).Round(time.Millisecond), s.pause.Round(time.Millisecond))
}
