package transport

import (
	"context"
	"errors"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/ntbtest"
	"github.com/ntstack/ntstack/ntb/shm"
)

// streamBytes fills b with the stream bytes from offset off.
func streamBytes(b []byte, off int64) {
	for i := range b {
		o := off + int64(i)
		b[i] = byte(o ^ o>>8 ^ o>>17)
	}
}

// A connection detached while its link is down hands over exactly what
// its stream needs: the reader gets every byte counted received and then
// ErrMoved; the writer's Write reports every byte counted sent; the
// retained bytes from the peer's received count up to the sent count are
// the stream's bytes there. The endpoints carry new connections once the
// link is back, and the detached pair never resumes.
func TestDetachHandsOver(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		da, db := backends[backend](t)
		a, b := attachPair(t, da, db, Config{})
		c1, c2 := connPair(t, a, b, 300)
		defer c1.Close()
		defer c2.Close()
		_, err := c1.Detach()
		require.ErrorIs(t, err, errNotPaused, "a live connection does not detach")

		var wrote atomic.Int64
		wrErr := make(chan error, 1)
		go func() {
			buf := make([]byte, 48<<10)
			for {
				streamBytes(buf, wrote.Load())
				n, err := c1.Write(buf)
				wrote.Add(int64(n))
				if err != nil {
					wrErr <- err
					return
				}
			}
		}()
		var read atomic.Int64
		rdErr := make(chan error, 1)
		go func() {
			buf, want := make([]byte, 40<<10), make([]byte, 40<<10)
			for {
				n, err := c2.Read(buf)
				streamBytes(want[:n], read.Load())
				if string(buf[:n]) != string(want[:n]) {
					rdErr <- errors.New("bytes read are not the stream's")
					return
				}
				read.Add(int64(n))
				if err != nil {
					rdErr <- err
					return
				}
			}
		}()
		require.Eventually(t, func() bool { return read.Load() > 2<<20 }, 30*time.Second, time.Millisecond, "the stream flows")
		down, up := func() { da.(*ntbtest.Device).SetLink(ntb.LinkDown, "test pull") }, func() { da.(*ntbtest.Device).SetLink(ntb.LinkUp, "test") }
		if backend == "shm" {
			down, up = da.(*shm.Device).ForceLinkDown, da.(*shm.Device).ForceLinkUp
		}
		down()
		require.NoError(t, c1.AwaitPause(context.Background()), "the dialer pauses")
		require.NoError(t, c2.AwaitPause(context.Background()), "the acceptor pauses")
		h1, err := c1.Detach()
		require.NoError(t, err)
		h2, err := c2.Detach()
		require.NoError(t, err)

		require.ErrorIs(t, <-wrErr, ErrMoved, "the blocked Write fails as moved")
		require.Equal(t, h1.Sent, wrote.Load(), "Write reported the bytes the handover counts sent")
		require.ErrorIs(t, <-rdErr, ErrMoved, "Read fails as moved once the bytes received are read")
		require.Equal(t, h2.Received, read.Load(), "Read returned every byte the handover counts received")
		rest, err := h1.From(h2.Received)
		require.NoError(t, err)
		want := make([]byte, len(rest))
		streamBytes(want, h2.Received)
		require.Equal(t, want, rest, "the retained bytes from the peer's received count")
		require.Equal(t, h1.Sent, h2.Received+int64(len(rest)))
		_, err = h1.From(h1.Sent + 1)
		require.Error(t, err, "a received count past what was sent")
		_, err = c1.Detach()
		require.ErrorIs(t, err, errNotPaused, "a detached connection does not detach again")

		up()
		c3, c4 := connPair(t, a, b, 301)
		defer c3.Close()
		defer c4.Close()
		_, err = c3.Write([]byte("after"))
		require.NoError(t, err)
		buf := make([]byte, 5)
		_, err = c4.Read(buf)
		require.NoError(t, err)
		require.Equal(t, "after", string(buf))
		_, err = c1.Write([]byte("x"))
		require.ErrorIs(t, err, ErrMoved, "the detached connection stays off the link")
		require.Zero(t, a.Stats().Resumptions+b.Stats().Resumptions, "nothing resumed the detached connections")
	})
}

