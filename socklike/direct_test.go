package socklike

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/appproto"
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

// directRig is a direct link's two ends in one process, carrying one or
// more direct connections: the link a pair of shm devices, the leases and
// the fallback engine connections over an in-memory link, whose ntproxy
// ends the test holds.
type directRig struct {
	directStream // stream 0, the link's first connection
	more         []*directStream
	dialed       atomic.Int32 // fallbacks opened
	moved        atomic.Int32 // moves to the fallback made (side 0 logs each)
	retried      atomic.Int32 // tries of a move that failed after its fallback was opened (side 0 logs each)

	t      *testing.T
	link   [2]*shm.Device // the direct link's ends
	ps     [2]*Proxy
	ls     [2]*directLink
	ma, mb *transport.Endpoint // the in-memory link's ends
	port   atomic.Int32        // the last port used on the in-memory link
}

// directStream is one direct connection of a directRig.
type directStream struct {
	c     [2]*Conn
	proxy [2]*transport.Conn // ntproxy's ends of the leases
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
	// Close left them to linger for the peer's: an endpoint's Close
	// returns once its pollers have ended and its device is closed, a
	// linger's Close under way or not.
	t.Cleanup(func() {
		for _, ep := range eps {
			ep.Close()
		}
	})
	ma, mb := enginePair(t)
	r := &directRig{t: t, ma: ma, mb: mb}
	for side, ep := range eps {
		r.link[side] = ep.Device().(*shm.Device)
	}
	r.port.Store(100)
	for side := range 2 {
		r.ps[side] = &Proxy{linkIdle: time.Minute, cfg: transport.Config{Logf: func(format string, args ...any) {
			line := fmt.Sprintf(format, args...)
			t.Logf("side %d: %s", side, line)
			switch {
			case side != 0:
			case strings.Contains(line, "connection moved to the fallback"):
				r.moved.Add(1)
			case strings.Contains(line, "the fallback through the proxies failed (try"):
				r.retried.Add(1)
			}
		}}}
	}
	var leases, proxy [2]*transport.Conn
	for side := range 2 {
		leases[side], proxy[side] = engineConns(t, ma, mb, 10+side)
		r.ls[side] = r.ps[side].newLink(name, side, "b:1", eps[side], leases[side])
	}
	t.Cleanup(func() { // the dialing side keeps an idle link; the other follows it
		for _, p := range r.ps {
			for _, l := range p.allLinks() {
				l.close()
			}
		}
	})
	r.directStream = *r.stream(0, leases)
	r.proxy = proxy
	return r
}

