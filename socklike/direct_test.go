package socklike

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/appproto"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/ntbtest"
	"github.com/ntstack/ntstack/ntb/shm"
)

// engineConns dials b's listener on port from a, on the engine.
func engineConns(t *testing.T, a, b *transport.Endpoint, port int) (*transport.Conn, *transport.Conn) {
	t.Helper()
	ln, err := b.Listen(port)
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan *transport.Conn, 1)
	go func() {
		c, _ := ln.AcceptConn()
		accepted <- c
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := a.DialContext(ctx, port)
	require.NoError(t, err)
	s := <-accepted
	require.NotNil(t, s)
	return c, s
}

// directRig is a direct connection's two ends in one process: the direct
// link a pair of shm devices, the leases and the fallback engine
// connections over an in-memory link, whose ntproxy ends the test holds.
type directRig struct {
	c      [2]*Conn
	link   [2]*shm.Device     // the direct link's ends
	proxy  [2]*transport.Conn // ntproxy's ends of the leases
	dialed atomic.Int32       // fallbacks opened
}

func newDirectRig(t *testing.T) *directRig {
	return newDirectRigWith(t, shm.Options{HeartbeatTimeout: appproto.LinkHeartbeatTimeout})
}

// newDirectRigWith is newDirectRig with the direct link's liveness
// options (the heartbeat's and the silence's timeouts) from o.
func newDirectRigWith(t *testing.T, o shm.Options) *directRig {
	const name = "direct-a-1"
	dir := t.TempDir()
	var eps [2]*transport.Endpoint
	for side := range 2 {
		ep, err := transport.Open(name, transport.Config{Logf: t.Logf,
			Fabric: shm.Options{Dir: dir, WindowSize: 1 << 20, Side: shm.Side0 + shm.Side(side),
				HeartbeatInterval: o.HeartbeatInterval, HeartbeatTimeout: o.HeartbeatTimeout, SilentTimeout: o.SilentTimeout}})
		require.NoError(t, err)
		eps[side] = ep
	}
	// The direct links close with the test, not after it, when a Conn's
	// Close left them to linger for the peer's: a linger's Close may be
	// under way, which a second Close does not wait for, so the test
	// waits until both devices are closed (their endpoints' pollers have
	// ended then).
	t.Cleanup(func() {
		for _, ep := range eps {
			ep.Close()
		}
		waitfor.True(t, "the direct links closed", func() bool {
			for _, ep := range eps {
				if ep.Device().(*shm.Device).LinkCause() != ntb.CauseLocal {
					return false
				}
			}
			return true
		})
	})
	ln, err := eps[1].Listen(appproto.DirectPort)
	require.NoError(t, err)
	accepted := make(chan *transport.Conn, 1)
	go func() {
		c, _ := ln.AcceptConn()
		accepted <- c
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc0, err := eps[0].DialContext(ctx, appproto.DirectPort)
	require.NoError(t, err)
	dc1 := <-accepted
	require.NotNil(t, dc1)

	da, db := ntbtest.NewPair(1 << 20)
	ma, err := transport.Attach(da, transport.Config{})
	require.NoError(t, err)
	mb, err := transport.Attach(db, transport.Config{})
	require.NoError(t, err)
	t.Cleanup(func() {
		ma.Close()
		mb.Close()
		da.Close()
		db.Close()
	})
	r := &directRig{}
	for side, ep := range eps {
		r.link[side] = ep.Device().(*shm.Device)
	}
	var leases [2]*transport.Conn
	for side := range 2 {
		leases[side], r.proxy[side] = engineConns(t, ma, mb, 10+side)
	}
	ps := [2]*Proxy{}
	for side := range 2 {
		ps[side] = &Proxy{cfg: transport.Config{Logf: func(format string, args ...any) { t.Logf("side %d: "+format, append([]any{side}, args...)...) }}}
	}
	var lns [2]*transport.Listener
	lns[1] = ln
	var ds [2]*directConn
	for side, dc := range []*transport.Conn{dc0, dc1} {
		ds[side] = ps[side].newDirect(name, side, eps[side], lns[side], dc, leases[side])
		r.c[side] = &Conn{d: ds[side], route: Route{Path: "ntb", Mode: "direct"}}
	}
	// Side 0's fallback: a connection over the in-memory link, which
	// side 1's ntproxy hands to side 1 as an Incoming with Continue does.
	fbPort := 100
	ds[0].dialFallback = func(ctx context.Context) (*transport.Conn, Route, error) {
		fbPort++
		f0, f1 := engineConns(t, ma, mb, fbPort)
		r.dialed.Add(1)
		go ps[1].continued(name, f1, Route{Path: "tcp", Mode: "proxy", Reason: "fallback"})
		return f0, Route{Path: "tcp", Mode: "proxy", Reason: "fallback"}, nil
	}
	ds[0].start("b:1")
	ds[1].start("")
	return r
}

// pull tells both ends that the NTB link went down (up: came back) and
// waits until the connection is on the fallback (back on its link).
func (r *directRig) pull(t *testing.T, down bool) {
	msg, mode := byte(appproto.LeaseLinkDown), "proxy"
	if !down {
		msg, mode = appproto.LeaseLinkUp, "direct"
	}
	for _, p := range r.proxy {
		_, err := p.Write([]byte{msg})
		require.NoError(t, err)
	}
	waitfor.True(t, "both ends in "+mode+" mode", func() bool {
		return r.c[0].Route().Mode == mode && r.c[1].Route().Mode == mode
	})
}

// A direct connection streaming both ways moves to the fallback and back,
// twice, and every byte arrives once, in order, on the same Conns; the
// ends of the streams (CloseWrite) arrive too.
func TestDirectMovesAndBack(t *testing.T) {
	r := newDirectRig(t)
	const size = 16 << 20
	var moved [2]atomic.Int64 // bytes read at each end
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for dir := range 2 {
		src, dst := r.c[dir], r.c[1-dir]
		rng := rand.New(rand.NewPCG(41, uint64(dir)))
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(rng.Uint32())
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			for off := 0; off < size; {
				n := min(size-off, 1+rng.IntN(200<<10))
				if _, err := src.Write(data[off : off+n]); err != nil {
					errs <- fmt.Errorf("write %d at %d: %w", dir, off, err)
					return
				}
				off += n
			}
			if err := src.CloseWrite(); err != nil {
				errs <- fmt.Errorf("close write %d: %w", dir, err)
			}
		}()
		go func() {
			defer wg.Done()
			h := sha256.New()
			buf := make([]byte, 96<<10)
			for {
				n, err := dst.Read(buf)
				h.Write(buf[:n])
				moved[dir].Add(int64(n))
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					errs <- fmt.Errorf("read %d after %d bytes: %w", dir, moved[dir].Load(), err)
					return
				}
			}
			if moved[dir].Load() != size || [32]byte(h.Sum(nil)) != sha256.Sum256(data) {
				errs <- fmt.Errorf("direction %d: %d bytes, want %d, or bytes lost, duplicated or reordered", dir, moved[dir].Load(), size)
			}
		}()
	}
	past := func(n int64) {
		waitfor.True(t, fmt.Sprintf("both directions past %d bytes", n), func() bool {
			return moved[0].Load() >= n && moved[1].Load() >= n || len(errs) > 0
		})
	}
	for round, at := range []int64{size / 8, size / 2} {
		past(at)
		r.pull(t, true)
		require.Contains(t, r.c[0].Route().Reason, "fallback", "round %d: Route on the fallback", round)
		past(at + size/8)
		r.pull(t, false)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, 2, r.dialed.Load(), "one fallback a pull")
	require.Equal(t, Route{Path: "ntb", Mode: "direct"}, r.c[0].Route())
	for _, c := range r.c {
		require.NoError(t, c.Close())
	}
	_, err := r.c[0].Write([]byte("x"))
	require.ErrorIs(t, err, net.ErrClosed)
}

