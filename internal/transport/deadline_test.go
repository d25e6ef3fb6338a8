package transport

import (
	"io"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// A Write that times out while a partition's token bucket holds it back
// leaves no goroutine behind: the wait for the bucket ends with the park
// it was made for, not with the Write, and not never.
func TestRateWaitTimeoutLeaksNothing(t *testing.T) {
	a, b := endpoints(t, "ntbtest", Config{PartitionRate: 64 << 10, MTU: 16 << 10})
	c1, c2 := connPair(t, a, b, 1)
	drained := make(chan struct{})
	go func() { io.Copy(io.Discard, c2); close(drained) }()
	t.Cleanup(func() { c2.Close(); <-drained })
	before := goleak.IgnoreCurrent()
	buf := make([]byte, 1<<20) // 16 s of the bucket's rate: every Write waits on it
	for i := range 20 {
		require.NoError(t, c1.SetWriteDeadline(time.Now().Add(20*time.Millisecond)))
		_, err := c1.Write(buf)
		require.ErrorIs(t, err, os.ErrDeadlineExceeded, "write %d", i)
	}
	goleak.VerifyNone(t, before)
}
