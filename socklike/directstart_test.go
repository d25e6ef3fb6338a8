package socklike

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/appproto"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/shm"
)

// startRig is a first direct connection between two applications in one
// process, as startDirect and acceptStart make it: both ends of its link
// still to open (the test opens them, or says they failed), the
// connection on its proxied path — an engine connection over an
// in-memory link, whose ntproxy ends of the leases the test holds.
type startRig struct {
	directStream
	t     *testing.T
	dl    *appproto.DirectLink
	ps    [2]*Proxy
	ls    [2]*directLink
	route Route // the direct route, once on the link
}

func newStartRig(t *testing.T) *startRig {
	ma, mb := enginePair(t)
	r := &startRig{t: t, dl: &appproto.DirectLink{Name: "direct-a-1", Dir: t.TempDir(), Window: 1 << 20}, route: Route{Path: "ntb", Mode: "direct", Reason: "a window slice of its own"}}
	var leases [2]*transport.Conn
	for side := range 2 {
		r.ps[side] = &Proxy{linkIdle: time.Minute, cfg: transport.Config{Logf: func(format string, args ...any) { t.Logf("side %d: "+format, append([]any{side}, args...)...) }}}
		leases[side], r.proxy[side] = engineConns(t, ma, mb, 10+side)
		r.ls[side] = r.ps[side].newPendingLink(r.dl.Name, side, []string{"b:1", ""}[side], leases[side])
	}
	t.Cleanup(func() {
		for _, p := range r.ps {
			for _, l := range p.allLinks() {
				select {
				case <-l.ready:
				default: // a test that failed before it opened this end
					l.opened(nil, nil, errors.New("the test ended"))
				}
				l.close()
			}
		}
	})
	f0, f1 := engineConns(t, ma, mb, 20)
	for side, f := range []*transport.Conn{f0, f1} {
		d := r.ps[side].newDirectOn(r.ls[side], 0, nil, &carrier{c: f, fb: true}, leases[side], 0)
		d.starting = true
		d.fallback = &Route{Path: "ntb", Mode: "direct", Reason: startReason + r.route.Reason}
		r.c[side] = &Conn{d: d, route: r.route}
		d.start([]string{"b:1", ""}[side])
	}
	go r.c[0].d.moveOnto(r.dl, r.route.Reason)
	go r.c[1].d.acceptOnto(r.route.Reason)
	return r
}

// open opens both ends of the link, as openEnd and acceptStart's open do.
func (r *startRig) open() {
	r.openSide(1)
	r.openSide(0)
}

// openSide opens side's end of the link (side 1's with its listener on
// DirectPort) and returns its endpoint.
func (r *startRig) openSide(side int) *transport.Endpoint {
	t := r.t
	ep, err := r.ps[side].openEnd(r.dl, side)
	require.NoError(t, err)
	t.Cleanup(func() {
		ep.Close()
		waitfor.True(t, "the direct link closed", func() bool { return ep.Device().(*shm.Device).LinkCause() == ntb.CauseLocal })
	})
	var ln *transport.Listener
	if side == 1 {
		ln, err = ep.Listen(appproto.DirectPort)
		require.NoError(t, err)
	}
	r.ls[side].opened(ep, ln, nil)
	return ep
}

// starting reports whether side's end is on the proxied path it began on.
func (r *startRig) starting(side int) bool {
	return strings.HasPrefix(r.c[side].Route().Reason, startReason)
}

// A first direct connection works before its link is up: it streams
// several MiB each way on the proxied path it began on while its link
// has not opened, then the link opens and the connection moves onto it
// mid-stream, and the rest of each direction crosses the link; every
// byte arrives once, in order, and both ends end on the link (Route),
// the proxied path closed.
func TestDirectStartsProxiedAndMovesOn(t *testing.T) {
	r := newStartRig(t)
	const size = 8 << 20
	moved := make(chan struct{})
	read, wait := streamGated(t, r.c, size, moved)
	waitfor.True(t, "a MiB each way on the proxied path", func() bool { return read[0].Load() >= 1<<20 && read[1].Load() >= 1<<20 })
	for side := range 2 {
		require.True(t, r.starting(side), "side %d: Route before the link is up: %+v", side, r.c[side].Route())
		require.Equal(t, "direct", r.c[side].Route().Mode)
	}
	var fbs [2]*carrier
	for side := range 2 {
		r.c[side].d.mu.Lock()
		fbs[side] = r.c[side].d.w
		r.c[side].d.mu.Unlock()
	}
	r.open()
	waitfor.True(t, "both ends on the direct link", func() bool { return !r.starting(0) && !r.starting(1) })
	close(moved)
	wait()
	for side, fb := range fbs {
		require.Equal(t, r.route, r.c[side].Route(), "side %d ends on its link", side)
		require.False(t, r.c[side].d.w.fb, "side %d writes on the link", side)
		require.GreaterOrEqual(t, fb.wrote, int64(1<<20), "side %d: the proxied path carried the start", side)
		require.LessOrEqual(t, fb.wrote, int64(size/2), "side %d: the link carried the second half", side)
	}
	_, err := fbs[0].c.Write([]byte("x"))
	require.ErrorIs(t, err, net.ErrClosed, "the proxied path closes once both ends left it")
	for _, c := range r.c {
		require.NoError(t, c.Close())
	}
}