// stream connects stream k of the rig's link on the leases given.
func (r *directRig) stream(k int, leases [2]*transport.Conn) *directStream {
	t := r.t
	port := appproto.DirectPort
	if k > 0 {
		port = appproto.StreamPort(k)
	}
	ln, err := r.ls[1].ep.Listen(port)
	require.NoError(t, err)
	accepted := make(chan *transport.Conn, 1)
	go func() {
		c, _ := ln.AcceptConn()
		accepted <- c
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dc0, err := r.ls[0].ep.DialContext(ctx, port)
	require.NoError(t, err)
	dc1 := <-accepted
	require.NotNil(t, dc1)
	lns := [2]*transport.Listener{nil, ln}
	st := &directStream{}
	var ds [2]*directConn
	for side, dc := range []*transport.Conn{dc0, dc1} {
		ds[side] = r.ps[side].newDirect(r.ls[side], k, lns[side], dc, leases[side])
		st.c[side] = &Conn{d: ds[side], route: Route{Path: "ntb", Mode: "direct"}}
	}
	// Side 0's fallback: a connection over the in-memory link, which
	// side 1's ntproxy hands to side 1 as an Incoming with Continue does.
	name := ds[0].name
	ds[0].dialFallback = func(ctx context.Context) (*transport.Conn, Route, error) {
		f0, f1 := engineConns(t, r.ma, r.mb, int(r.port.Add(1)))
		r.dialed.Add(1)
		go r.ps[1].continued(name, f1, Route{Path: "tcp", Mode: "proxy", Reason: "fallback"})
		return f0, Route{Path: "tcp", Mode: "proxy", Reason: "fallback"}, nil
	}
	ds[0].start("b:1")
	ds[1].start("")
	return st
}

// another adds a later connection on the live link, as a reused dial
// makes it while an earlier connection lingers on the link: a stream
// number from the dialing side's link, a lease of its own at each end.
func (r *directRig) another() *directStream {
	k := r.ls[0].take()
	require.Positive(r.t, k)
	require.Same(r.t, r.ls[1], r.ps[1].lookup(r.ls[1].name))
	var leases, proxy [2]*transport.Conn
	for side := range 2 {
		leases[side], proxy[side] = engineConns(r.t, r.ma, r.mb, int(r.port.Add(1)))
	}
	s := r.stream(k, leases)
	s.proxy = proxy
	r.more = append(r.more, s)
	return s
}

// pull tells both ends of every connection that the NTB link went down
// (up: came back) and waits until each is on the fallback (back on its
// link).
func (r *directRig) pull(t *testing.T, down bool) {
	msg, mode := byte(appproto.LeaseLinkDown), "proxy"
	if !down {
		msg, mode = appproto.LeaseLinkUp, "direct"
	}
	all := append([]*directStream{&r.directStream}, r.more...)
	for _, s := range all {
		for _, p := range s.proxy {
			_, err := p.Write([]byte{msg})
			require.NoError(t, err)
		}
	}
	waitfor.True(t, "both ends in "+mode+" mode", func() bool {
		for _, s := range all {
			if s.c[0].Route().Mode != mode || s.c[1].Route().Mode != mode {
				return false
			}
		}
		return true
	})
}

// streamAll streams size random bytes each way on every connection of
// ss at once, each direction ending with CloseWrite, and checks at its
// end that each arrived once, whole and in order. past(n) waits until
// every direction has delivered n bytes; wait waits for the end and
// reports the failures.
func streamAll(t *testing.T, ss []*directStream, size int) (past func(n int64), wait func()) {
	moved := make([]atomic.Int64, 2*len(ss)) // bytes read, by connection and direction
	var wg sync.WaitGroup
	errs := make(chan error, 4*len(ss))
	for i, st := range ss {
		for dir := range 2 {
			src, dst, got := st.c[dir], st.c[1-dir], &moved[2*i+dir]
			rng := rand.New(rand.NewPCG(41+uint64(i), uint64(dir)))
			data := make([]byte, size)
			for j := range data {
				data[j] = byte(rng.Uint32())
			}
			wg.Add(2)
			go func() {
				defer wg.Done()
				for off := 0; off < size; {
					n := min(size-off, 1+rng.IntN(200<<10))
					if _, err := src.Write(data[off : off+n]); err != nil {
						errs <- fmt.Errorf("connection %d: write %d at %d: %w", i, dir, off, err)
						return
					}
					off += n
				}
				if err := src.CloseWrite(); err != nil {
					errs <- fmt.Errorf("connection %d: close write %d: %w", i, dir, err)
				}
			}()
			go func() {
				defer wg.Done()
				h := sha256.New()
				buf := make([]byte, 96<<10)
				for {
					n, err := dst.Read(buf)
					h.Write(buf[:n])
					got.Add(int64(n))
					if errors.Is(err, io.EOF) {
						break
					}
					if err != nil {
						errs <- fmt.Errorf("connection %d: read %d after %d bytes: %w", i, dir, got.Load(), err)
						return
					}
				}
				if got.Load() != int64(size) || [32]byte(h.Sum(nil)) != sha256.Sum256(data) {
					errs <- fmt.Errorf("connection %d, direction %d: %d bytes, want %d, or bytes lost, duplicated or reordered", i, dir, got.Load(), size)
				}
			}()
		}
	}
	past = func(n int64) {
		waitfor.True(t, fmt.Sprintf("every direction past %d bytes", n), func() bool {
			for i := range moved {
				if moved[i].Load() < n {
					return len(errs) > 0
				}
			}
			return true
		})
	}
	wait = func() {
		wg.Wait()
		close(errs)
		for err := range errs {
			require.NoError(t, err)
		}
	}
	return past, wait
}

// A direct connection streaming both ways moves to the fallback and back,
// twice, and every byte arrives once, in order, on the same Conns; the
// ends of the streams (CloseWrite) arrive too.
func TestDirectMovesAndBack(t *testing.T) {
	r := newDirectRig(t)
	const size = 16 << 20
	past, wait := streamAll(t, []*directStream{&r.directStream}, size)
	for round, at := range []int64{size / 8, size / 2} {
		past(at)
		r.pull(t, true)
		require.Contains(t, r.c[0].Route().Reason, "fallback", "round %d: Route on the fallback", round)
		past(at + size/8)
		r.pull(t, false)
	}
	wait()
	// One move a pull. A try of a move whose fallback opened but failed
	// before the move (the far end closed it: its connection had not
	// paused within moveTimeout) is logged and tried again, on a fallback
	// of its own: a third open is such a retry, not a second move.
	require.EqualValues(t, 2, r.moved.Load(), "one move to the fallback a pull")
	require.EqualValues(t, r.moved.Load()+r.retried.Load(), r.dialed.Load(), "fallbacks opened: one a move, one a logged retry")
	require.Equal(t, Route{Path: "ntb", Mode: "direct"}, r.c[0].Route())
	for _, c := range r.c {
		require.NoError(t, c.Close())
	}
	_, err := r.c[0].Write([]byte("x"))
	require.ErrorIs(t, err, net.ErrClosed)
}

// Two connections on one direct link (the link's first and a later one
// on it), streaming both ways at once, both move to the fallback when the
// link goes down and both come back, twice: every byte of each arrives
// once, in order. Closing them leaves the dialing side's link idle, not
// closed, for the next dial, which takes it while it carries no open
// connection; closing its last stream while it is retired closes it.
func TestDirectSharedLinkMovesAndBack(t *testing.T) {
	r := newDirectRig(t)
	second := r.another()
	require.Equal(t, appproto.StreamName("direct-a-1", 1), second.c[0].d.name)
	const size = 8 << 20
	past, wait := streamAll(t, []*directStream{&r.directStream, second}, size)
	for round, at := range []int64{size / 8, size / 2} {
		past(at)
		r.pull(t, true)
		for i, s := range []*directStream{&r.directStream, second} {
			require.Contains(t, s.c[0].Route().Reason, "fallback", "round %d, connection %d: Route on the fallback", round, i)
		}
		past(at + size/8)
		r.pull(t, false)
	}
	wait()
	require.EqualValues(t, 4, r.moved.Load(), "one move to the fallback a pull and connection")
	require.EqualValues(t, r.moved.Load()+r.retried.Load(), r.dialed.Load(), "fallbacks opened: one a move, one a logged retry")
	for _, s := range []*directStream{&r.directStream, second} {
		require.Equal(t, Route{Path: "ntb", Mode: "direct"}, s.c[0].Route())
		for _, c := range s.c {
			require.NoError(t, c.Close())
		}
	}
	// Both streams returned (after linger): the dialing side keeps the
	// link for the next dial.
	l := r.ls[0]
	waitfor.True(t, "both streams returned to the link", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.streams == 0 && l.idle != nil
	})
	third, k := r.ps[0].reuse("b:1")
	require.Same(t, l, third, "a dial takes the link with no open connection")
	require.Equal(t, 2, k)
	again, _ := r.ps[0].reuse("b:1")
	require.Nil(t, again, "a dial does not take a link with an open connection")
	l.retire()
	require.False(t, l.closed, "a retired link with a stream stays open")
	l.drop()
	waitfor.True(t, "the retired link closed with its last stream", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.closed
	})
	got, _ := r.ps[0].reuse("b:1")
	require.Nil(t, got, "a closed link is not reused")
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
	require.NoError(t, r.c[1].d.link.ep.Close())
	err := <-errc
	require.ErrorIs(t, err, syscall.ECONNRESET, "a blocked Read when the peer's end of the direct link is gone")
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "read", oe.Op)
	for _, c := range r.c {
		require.NoError(t, c.Close())
	}
}

