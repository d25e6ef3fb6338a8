//go:build integration

package test

import (
	"context"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/tools/rack"
	"github.com/ntstack/ntstack/socklike"
)

// starvedHold is how long TestRackDirectDialStarvedProxy keeps the far
// ntproxy stopped: past the rack link's heartbeat timeout (500 ms) and the
// grace a direct dial gives a link that is down (500 ms), well short of
// the user timeout (10 s).
const starvedHold = 2 * time.Second

// TestRackDirectDialStarvedProxy stops the far host's ntproxy (SIGSTOP),
// as a CPU hog can starve it, waits until the near ntproxy finds the rack
// link silent, and dials a direct connection while the far one is still
// stopped. Issue 41: a live peer merely starved of CPU never costs a
// connection; a missed heartbeat makes the link suspect and only silence
// past the user timeout fails it. So the dial waits and completes once
// the far ntproxy runs again, in direct mode, and the rack link never
// goes down.
func TestRackDirectDialStarvedProxy(t *testing.T) {
	r := startRack(t, rack.Spec{Hosts: []string{"a", "b"}})
	a, b := r.Host("a"), r.Host("b")
	link := a.Config.Peers[0].Link
	attach := func(h *rack.Host) *socklike.Proxy {
		p, err := socklike.AttachProxy(h.Config.Path(config.ProxySocket), socklike.Config{})
		require.NoError(t, err)
		t.Cleanup(func() { p.Close() })
		return p
	}
	srv := attach(b)
	ln, err := (&socklike.ListenConfig{Proxy: srv}).Listen(context.Background(), "tcp", ":7410")
	require.NoError(t, err)
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				var buf [64]byte
				for {
					n, err := c.Read(buf[:])
					if err != nil {
						return
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}(c)
		}
	}()
	cli := attach(a)
	// No idle direct link to reuse: every dial asks both ntproxys.
	dial := func() (net.Conn, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		return (&socklike.Dialer{Proxy: cli, Direct: true}).DialContext(ctx, "tcp", "b:7410")
	}
	echoOnce := func(c net.Conn, msg string) {
		t.Helper()
		_, err := c.Write([]byte(msg))
		require.NoError(t, err)
		got := make([]byte, len(msg))
		_, err = c.Read(got)
		require.NoError(t, err)
		require.Equal(t, msg, string(got))
	}
	first, err := dial()
	require.NoError(t, err, "direct dial before the stop")
	echoOnce(first, "before")

	logA := func() string {
		bs, err := os.ReadFile(a.LogPath("ntproxy"))
		require.NoError(t, err)
		return string(bs)
	}
	// What a's ntproxy logs when the link's peer falls silent: a
	// suspicion, or (what must not happen) the link going down.
	silent := func(log string) bool {
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, "link "+link+":") && (strings.Contains(line, "suspect") || strings.Contains(line, "heartbeat silent")) {
				return true
			}
		}
		return false
	}
	before := len(logA())
	pid := r.Pid("b", "ntproxy")
	require.NotZero(t, pid)
	require.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	stoppedAt := time.Now()
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			require.NoError(t, syscall.Kill(pid, syscall.SIGCONT))
		}
	}
	defer resume()
	waitfor.True(t, "a's ntproxy finds link "+link+" silent", func() bool { return silent(logA()[before:]) })
	noticed := time.Since(stoppedAt)

	type result struct {
		c   net.Conn
		err error
		at  time.Time
	}
	done := make(chan result, 1)
	go func() {
		c, err := dial()
		done <- result{c, err, time.Now()}
	}()
	// Holding b's ntproxy stopped for starvedHold is the fault under
	// test, not a wait for an event.
	var res result
	select {
	case res = <-done:
	case <-time.After(starvedHold - time.Since(stoppedAt)):
	}
	resume()
	resumedAt := time.Now()
	if res.c == nil && res.err == nil {
		res = <-done
	}
	require.NoError(t, res.err, "direct dial while the far ntproxy was stopped for %v (the near one noticed after %v)", starvedHold, noticed)
	defer res.c.Close()
	require.False(t, res.at.Before(resumedAt), "the dial completed while the far ntproxy was stopped")
	route := res.c.(*socklike.Conn).Route()
	require.Equal(t, "direct", route.Mode, "route of the dial: %+v", route)
	echoOnce(res.c, "after")
	echoOnce(first, "first, after")

	log := logA()[before:]
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "link "+link+":") {
			t.Logf("a ntproxy: %s", line)
		}
	}
	require.NotContains(t, log, "link down (peer heartbeat silent", "the rack link went down while its peer was only stopped")
	t.Logf("a noticed the silence %v after the stop; dial done %v after the resume, %v after the stop", noticed, res.at.Sub(resumedAt), res.at.Sub(stoppedAt))
}
