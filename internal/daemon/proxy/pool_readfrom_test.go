package proxy

import (
	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
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

// poolClient dials b's echo in shared-pool mode, through slots whose rings
// hold 64 KiB.
func poolClient(t *testing.T) net.Conn {
	r := newRack(t, "", "pool_slots = 2\npool_ring = 65536")
	poolEcho(t, r)
	client := attach(t, r.ca)
	c, err := (&socklike.Dialer{Proxy: client, Pool: true}).DialContext(context.Background(), "tcp", "b:80")
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.Equal(t, "pool", c.(*socklike.Conn).Route().Mode)
	return c
}

// TestPoolReadFrom: io.Copy into a shared-pool connection delivers every
// byte in order, through a ring many times smaller than the stream, from
// each kind of source: a body as net/http passes it (an io.LimitedReader
// of bytes in memory) and a regular file, both read straight into the
// slot's ring, and any other reader, read 256 KiB at a time. The echo
// (io.Copy of b's connection into itself) takes the last way.
func TestPoolReadFrom(t *testing.T) {
	c := poolClient(t)
	data := make([]byte, 3<<20+17)
	for i := range data {
		data[i] = byte(i*31 + i>>11)
	}
	path := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(path, data, 0o600))
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	plain := &askedReader{r: bytes.NewReader(data)}
	for name, src := range map[string]io.Reader{
		"limited": io.LimitReader(bytes.NewReader(data), int64(len(data))),
		"file":    f,
		"plain":   plain,
	} {
		got := make(chan []byte, 1)
		go func() {
			b := make([]byte, len(data))
			_, err := io.ReadFull(c, b)
			if err != nil {
				t.Error(err)
			}
			got <- b
		}()
		n, err := io.Copy(c, src)
		require.NoError(t, err, name)
		require.Equal(t, int64(len(data)), n, name)
		require.True(t, bytes.Equal(data, <-got), "echoed bytes, %s", name)
	}
	require.NotEmpty(t, plain.asked)
	for _, k := range plain.asked {
		require.Equal(t, 256<<10, k, "a plain source's Read size")
	}
}

// TestPoolReadFromCloseUnblocked: a Close while io.Copy waits on its
// source (a pipe) returns at once, as it would beside io.Copy's own loop:
// no lock of the connection is held across the source's Read.
func TestPoolReadFromCloseUnblocked(t *testing.T) {
	c := poolClient(t)
	pr, pw := io.Pipe()
	defer pw.Close()
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(c, pr)
		done <- err
	}()
	waitfor.Blocked(t, "io.(*pipe).read")
	require.NoError(t, c.Close())
	pw.Write([]byte("late")) // the copy's next Write finds the connection closed
	require.ErrorIs(t, <-done, net.ErrClosed)
}
