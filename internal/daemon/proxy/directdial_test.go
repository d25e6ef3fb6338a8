package proxy

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/socklike"
)

// A direct dial's application attaches its end of the link on the early
// grant, before the far side is asked; a far side that refuses fails the
// dial with its answer, and the grant, the link and its files go.
func TestDirectRefusedAfterGrant(t *testing.T) {
	r := newRack(t, "")
	srvB := attach(t, r.cb)
	ln, err := (&socklike.ListenConfig{Proxy: srvB}).Listen(context.Background(), "tcp", ":80")
	require.NoError(t, err)
	defer ln.Close()
	go echo(ln)
	client := attach(t, r.ca)
	memory := func(s *Server) (m int64) {
		for _, a := range s.Snapshot().Apps {
			m += a.Memory
		}
		return m
	}
	baseA, baseB := memory(r.a), memory(r.b)
	d := &socklike.Dialer{Proxy: client, Direct: true}
	for range 3 {
		_, err := d.DialContext(context.Background(), "tcp", "b:99") // nobody listens there
		require.ErrorIs(t, err, syscall.ECONNREFUSED)
		require.Contains(t, err.Error(), "nobody listens on b:99")
	}
	require.Eventually(t, func() bool {
		files, _ := filepath.Glob(filepath.Join(r.ca.Proxy.FabricDir, directPrefix+"*"))
		return memory(r.a) == baseA && memory(r.b) == baseB && len(r.a.Snapshot().Conns) == 0 && len(files) == 0
	}, 5*time.Second, 10*time.Millisecond, "a refused direct dial leaves no grant, connection or link file")
	// The same Dialer then dials a listener directly.
	c, err := d.DialContext(context.Background(), "tcp", "b:80")
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, "direct", c.(*socklike.Conn).Route().Mode)
	roundTrip(t, c, 1, 4096)
}

// A direct dial to an address takes the direct link an earlier one
// opened, once that connection has closed: the first dial opens the link
// and is charged for it, the next is a connection on the live link, which
// both proxies authorize and hold a lease of, charged nothing. A dial
// while that connection is open opens a link of its own. Closed, the
// links are kept for the next dials, then close and their quota comes
// back; a listener of another application on the same address gets a
// link of its own.
func TestDirectDialsShareALink(t *testing.T) {
	r := newRack(t, "")
	srvB := attach(t, r.cb)
	ln, err := (&socklike.ListenConfig{Proxy: srvB}).Listen(context.Background(), "tcp", ":80")
	require.NoError(t, err)
	go echo(ln)
	const idle = 200 * time.Millisecond
	client := attachWith(t, r.ca, socklike.Config{DirectIdle: idle})
	memory := func(s *Server) (m int64) {
		for _, a := range s.Snapshot().Apps {
			m += a.Memory
		}
		return m
	}
	baseA, baseB := memory(r.a), memory(r.b)
	d := &socklike.Dialer{Proxy: client, Direct: true}
	var conns []net.Conn
	for i, want := range []string{"a window slice of its own", "on the window slice of an earlier one", "a window slice of its own"} {
		c, err := d.DialContext(context.Background(), "tcp", "b:80")
		require.NoError(t, err, "dial %d", i)
		route := c.(*socklike.Conn).Route()
		require.Equal(t, "direct", route.Mode)
		require.Contains(t, route.Reason, want, "dial %d", i)
		roundTrip(t, c, uint64(i), 64<<10)
		if i == 0 {
			require.NoError(t, c.Close())
			continue
		}
		conns = append(conns, c)
	}
	link := linkBytes(r.ca.Proxy.DirectWindow)
	require.Equal(t, baseA+2*link, memory(r.a), "two links charged on the dialing side")
	require.Equal(t, baseB+2*link, memory(r.b), "two links charged on the listening side")
	for _, c := range conns {
		require.NoError(t, c.Close())
	}
	require.Eventually(t, func() bool {
		files, _ := filepath.Glob(filepath.Join(r.ca.Proxy.FabricDir, directPrefix+"*"))
		return memory(r.a) == baseA && memory(r.b) == baseB && len(r.a.Snapshot().Conns) == 0 && len(r.b.Snapshot().Conns) == 0 && len(files) == 0
	}, 10*time.Second, 10*time.Millisecond, "the idle links close and their grants come back")

	// Another application listening on the address: the dialer's live
	// link leads to the first, so the dial opens a link of its own.
	c, err := d.DialContext(context.Background(), "tcp", "b:80")
	require.NoError(t, err)
	roundTrip(t, c, 9, 1000)
	require.NoError(t, c.Close())
	require.NoError(t, ln.Close())
	srvB2 := attach(t, r.cb)
	ln2, err := (&socklike.ListenConfig{Proxy: srvB2}).Listen(context.Background(), "tcp", ":80")
	require.NoError(t, err)
	defer ln2.Close()
	go echo(ln2)
	c, err = d.DialContext(context.Background(), "tcp", "b:80")
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, "direct", c.(*socklike.Conn).Route().Mode)
	require.Contains(t, c.(*socklike.Conn).Route().Reason, "a window slice of its own")
	roundTrip(t, c, 10, 1000)
}

// A first direct dial between two applications returns on the proxied
// path (a proxied dial's time, not a link's open) and moves onto its link
// once that is up: 8 MiB echoed through it while it moves arrive byte for
// byte, the second half once it is on the link, and it ends there, a
// direct connection with the link's quota charged at both proxies.
func TestDirectFirstDialMovesOnto(t *testing.T) {
	r := newRack(t, "")
	echoRack(t, r)
	onto := make(chan string, 1)
	client := attachWith(t, r.ca, socklike.Config{Logf: func(format string, args ...any) {
		if line := fmt.Sprintf(format, args...); strings.Contains(line, "moved onto it from the proxied path it began on") {
			select {
			case onto <- line:
			default:
			}
		}
	}})
	nc, err := (&socklike.Dialer{Proxy: client, Direct: true}).Dial("tcp", "b:80")
	require.NoError(t, err)
	defer nc.Close()
	c := nc.(*socklike.Conn)
	first := c.Route()
	require.Equal(t, "direct", first.Mode)
	t.Logf("Route on return: %+v", first)

	const size = 8 << 20
	data := make([]byte, size)
	rng := rand.New(rand.NewPCG(size, 4))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	moved := make(chan struct{})
	written := make(chan error, 1)
	go func() {
		for off := 0; off < size; off += 32 << 10 {
			if off == size/2 {
				<-moved
			}
			if _, err := c.Write(data[off : off+32<<10]); err != nil {
				written <- err
				return
			}
		}
		written <- c.CloseWrite()
	}()
	home := onLink(t, c)
	t.Log(<-onto) // it began on the proxied path
	close(moved)
	got, err := io.ReadAll(c)
	require.NoError(t, err)
	require.NoError(t, <-written)
	require.Equal(t, sha256.Sum256(data), sha256.Sum256(got), "every byte echoed, once, in order")
	require.Equal(t, "direct", home.Mode)
	require.Contains(t, home.Reason, "a window slice of its own")
	require.Equal(t, home, c.Route(), "it ends on its link")
	memory := func(s *Server) (m int64) {
		for _, a := range s.Snapshot().Apps {
			m += a.Memory
		}
		return m
	}
	require.GreaterOrEqual(t, memory(r.a), linkBytes(r.ca.Proxy.DirectWindow), "a's proxy charges the link")
	require.GreaterOrEqual(t, memory(r.b), linkBytes(r.cb.Proxy.DirectWindow), "b's proxy charges the link")
}
