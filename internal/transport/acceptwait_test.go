package transport

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestPendingAcceptStaysOffDoorbell: a listener's pending Accept must not
// make the poller sleep on the doorbell while calls come — it did once per
// record or so, a futex wake at the sender and a thread wake-up here for
// each (see idleGrace).
func TestPendingAcceptStaysOffDoorbell(t *testing.T) {
	a, b := endpoints(t, "shm", Config{})
	c1, c2 := connPair(t, a, b, 7)
	defer c1.Close()
	defer c2.Close()
	ln, err := b.Listen(8)
	require.NoError(t, err)
	defer ln.Close()
	go ln.AcceptConn() // pending until the listener closes

	const total, chunk = 64 << 20, 64 << 10
	go func() {
		buf := make([]byte, chunk)
		for n := 0; n < total; n += chunk {
			if _, err := c1.Write(buf); err != nil {
				t.Error(err)
				return
			}
		}
		c1.CloseWrite()
	}()
	before := b.Stats().PollerSleeps
	n, err := io.Copy(io.Discard, c2)
	require.NoError(t, err)
	require.Equal(t, int64(total), n)
	sleeps := b.Stats().PollerSleeps - before
	t.Logf("%d records, %d poller sleeps", total/chunk, sleeps)
	require.Less(t, sleeps, int64(total/chunk/8), "the poller slept on the doorbell under a stream")
}
