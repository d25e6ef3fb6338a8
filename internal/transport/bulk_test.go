package transport

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBulkAnswersAreNotLatencyTraffic: small requests each answered with a
// bulk response on the same connection (an HTTP file server's GETs) do not
// mark the partition as carrying latency traffic, which would cut the
// answers into pieces and the windows beside them to SharedWindow; small
// requests with small answers still do.
func TestBulkAnswersAreNotLatencyTraffic(t *testing.T) {
	a, b := endpoints(t, "ntbtest", Config{})
	const smallFor = time.Minute // every request below comes within it
	a.smallFor, b.smallFor = int64(smallFor), int64(smallFor)
	for _, tc := range []struct {
		answer int
		marked bool
	}{{256 << 10, false}, {8, true}} {
		w, r := connPair(t, a, b, 1+tc.answer%7)
		marked := func() bool { return r.st().traffic[r.rxPart.Load()].smallAt.Load() != 0 }
		r.st().traffic[0].smallAt.Store(0)
		req := make([]byte, 64)
		answer := make([]byte, tc.answer)
		for range 4 {
			_, err := w.Write(req)
			require.NoError(t, err)
			_, err = io.ReadFull(r, req)
			require.NoError(t, err)
			_, err = r.Write(answer)
			require.NoError(t, err)
			_, err = io.ReadFull(w, answer)
			require.NoError(t, err)
		}
		require.Equal(t, tc.marked, marked(), "partition marked, answers of %d bytes", tc.answer)
		w.Close()
		r.Close()
	}
}
