package socklike

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// sizedReader is a plain io.Reader (no WriterTo) that records the size of
// every Read asked of it and fails with err once its bytes are gone.
type sizedReader struct {
	r     io.Reader
	asked []int
	err   error
}

func (s *sizedReader) Read(b []byte) (int, error) {
	s.asked = append(s.asked, len(b))
	n, err := s.r.Read(b)
	if err == io.EOF && s.err != nil {
		err = s.err
	}
	return n, err
}

// TestReadFromLargeWrites: io.Copy into a Conn goes through its ReadFrom,
// which reads its source 256 KiB at a time; the peer reads every byte in
// order and then io.EOF.
func TestReadFromLargeWrites(t *testing.T) {
	a, b := endpoints(t, Config{})
	c1, c2 := pair(t, a, b, "80")
	defer c1.Close()
	defer c2.Close()
	data := make([]byte, 3<<20+12345)
	for i := range data {
		data[i] = byte(i * 7)
	}
	got := make(chan []byte, 1)
	go func() {
		b, err := io.ReadAll(c2)
		if err != nil {
			t.Error(err)
		}
		got <- b
	}()
	src := &sizedReader{r: bytes.NewReader(data)}
	n, err := io.Copy(c1, src)
	require.NoError(t, err)
	require.Equal(t, int64(len(data)), n)
	require.NoError(t, c1.(*Conn).CloseWrite())
	require.True(t, bytes.Equal(data, <-got), "bytes read")
	require.NotEmpty(t, src.asked)
	for _, k := range src.asked {
		require.Equal(t, readFromBuf, k, "read size asked of the source")
	}
}

// TestReadFromSourceError: a source's error other than io.EOF ends
// ReadFrom with it, after what was read before it went out.
func TestReadFromSourceError(t *testing.T) {
	a, b := endpoints(t, Config{})
	c1, c2 := pair(t, a, b, "81")
	defer c1.Close()
	defer c2.Close()
	boom := errors.New("source failed")
	data := bytes.Repeat([]byte("x"), 100000)
	src := &sizedReader{r: bytes.NewReader(data), err: boom}
	n, err := c1.(*Conn).ReadFrom(src)
	require.ErrorIs(t, err, boom)
	require.Equal(t, int64(len(data)), n)
	got := make([]byte, len(data))
	_, err = io.ReadFull(c2, got)
	require.NoError(t, err)
	require.Equal(t, data, got)
}

// TestReadFromWriterTo: a source that writes itself out does so into the
// Conn directly.
func TestReadFromWriterTo(t *testing.T) {
	a, b := endpoints(t, Config{})
	c1, c2 := pair(t, a, b, "82")
	defer c1.Close()
	defer c2.Close()
	data := bytes.Repeat([]byte("ntstack "), 1<<16)
	done := make(chan error, 1)
	go func() {
		got := make([]byte, len(data))
		_, err := io.ReadFull(c2, got)
		if err == nil && !bytes.Equal(got, data) {
			err = errors.New("bytes differ")
		}
		done <- err
	}()
	n, err := c1.(*Conn).ReadFrom(bytes.NewReader(data))
	require.NoError(t, err)
	require.Equal(t, int64(len(data)), n)
	require.NoError(t, <-done)
}

// TestReadFromLimitedInMemory: net/http's response body, an
// io.LimitedReader over bytes in memory, is written straight from the
// bytes: the peer reads exactly the limit's bytes, the limit drops to 0,
// and the source is left just past them.
func TestReadFromLimitedInMemory(t *testing.T) {
	a, b := endpoints(t, Config{})
	c1, c2 := pair(t, a, b, "83")
	defer c1.Close()
	defer c2.Close()
	data := make([]byte, 2<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	const limit = 1<<20 + 4321
	for _, src := range []io.Reader{bytes.NewReader(data), strings.NewReader(string(data))} {
		done := make(chan error, 1)
		go func() {
			got := make([]byte, limit)
			_, err := io.ReadFull(c2, got)
			if err == nil && !bytes.Equal(got, data[:limit]) {
				err = errors.New("bytes differ")
			}
			done <- err
		}()
		lr := &io.LimitedReader{R: src, N: limit}
		n, err := c1.(*Conn).ReadFrom(lr)
		require.NoError(t, err)
		require.Equal(t, int64(limit), n)
		require.Zero(t, lr.N)
		require.NoError(t, <-done)
		rest, err := io.ReadAll(src)
		require.NoError(t, err)
		require.Equal(t, data[limit:], rest, "%T left just past the limit", src)
	}
}
