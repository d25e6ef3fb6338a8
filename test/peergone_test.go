//go:build integration

package test

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/socklike"
)

const (
	gonePort = 500
	// goneMaxWait is issue 41's requirement: blocked calls fail within a
	// second of kill -9 of the peer.
	goneMaxWait = time.Second
)

// blockedCall is how a Read or Write blocked on a connection ended.
type blockedCall struct {
	what string
	err  error
	took time.Duration // from the peer's end to the call's return
}

// TestPeerCrashVsClose holds a Read (waiting for data) and a Write
// (waiting for credit) blocked on embedded connections to a child, and
// ends the child: by kill -9, then, in a fresh pair, by an orderly
// Endpoint.Close in a child that stays alive. After the crash both calls
// fail within a second with errors satisfying errors.Is(err,
// syscall.ECONNRESET), as TCP's do after a peer's crash; after the
// orderly close they fail with different messages, so that a reader of
// the log can tell a crash from a close.
func TestPeerCrashVsClose(t *testing.T) {
	crash := peerGone(t, "kill")
	for _, c := range crash {
		t.Logf("after kill -9 of the peer, %s failed in %v: %v", c.what, c.took.Round(time.Microsecond), c.err)
		// assert, not require: the orderly close below is checked even so.
		assert.ErrorIs(t, c.err, syscall.ECONNRESET, "%s after kill -9 of the peer: issue 41 wants an error matching syscall.ECONNRESET", c.what)
		assert.Less(t, c.took, goneMaxWait, "%s after kill -9 of the peer: issue 41 requires a blocked call to fail within 1 s", c.what)
	}
	closed := peerGone(t, "close")
	for i, c := range closed {
		t.Logf("after the peer's orderly Endpoint.Close, %s failed in %v: %v", c.what, c.took.Round(time.Microsecond), c.err)
		assert.NotEqual(t, crash[i].err.Error(), c.err.Error(),
			"%s: the peer's orderly Endpoint.Close and its crash give the same message, %q (issue 41: an orderly close is distinguishable from a crash, in the message too)", c.what, c.err)
	}
}

// peerGone connects to a child holding two connections open (reading and
// writing nothing), blocks a Read on the first and a Write on the second,
// ends the child as how says ("kill": SIGKILL; "close": it closes its
// Endpoint and stays alive) and returns how the two calls ended.
func peerGone(t *testing.T, how string) []blockedCall {
	dir := fabricDir(t)
	peer := startChild(t, "hold", childParams{Dir: dir, Side: shm.Side1, Listen: true, BasePort: gonePort, Conns: 2})
	ep, _ := openSocklike(t, dir, shm.Side0)
	require.True(t, peer.next(30*time.Second).Ready, "the peer child listens")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	d := &socklike.Dialer{Endpoint: ep}
	var conns []net.Conn
	for i := range 2 {
		c, err := d.DialContext(ctx, "tcp", fmt.Sprintf("peer:%d", gonePort+i))
		require.NoError(t, err, "dial connection %d", i)
		t.Cleanup(func() { c.Close() })
		conns = append(conns, c)
	}
	require.True(t, peer.next(30*time.Second).Ready, "the peer accepted both connections")

	type ended struct {
		err error
		at  time.Time
	}
	readDone, writeDone := make(chan ended, 1), make(chan ended, 1)
	go func() {
		_, err := conns[0].Read(make([]byte, 1))
		readDone <- ended{err, time.Now()}
	}()
	go func() {
		buf := make([]byte, 1<<20)
		for { // the peer reads nothing: the writer runs out of credit
			if _, err := conns[1].Write(buf); err != nil {
				writeDone <- ended{err, time.Now()}
				return
			}
		}
	}()
	waitfor.Blocked(t, "socklike.(*Conn).Read")
	waitfor.Blocked(t, "socklike.(*Conn).Write")

	var at time.Time
	switch how {
	case "kill":
		at = time.Now()
		require.NoError(t, peer.cmd.Process.Signal(syscall.SIGKILL))
	case "close":
		at = time.Now()
		peer.command("close")
	}
	var calls []blockedCall
	for _, w := range []struct {
		what string
		ch   chan ended
	}{{"a blocked Read", readDone}, {"a blocked Write", writeDone}} {
		select {
		case e := <-w.ch:
			require.Error(t, e.err, "%s returned without an error after the peer's %s", w.what, how)
			calls = append(calls, blockedCall{w.what, e.err, e.at.Sub(at)})
		case <-time.After(30 * time.Second):
			t.Fatalf("%s still blocked 30 s after the peer's %s", w.what, how)
		}
	}
	if how == "close" {
		require.True(t, peer.next(30*time.Second).Ready, "the peer closed its endpoint and is still running")
		peer.finish(10 * time.Second)
	}
	return calls
}

// roleHold accepts p.Conns connections on an embedded endpoint and holds
// them, reading and writing nothing. On the command "close" it closes its
// Endpoint in order, says so and stays alive until the test lets it go.
func roleHold(ctl *childCtl, p childParams) error {
	ep, err := socklike.Open(linkName, socklike.Config{Fabric: shm.Options{Dir: p.Dir, Side: p.Side}, Logf: ctl.logf})
	if err != nil {
		return err
	}
	defer ep.Close() // a second Close is harmless
	lc := &socklike.ListenConfig{Endpoint: ep}
	var lns []net.Listener
	for i := range p.Conns {
		ln, err := lc.Listen(context.Background(), "tcp", fmt.Sprintf(":%d", p.BasePort+i))
		if err != nil {
			return err
		}
		defer ln.Close()
		lns = append(lns, ln)
	}
	ctl.emit(report{Ready: true})
	for i, ln := range lns {
		c, err := ln.Accept()
		if err != nil {
			return fmt.Errorf("accept connection %d: %w", i, err)
		}
		defer c.Close()
	}
	ctl.emit(report{Ready: true})
	for {
		select {
		case <-ctl.quit:
			return nil
		case cmd := <-ctl.cmds:
			if cmd != "close" {
				return fmt.Errorf("unknown command %q", cmd)
			}
			if err := ep.Close(); err != nil {
				return fmt.Errorf("orderly Endpoint.Close: %w", err)
			}
			ctl.emit(report{Ready: true})
		}
	}
}