// tell writes msg (appproto.LeaseLinkDown, LeaseLinkUp) on both leases of
// the rig's first connection, as ntproxy does, without waiting for a move.
func (r *directRig) tell(t *testing.T, msg byte) {
	for _, p := range r.proxy {
		_, err := p.Write([]byte{msg})
		require.NoError(t, err)
	}
}

// readsReset starts reading c to its end, the Read blocked before it
// returns, and returns a check that c read want, then an error matching
// ECONNRESET in a *net.OpError (not io.EOF), and that a later Read fails
// so too.
func readsReset(t *testing.T, c *Conn) (check func(want string)) {
	type result struct {
		got []byte
		err error
	}
	done := make(chan result, 1)
	go func() {
		got, err := io.ReadAll(c)
		done <- result{got, err}
	}()
	waitfor.Blocked(t, "(*directConn).Read")
	return func(want string) {
		t.Helper()
		r := <-done
		require.Equal(t, want, string(r.got), "read before the reset")
		require.ErrorIs(t, r.err, syscall.ECONNRESET, "not io.EOF")
		var oe *net.OpError
		require.ErrorAs(t, r.err, &oe)
		require.Equal(t, "read", oe.Op)
		_, err := c.Read(make([]byte, 1))
		require.ErrorIs(t, err, syscall.ECONNRESET, "a later Read")
	}
}

