package transport

import (
	"bytes"
	"context"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/ntb"
)

// A peer whose process is gone is replaced by a fresh endpoint on the same
// device pair (TestKillPeer's new process): the survivor's connections
// fail with ECONNRESET and are closed, and new dials work both ways, each
// acceptor writing as soon as Accept returns. acceptOffered holds the
// accepting poller until that first Write has returned, so the Write
// meets the connection just handed out: its bytes must still follow the
// ACCEPT, or the dialer fails the session ("before it was accepted").
func TestPeerReplacedNewDials(t *testing.T) {
	da, db := livePair(t)
	cfg := Config{Logf: t.Logf}
	a, err := Attach(da, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { a.Close() })
	b, err := Attach(db, cfg)
	require.NoError(t, err)
	c1, c2 := connPair(t, a, b, 700)
	re, we := blocked(t, c1, c2)

	// b's process dies: a sees its link go down, the peer gone.
	da.cause.Store(int32(ntb.CauseGone))
	da.SetLink(ntb.LinkDown, "peer process gone")
	for _, e := range []struct {
		ch   <-chan error
		what string
	}{{re, "read"}, {we, "write"}} {
		require.ErrorIs(t, waitErr(t, e.ch, e.what), syscall.ECONNRESET, e.what)
	}
	require.NoError(t, c1.Close())
	b.Close()

	// A new process attaches the freed end.
	b2, err := Attach(db, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { b2.Close() })
	const aListens, b2Listens = 711, 710
	wrote := map[int]chan struct{}{aListens: make(chan struct{}, 1), b2Listens: make(chan struct{}, 1)}
	hook := func(c *Conn) {
		if ch := wrote[c.local.Port]; ch != nil {
			select {
			case <-ch:
			case <-time.After(10 * time.Second): // the Write waits for this poller: the dial tells
			}
		}
	}
	acceptOffered.Store(&hook)
	t.Cleanup(func() { acceptOffered.Store(nil) })
	da.SetLink(ntb.LinkUp, "new process attached")

	for _, d := range []struct {
		name             string
		dialer, listener *Endpoint
		port             int
	}{{"to the new process", a, b2, b2Listens}, {"from the new process", b2, a, aListens}} {
		ln, err := d.listener.Listen(d.port)
		require.NoError(t, err, d.name)
		hello, reply := []byte("hello "+d.name), []byte("reply "+d.name)
		accepted := make(chan error, 1)
		go func() {
			c, err := ln.AcceptConn()
			if err != nil {
				accepted <- err
				return
			}
			defer c.Close()
			_, err = c.Write(hello)
			wrote[d.port] <- struct{}{}
			if err == nil {
				got := make([]byte, len(reply))
				_, err = io.ReadFull(c, got)
				if err == nil && !bytes.Equal(got, reply) {
					err = io.ErrUnexpectedEOF
				}
			}
			accepted <- err
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c, err := d.dialer.DialContext(ctx, d.port)
		cancel()
		require.NoError(t, err, "dial %s", d.name)
		got := make([]byte, len(hello))
		require.NoError(t, c.SetDeadline(time.Now().Add(30*time.Second)))
		_, err = io.ReadFull(c, got)
		require.NoError(t, err, "read %s", d.name)
		require.Equal(t, hello, got, d.name)
		_, err = c.Write(reply)
		require.NoError(t, err, "write %s", d.name)
		select {
		case err := <-accepted:
			require.NoError(t, err, "acceptor %s", d.name)
		case <-time.After(30 * time.Second):
			t.Fatalf("acceptor %s did not finish", d.name)
		}
		require.NoError(t, c.Close())
		require.NoError(t, ln.Close())
	}
}
