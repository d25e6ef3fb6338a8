package proxy

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/socklike"
)

// askedReader is a plain io.Reader (no WriterTo) that records the size of
// every Read asked of it.
type askedReader struct {
	r     io.Reader
	asked []int
}

func (a *askedReader) Read(b []byte) (int, error) {
	a.asked = append(a.asked, len(b))
	return a.r.Read(b)
}

// TestPoolReadFrom: io.Copy into a shared-pool connection reads its source
// straight into the slot's ring — no Read asks for more than the ring's
// 64 KiB — through a ring many times smaller than the stream, and the echo
// (io.Copy of b's connection into itself, the same path) returns every
// byte in order.
func TestPoolReadFrom(t *testing.T) {
	r := newRack(t, "", "pool_slots = 2\npool_ring = 65536")
	poolEcho(t, r)
	client := attach(t, r.ca)
	c, err := (&socklike.Dialer{Proxy: client, Pool: true}).DialContext(context.Background(), "tcp", "b:80")
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, "pool", c.(*socklike.Conn).Route().Mode)
	data := make([]byte, 3<<20+17)
	for i := range data {
		data[i] = byte(i*31 + i>>11)
	}
	got := make(chan []byte, 1)
	go func() {
		b := make([]byte, len(data))
		_, err := io.ReadFull(c, b)
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	src := &askedReader{r: bytes.NewReader(data)}
	n, err := io.Copy(c, src)
	require.NoError(t, err)
	require.Equal(t, int64(len(data)), n)
	require.True(t, bytes.Equal(data, <-got), "echoed bytes")
	require.NotEmpty(t, src.asked)
	for _, k := range src.asked {
		require.LessOrEqual(t, k, 64<<10, "a Read of the source larger than the ring")
	}
}