// Abort in direct mode resets the connection, as TestAbortResets shows it
// does in embedded mode, on whichever carrier the stream is on: the peer's
// blocked and later Reads fail with ECONNRESET once it has read what came
// before. Each end aborts in turn: on its direct link, on the fallback,
// back on its link after the fallback, and when a move is under way.
func TestDirectAbortResets(t *testing.T) {
	const words = "last words"
	for from := range 2 {
		t.Run(fmt.Sprintf("side%d", from), func(t *testing.T) {
			t.Run("link", func(t *testing.T) {
				r := newDirectRig(t)
				check := readsReset(t, r.c[1-from])
				require.NoError(t, r.c[from].Abort())
				check("")
				require.ErrorIs(t, r.c[from].Abort(), net.ErrClosed)
				require.NoError(t, r.c[1-from].Close())
			})
			for _, tc := range []struct {
				name  string
				pulls []bool // the link's moves before the abort
			}{
				{"fallback", []bool{true}},
				{"back", []bool{true, false}},
			} {
				t.Run(tc.name, func(t *testing.T) {
					r := newDirectRig(t)
					for _, down := range tc.pulls {
						r.pull(t, down)
					}
					check := readsReset(t, r.c[1-from])
					_, err := r.c[from].Write([]byte(words))
					require.NoError(t, err)
					require.NoError(t, r.c[from].Abort())
					check(words)
					require.NoError(t, r.c[1-from].Close())
				})
			}
		})
	}
	// The dialing side aborts while it moves the stream to the fallback,
	// its direct connection paused: the move finds the connection closed
	// once it has sent again on the fallback what the peer lacks, and
	// ends the fallback as the stream ended.
	t.Run("side0/moving", func(t *testing.T) {
		r := newDirectRig(t)
		d := r.c[0].d
		d.moveMu.Lock() // toFallback reads the hook under it
		dial := d.dialFallback
		d.dialFallback = func(ctx context.Context) (*transport.Conn, Route, error) {
			if err := r.c[0].Abort(); err != nil {
				t.Errorf("abort: %v", err)
			}
			return dial(ctx)
		}
		d.moveMu.Unlock()
		check := readsReset(t, r.c[1])
		_, err := r.c[0].Write([]byte(words))
		require.NoError(t, err)
		r.tell(t, appproto.LeaseLinkDown)
		check(words)
		require.NoError(t, r.c[1].Close())
	})
	// The accepting side aborts while its direct connection is paused: the
	// dialing side's moves find it closed, and the abort reaches the peer
	// on the direct connection once the link is back (the connection
	// lingers on it for the peer's end).
	t.Run("side1/paused", func(t *testing.T) {
		r := newDirectRig(t)
		d := r.c[0].d
		var once sync.Once
		d.moveMu.Lock()
		dial := d.dialFallback
		d.dialFallback = func(ctx context.Context) (*transport.Conn, Route, error) {
			once.Do(func() {
				if err := r.c[1].Abort(); err != nil {
					t.Errorf("abort: %v", err)
				}
			})
			return dial(ctx)
		}
		d.moveMu.Unlock()
		check := readsReset(t, r.c[0])
		_, err := r.c[1].Write([]byte(words))
		require.NoError(t, err)
		r.tell(t, appproto.LeaseLinkDown)
		waitfor.True(t, "side 0's moves refused", func() bool { return r.dialed.Load() == 3 })
		r.tell(t, appproto.LeaseLinkUp)
		check(words)
		require.Zero(t, r.moved.Load(), "no move to the fallback")
		require.NoError(t, r.c[0].Close())
	})
}

