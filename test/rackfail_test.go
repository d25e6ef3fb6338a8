//go:build integration

package test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/tools/rack"
	"github.com/ntstack/ntstack/socklike"
)

// roleProxyStream attaches to p.Proxy, dials p.Target and writes until it
// is killed.
func roleProxyStream(ctl *childCtl, p childParams) error {
	px, err := socklike.AttachProxy(p.Proxy, socklike.Config{})
	if err != nil {
		return err
	}
	var c net.Conn
	if p.Pool {
		c, err = (&socklike.Dialer{Proxy: px, Pool: true}).DialContext(context.Background(), "tcp", p.Target)
		if err == nil && c.(*socklike.Conn).Route().Mode != "pool" {
			return fmt.Errorf("dialed a %s connection, not a shared-pool one", c.(*socklike.Conn).Route().Mode)
		}
	} else {
		c, err = (&socklike.Dialer{Proxy: px}).Dial("tcp", p.Target)
	}
	if err != nil {
		return err
	}
	ctl.emit(report{Ready: true})
	buf := make([]byte, 64<<10)
	for {
		select {
		case <-ctl.quit:
			return nil
		default:
		}
		if _, err := c.Write(buf); err != nil {
			return err
		}
	}
}

// discard reads and drops every connection accepted on ln.
func discard(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			io.Copy(io.Discard, c)
		}()
	}
}

// TestRackKill: an application killed mid-stream is reclaimed by ntproxy
// (its connections and memory, on both hosts), in proxy and in shared-pool
// mode; a killed ntproxy fails its applications' calls within a second,
// and once restarted they attach again, dial and accept as before.
func TestRackKill(t *testing.T) {
	r := startRack(t, rack.Spec{Hosts: []string{"a", "b"}})
	a, b := r.Host("a"), r.Host("b")
	srv := attachTo(t, b)
	ln, err := (&socklike.ListenConfig{Proxy: srv}).Listen(context.Background(), "tcp", ":7001")
	require.NoError(t, err)
	defer ln.Close()
	go discard(ln)
	lnPool, err := (&socklike.ListenConfig{Proxy: srv, Pool: true}).Listen(context.Background(), "tcp", ":7004")
	require.NoError(t, err)
	defer lnPool.Close()
	go discard(lnPool)

	base := func(h *rack.Host) (apps, conns int, mem int64) {
		s := snapshot(t, h)
		for _, app := range s.Apps {
			mem += app.Memory
		}
		return len(s.Apps), len(s.Conns), mem
	}
	appsA, connsA, memA := base(a)
	_, connsB, _ := base(b)

	var killed time.Time
	for _, mode := range []struct {
		name   string
		target string
		pool   bool
	}{{"proxy", "b:7001", false}, {"shared-pool", "b:7004", true}} {
		child := startChild(t, "proxystream", childParams{Proxy: a.Config.Path(config.ProxySocket), Target: mode.target, Pool: mode.pool})
		require.True(t, child.next(20*time.Second).Ready, mode.name)
		require.Eventually(t, func() bool {
			s := snapshot(t, a)
			return len(s.Conns) == connsA+1 && s.Conns[len(s.Conns)-1].BytesTX > 1<<20
		}, 10*time.Second, 10*time.Millisecond, "the child's %s stream never got going", mode.name)
		apps, _, mem := base(a)
		require.Equal(t, appsA+1, apps)
		require.Greater(t, mem, memA)

		killed = time.Now()
		require.NoError(t, child.cmd.Process.Kill())
		require.Eventually(t, func() bool {
			apps, conns, mem := base(a)
			_, connsb, _ := base(b)
			return apps == appsA && conns == connsA && mem == memA && connsb == connsB
		}, 5*time.Second, 5*time.Millisecond, "ntproxy did not reclaim the killed %s application", mode.name)
		t.Logf("killed %s application reclaimed on both hosts within %v", mode.name, time.Since(killed).Round(time.Millisecond))
	}

	// An application of a's, with a read blocked on a connection to b and
	// a listener of its own.
	app := attachTo(t, a)
	echo, err := (&socklike.ListenConfig{Proxy: srv}).Listen(context.Background(), "tcp", ":7002")
	require.NoError(t, err)
	defer echo.Close()
	go serveEcho(echo)
	c, err := (&socklike.Dialer{Proxy: app}).Dial("tcp", "b:7002")
	require.NoError(t, err)
	lnA, err := (&socklike.ListenConfig{Proxy: app}).Listen(context.Background(), "tcp", ":7003")
	require.NoError(t, err)
	defer lnA.Close()
	go serveEcho(lnA)
	echoPool, err := (&socklike.ListenConfig{Proxy: srv, Pool: true}).Listen(context.Background(), "tcp", ":7005")
	require.NoError(t, err)
	defer echoPool.Close()
	go serveEcho(echoPool)
	pc, err := (&socklike.Dialer{Proxy: app, Pool: true}).DialContext(context.Background(), "tcp", "b:7005")
	require.NoError(t, err)
	require.Equal(t, "pool", pc.(*socklike.Conn).Route().Mode)
	readErr := make(chan error, 2)
	for _, c := range []net.Conn{c, pc} {
		go func() {
			_, err := c.Read(make([]byte, 1))
			readErr <- err
		}()
	}

	require.NoError(t, r.Kill("a", "ntproxy"))
	killed = time.Now()
	for range 2 {
		select {
		case err := <-readErr:
			require.Error(t, err)
			require.True(t, errors.Is(err, socklike.ErrProxyGone), "%v", err)
			t.Logf("blocked read failed %v after kill -9 of ntproxy: %v", time.Since(killed).Round(time.Microsecond), err)
		case <-time.After(time.Second):
			t.Fatal("a read blocked through a killed ntproxy did not fail within 1s")
		}
	}
	_, err = (&socklike.Dialer{Proxy: app}).Dial("tcp", "b:7002")
	require.Error(t, err, "no ntproxy, no dial")
	require.Less(t, time.Since(killed), 2*time.Second)

	require.NoError(t, r.Restart("a", "ntproxy"))
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := (&socklike.Dialer{Proxy: app}).DialContext(ctx, "tcp", "b:7002")
		if err != nil {
			t.Logf("dial after restart: %v", err)
			return false
		}
		defer c.Close()
		return echoCheck(c, 1, 100_000) == nil
	}, 10*time.Second, 50*time.Millisecond, "the application did not dial again after ntproxy restarted")
	require.Eventually(t, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		c, err := (&socklike.Dialer{Proxy: srv}).DialContext(ctx, "tcp", "a:7003")
		if err != nil {
			t.Logf("dial the restarted listener: %v", err)
			return false
		}
		defer c.Close()
		return echoCheck(c, 2, 100_000) == nil
	}, 10*time.Second, 50*time.Millisecond, "the application's listener did not come back after ntproxy restarted")
}