// AwaitPause returns once its connection's link is down and its session
// has ended, when Detach takes it at once; it fails for a connection that
// ends first (its peer closes it, it is closed) or with its context.
func TestAwaitPause(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		da, db := backends[backend](t)
		a, b := attachPair(t, da, db, Config{})
		down, up := func() { da.(*ntbtest.Device).SetLink(ntb.LinkDown, "test pull") }, func() { da.(*ntbtest.Device).SetLink(ntb.LinkUp, "test") }
		if backend == "shm" {
			down, up = da.(*shm.Device).ForceLinkDown, da.(*shm.Device).ForceLinkUp
		}
		await := func(c *Conn, ctx context.Context) <-chan error {
			got := make(chan error, 1)
			go func() { got <- c.AwaitPause(ctx) }()
			waitfor.Blocked(t, "AwaitPause")
			return got
		}

		ctx, cancel := context.WithCancel(context.Background())
		c1, c2 := connPair(t, a, b, 310)
		got := await(c1, ctx)
		cancel()
		require.ErrorIs(t, <-got, context.Canceled, "a live connection waits until its context ends")

		got, got2 := await(c1, context.Background()), make(chan error, 1)
		go func() { got2 <- c2.AwaitPause(context.Background()) }()
		down()
		require.NoError(t, <-got, "the dialer's wait ends with its session")
		require.NoError(t, <-got2, "the acceptor's wait ends with its session")
		_, err := c1.Detach()
		require.NoError(t, err, "a connection AwaitPause returned for detaches")
		_, err = c2.Detach()
		require.NoError(t, err)
		require.ErrorIs(t, c1.AwaitPause(context.Background()), errEnded, "a detached connection is not paused")
		c1.Close()
		c2.Close()

		up()
		c3, c4 := connPair(t, a, b, 311)
		got = await(c3, context.Background())
		require.NoError(t, c4.Close())
		require.ErrorIs(t, <-got, errEnded, "the peer closed it")
		c5, c6 := connPair(t, a, b, 312)
		defer c6.Close()
		got = await(c5, context.Background())
		require.NoError(t, c5.Close())
		require.ErrorIs(t, <-got, net.ErrClosed, "closed while waiting")
		c3.Close()
	})
}

// AwaitEnd returns once the peer's CLOSE has come (after this end's
// Close, the peer's answer to it) and for a connection that fails; it
// fails with its context.
func TestAwaitEnd(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		a, b := endpoints(t, backend, Config{})
		c1, c2 := connPair(t, a, b, 320)
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan error, 1)
		go func() { got <- c1.AwaitEnd(ctx) }()
		waitfor.Blocked(t, "AwaitEnd")
		cancel()
		require.ErrorIs(t, <-got, context.Canceled, "a live connection waits until its context ends")

		go func() { got <- c1.AwaitEnd(context.Background()) }()
		waitfor.Blocked(t, "AwaitEnd")
		require.NoError(t, c1.Close())
		require.NoError(t, <-got, "the peer's CLOSE, its answer to ours, ends the wait")
		require.True(t, c1.Ended())
		_, err := c2.Read(make([]byte, 1))
		require.ErrorIs(t, err, io.EOF, "the wait ended after the peer had this end's CLOSE")
		c2.Close()

		c3, c4 := connPair(t, a, b, 321)
		defer c4.Close()
		go func() { got <- c3.AwaitEnd(context.Background()) }()
		waitfor.Blocked(t, "AwaitEnd")
		require.NoError(t, a.Close()) // its connections fail
		require.NoError(t, <-got, "a failed connection has ended")
		require.NoError(t, c3.AwaitEnd(context.Background()), "and the wait ends at once after")
		c3.Close()
	})
}