// TestDirectAbortMovingBack: an abort that comes while side 0 moves the
// stream from the fallback back to the direct link still reaches the peer
// as a reset after the bytes written before it, from either side and at
// either step of the move: once the link is dialed (the move then finds
// the connection closed and leaves the stream on the fallback, which the
// abort reset) or once the back mark is on the fallback (the peer reads on
// to the new direct connection, which the move resets).
func TestDirectAbortMovingBack(t *testing.T) {
	const words = "last words"
	for _, marked := range []bool{false, true} {
		for from := range 2 {
			t.Run(fmt.Sprintf("marked=%v/side%d", marked, from), func(t *testing.T) {
				r := newDirectRig(t)
				r.pull(t, true)
				check := readsReset(t, r.c[1-from])
				_, err := r.c[from].Write([]byte(words))
				require.NoError(t, err)
				var aborted atomic.Bool
				d := r.c[0].d
				d.moveMu.Lock()
				d.backStep = func(m bool) {
					if m == marked && aborted.CompareAndSwap(false, true) {
						if err := r.c[from].Abort(); err != nil {
							t.Errorf("abort: %v", err)
						}
					}
				}
				d.moveMu.Unlock()
				r.tell(t, appproto.LeaseLinkUp)
				check(words)
				require.True(t, aborted.Load(), "the move back reached the step")
				require.NoError(t, r.c[1-from].Close())
			})
		}
	}
}

// TestDirectMoveFailResets: a move to the fallback that fails on either
// side once that side has sent on the fallback what its peer lacked ends
// the connection with a reset at both ends, never an end of stream the
// peer would take for the stream's whole: the peer reads the bytes
// written before, then ECONNRESET, and so does the side that failed.
func TestDirectMoveFailResets(t *testing.T) {
	const words = "last words"
	for failing := range 2 {
		t.Run(fmt.Sprintf("side%d", failing), func(t *testing.T) {
			r := newDirectRig(t)
			d := r.c[failing].d
			d.moveMu.Lock()
			d.installStep = func() error { return errors.New("injected") }
			d.moveMu.Unlock()
			check := readsReset(t, r.c[1-failing])
			_, err := r.c[failing].Write([]byte(words))
			require.NoError(t, err)
			r.tell(t, appproto.LeaseLinkDown)
			check(words)
			_, err = r.c[failing].Read(make([]byte, 1))
			require.ErrorIs(t, err, syscall.ECONNRESET, "the failing side's Read")
			require.NoError(t, r.c[0].Close())
			require.NoError(t, r.c[1].Close())
		})
	}
}

// enginePair returns two engine endpoints over an in-memory link, closed
// with the test: the rigs' stand-in for the memory links to ntproxy.
func enginePair(t *testing.T) (ma, mb *transport.Endpoint) {
	da, db := ntbtest.NewPair(1 << 20)
	ma, err := transport.Attach(da, transport.Config{})
	require.NoError(t, err)
	mb, err = transport.Attach(db, transport.Config{})
	require.NoError(t, err)
	t.Cleanup(func() {
		ma.Close()
		mb.Close()
		da.Close()
		db.Close()
	})
	return ma, mb
}