// A direct link whose peer is only silent (suspect: its heartbeat stands
// still) does not move its connection to the fallback: the fallback
// would end at the same process, whose silence says it does not run. The
// stream stays on its link and flows on while the peer is suspect and
// after it is heard again, every byte once, in order (docs/architecture.md,
// Liveness).
func TestDirectSuspectStaysOnLink(t *testing.T) {
	r := newDirectRigWith(t, shm.Options{HeartbeatInterval: 10 * time.Millisecond, HeartbeatTimeout: 50 * time.Millisecond, SilentTimeout: time.Hour})
	at := func(o int64) byte { return byte(o ^ o>>8 ^ o>>17) }
	stop := make(chan struct{})
	var wrote, read atomic.Int64
	errs := make(chan error, 2)
	go func() {
		buf := make([]byte, 32<<10)
		for {
			select {
			case <-stop:
				errs <- r.c[0].CloseWrite()
				return
			default:
			}
			for i := range buf {
				buf[i] = at(wrote.Load() + int64(i))
			}
			n, err := r.c[0].Write(buf)
			wrote.Add(int64(n))
			if err != nil {
				errs <- fmt.Errorf("write at %d: %w", wrote.Load(), err)
				return
			}
		}
	}()
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := r.c[1].Read(buf)
			for i, b := range buf[:n] {
				if o := read.Load() + int64(i); b != at(o) {
					errs <- fmt.Errorf("byte %d is %#x, want %#x: lost, duplicated or reordered", o, b, at(o))
					return
				}
			}
			read.Add(int64(n))
			if errors.Is(err, io.EOF) {
				errs <- nil
				return
			}
			if err != nil {
				errs <- fmt.Errorf("read after %d bytes: %w", read.Load(), err)
				return
			}
		}
	}()
	flows := func(what string, cond func() bool) {
		from := read.Load()
		waitfor.True(t, what, func() bool { return cond() && read.Load() > from+1<<20 || len(errs) > 0 })
		require.Empty(t, errs, what)
	}
	flows("the stream flows", func() bool { return true })
	r.link[1].SilenceHeartbeat(true)
	waitfor.True(t, "side 0 finds its peer suspect", r.link[0].Suspect)
	// A beat of side 1's already under way may end a first suspicion;
	// the silence brings it back, and the stream must flow during it.
	flows("the stream flows on while its peer is suspect", r.link[0].Suspect)
	require.Equal(t, Route{Path: "ntb", Mode: "direct"}, r.c[0].Route(), "a suspect link keeps the connection")
	r.link[1].SilenceHeartbeat(false)
	waitfor.True(t, "side 0 hears its peer again", func() bool { return !r.link[0].Suspect() })
	flows("the stream flows after", func() bool { return true })
	close(stop)
	for range 2 {
		require.NoError(t, <-errs)
	}
	require.Equal(t, wrote.Load(), read.Load(), "bytes read")
	require.Zero(t, r.dialed.Load(), "no fallback opened")
	require.Equal(t, Route{Path: "ntb", Mode: "direct"}, r.c[0].Route())
	for _, c := range r.c {
		require.NoError(t, c.Close())
	}
}

// A peer that is gone still reads as a reset: the far end's direct link
// closes under a blocked Read, and the Read fails with ECONNRESET.
func TestDirectPeerGoneResets(t *testing.T) {
	r := newDirectRig(t)
	errc := make(chan error, 1)
	go func() {
		_, err := r.c[0].Read(make([]byte, 1))
		errc <- err
	}()
	waitfor.Blocked(t, "(*directConn).Read")
	require.NoError(t, r.c[1].d.ep.Close())
	err := <-errc
	require.ErrorIs(t, err, syscall.ECONNRESET, "a blocked Read when the peer's end of the direct link is gone")
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "read", oe.Op)
	for _, c := range r.c {
		require.NoError(t, c.Close())
	}
}
