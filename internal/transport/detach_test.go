package transport

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
		require.Eventually(t, func() bool { return c1.Paused() && c2.Paused() }, 30*time.Second, time.Millisecond, "both ends pause")
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