// streamGated streams size random bytes each way between c[0] and c[1],
// the second half of each direction once gate closes, then CloseWrite;
// read counts the bytes each direction delivered; wait waits until both
// arrived whole, once and in order.
func streamGated(t *testing.T, c [2]*Conn, size int, gate <-chan struct{}) (read *[2]atomic.Int64, wait func()) {
	read = new([2]atomic.Int64)
	errs := make(chan error, 4)
	for dir := range 2 {
		data := make([]byte, size)
		rng := rand.New(rand.NewPCG(7, uint64(dir)))
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		go func() {
			for off := 0; off < size; {
				if off == size/2 {
					<-gate
				}
				n := min(size/2-off%(size/2), 1+rng.IntN(200<<10))
				if _, err := c[dir].Write(data[off : off+n]); err != nil {
					errs <- fmt.Errorf("write %d at %d: %w", dir, off, err)
					return
				}
				off += n
			}
			errs <- c[dir].CloseWrite()
		}()
		go func() {
			var got []byte
			buf := make([]byte, 64<<10)
			var err error
			for {
				var n int
				n, err = c[1-dir].Read(buf)
				got = append(got, buf[:n]...)
				read[dir].Add(int64(n))
				if err != nil {
					break
				}
			}
			if errors.Is(err, io.EOF) {
				err = nil
			}
			if err == nil && !bytes.Equal(got, data) {
				err = fmt.Errorf("direction %d: %d bytes, want %d, or bytes lost, duplicated or reordered", dir, len(got), size)
			}
			errs <- err
		}()
	}
	return read, func() {
		for range 4 {
			require.NoError(t, <-errs)
		}
	}
}

// A first direct connection whose link does not open stays on the proxied
// path and says why; its link's lease (the quota on it) goes at once, and
// the connection carries on.
func TestDirectStartLinkFails(t *testing.T) {
	r := newStartRig(t)
	for side := range 2 {
		r.ls[side].opened(nil, nil, errors.New("direct_quota used up"))
	}
	for side := range 2 {
		waitfor.True(t, "the Route says the link did not come up", func() bool { return r.c[side].Route().Mode == "proxy" })
		route := r.c[side].Route()
		require.Contains(t, route.Reason, "did not come up")
		require.Contains(t, route.Reason, "direct_quota used up")
		_, err := r.proxy[side].Read(make([]byte, 1))
		require.ErrorIs(t, err, io.EOF, "side %d's lease closed", side)
	}
	past, wait := streamAll(t, []*directStream{&r.directStream}, 1<<20)
	past(1 << 20)
	wait()
	for _, c := range r.c {
		require.NoError(t, c.Close())
	}
	got, _ := r.ps[0].reuse("b:1")
	require.Nil(t, got, "a link that did not open is not reused")
}

// A first direct connection closed before its link is up leaves the link
// to open, and the dialing side keeps it for a later dial, which takes it
// even while it is still opening: before either end has opened, and once
// the dialing end has and the far end's attach is still to come.
func TestDirectStartClosedEarly(t *testing.T) {
	r := newStartRig(t)
	past, wait := streamAll(t, []*directStream{&r.directStream}, 64<<10)
	past(64 << 10)
	wait()
	for _, c := range r.c {
		require.NoError(t, c.Close())
	}
	l, k := r.ps[0].reuse("b:1")
	require.Same(t, r.ls[0], l, "a later dial takes the link still opening")
	require.Equal(t, 1, k)
	l.drop() // that dial gave up; the next takes the link again
	ep := r.openSide(0)
	require.NotEqual(t, ntb.LinkUp, ep.Device().Link(), "the far end has not opened")
	l, k = r.ps[0].reuse("b:1")
	require.Same(t, r.ls[0], l, "a later dial takes the link whose far end is still to open")
	require.Equal(t, 2, k)
	r.openSide(1)
	waitfor.True(t, "the link up", func() bool { return ep.Device().Link() == ntb.LinkUp })
	// The closed connection's move gives up once the link is up, and
	// leaves the link, which the later dial has taken, open.
	waitfor.True(t, "the closed connection's move given up", func() bool {
		buf := make([]byte, 1<<20)
		return !bytes.Contains(buf[:runtime.Stack(buf, true)], []byte("socklike.(*directConn).moveOnto"))
	})
	select {
	case <-l.done:
		t.Fatal("the closed connection's move closed the link a later dial took")
	default:
	}
	l.drop()
}
