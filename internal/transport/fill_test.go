package transport

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/ntb"
)

// socketPair is a connected pair of stream sockets, as net.Conns.
func socketPair(t *testing.T) (*net.UnixConn, *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f) // a non-blocking dup
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// feed writes data to s in writes of random sizes up to most, then
// half-closes it.
func feed(s *net.UnixConn, data []byte, most int, seed uint64) <-chan error {
	done := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(seed, 7))
		for off := 0; off < len(data); {
			n := min(1+rng.IntN(most), len(data)-off)
			if _, err := s.Write(data[off : off+n]); err != nil {
				done <- err
				return
			}
			off += n
		}
		done <- s.CloseWrite()
	}()
	return done
}

// fillFrom moves s into c with ReadSocket until s ends, then half-closes c.
func fillFrom(c *Conn, s *net.UnixConn) <-chan error {
	done := make(chan error, 1)
	go func() {
		rc, err := s.SyscallConn()
		if err != nil {
			done <- err
			return
		}
		for {
			_, err := c.ReadSocket(rc, 256<<10)
			if errors.Is(err, io.EOF) {
				done <- c.CloseWrite()
				return
			}
			if err != nil {
				done <- err
				return
			}
		}
	}()
	return done
}

// Sockets read straight into the ring: four connections on one ring, fed
// in writes of every size (one of them small ones), arrive byte-exact and end where their sockets
// did — across a link flap in the middle, which sends the filled records
// again from the ring they were filled in. A sender that retains by copy
// does not fill and says so.
func TestReadSocket(t *testing.T) {
	retentionBackends(t, func(t *testing.T, da, db ntb.Device) {
		a, b := attachPair(t, da, db, Config{})
		const conns = 4
		type flow struct {
			w, r        *Conn
			data, got   []byte
			fed, filled <-chan error
			read        chan error
		}
		flows := make([]*flow, conns)
		for i := range flows {
			w, r := connPair(t, a, b, 310+i)
			defer w.Close()
			defer r.Close()
			in, out := socketPair(t)
			if !a.byRef {
				rc, err := out.SyscallConn()
				require.NoError(t, err)
				n, err := w.ReadSocket(rc, 1<<10)
				require.ErrorIs(t, err, errors.ErrUnsupported)
				require.Zero(t, n)
				return
			}
			window := w.st().window
			f := &flow{w: w, r: r, data: streamData(uint64(20+i), int(3*window)+i*4099), read: make(chan error, 1)}
			most := 200 << 10
			if i == 0 {
				most = 600 // records of keepSmall and less too
			}
			f.fed, f.filled = feed(in, f.data, most, uint64(i)), fillFrom(w, out)
			flows[i] = f
		}
		// The first half of each flow, then a flap while the rest is in
		// flight, then the rest.
		for _, f := range flows {
			f.got = make([]byte, len(f.data))
			go func() { _, err := io.ReadFull(f.r, f.got[:len(f.data)/2]); f.read <- err }()
		}
		for _, f := range flows {
			require.NoError(t, <-f.read)
		}
		require.Eventually(t, func() bool { return inFlight(flows[0].w) > 0 }, 30*time.Second, time.Millisecond)
		setLink(da, ntb.LinkDown)
		require.Eventually(t, func() bool { return epoch(a) == 0 && epoch(b) == 0 }, 30*time.Second, time.Millisecond,
			"both ends should see the link down")
		setLink(da, ntb.LinkUp)
		for _, f := range flows {
			go func() {
				_, err := io.ReadFull(f.r, f.got[len(f.data)/2:])
				if err == nil {
					var one [1]byte
					if _, err = f.r.Read(one[:]); err == io.EOF {
						err = nil
					} else if err == nil {
						err = errors.New("bytes past the socket's end")
					}
				}
				f.read <- err
			}()
		}
		for i, f := range flows {
			require.NoError(t, <-f.read, "flow %d", i)
			require.NoError(t, <-f.fed)
			require.NoError(t, <-f.filled)
			require.True(t, bytes.Equal(f.data, f.got), "flow %d arrives byte-exact", i)
		}
		resumed(t, a, b, 1)
		require.Zero(t, a.Stats().Resets+b.Stats().Resets)
	})
}
