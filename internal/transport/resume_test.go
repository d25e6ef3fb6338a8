package transport

import (
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

	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/ntbtest"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/partition"
)

// liveDev is an ntbtest device that reports liveness as the test sets it
// (ntb.Liveness).
type liveDev struct {
	*ntbtest.Device
	suspect atomic.Bool
	cause   atomic.Int32
}

var _ ntb.Liveness = (*liveDev)(nil)

func (d *liveDev) Suspect() bool { return d.suspect.Load() }

func (d *liveDev) LinkCause() ntb.Cause {
	if d.Link() == ntb.LinkUp {
		return ntb.CauseNone
	}
	return ntb.Cause(d.cause.Load())
}

func livePair(t *testing.T) (*liveDev, *liveDev) {
	a, b := ntbtest.NewPair(1 << 20)
	t.Cleanup(func() { a.Close(); b.Close() })
	return &liveDev{Device: a}, &liveDev{Device: b}
}

// logWatch is a Logf that also tells when a line containing want is
// logged.
type logWatch struct {
	t    testing.TB
	mu   sync.Mutex
	seen []string
}

func (l *logWatch) logf(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	l.mu.Lock()
	l.seen = append(l.seen, line)
	l.mu.Unlock()
	l.t.Log(line)
}

func (l *logWatch) count(want string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.seen {
		if strings.Contains(s, want) {
			n++
		}
	}
	return n
}

// flow is one direction of a checksummed transfer over a connection.
type flow struct {
	data []byte
	read atomic.Int64
	sum  [32]byte
	err  error
}

// xfer streams size seeded random bytes each way over each of conns
// connection pairs, in writes of random sizes, and returns the flows once
// started. wait ends them and checks every byte arrived, in order, once.
func xfer(t *testing.T, pairs [][2]*Conn, size int) (flows []*flow, wait func()) {
	var wg sync.WaitGroup
	for i, p := range pairs {
		for dir := range 2 {
			src, dst := p[dir], p[1-dir]
			rng := rand.New(rand.NewPCG(uint64(i), uint64(dir)))
			f := &flow{data: make([]byte, size)}
			for k := range f.data {
				f.data[k] = byte(rng.Uint32())
			}
			flows = append(flows, f)
			wg.Add(2)
			go func() {
				defer wg.Done()
				for off := 0; off < size; {
					n := min(size-off, 1+rng.IntN(100<<10))
					if _, err := src.Write(f.data[off : off+n]); err != nil {
						t.Errorf("write: %v", err)
						return
					}
					off += n
				}
			}()
			go func() {
				defer wg.Done()
				h := sha256.New()
				buf := make([]byte, 48<<10)
				for f.read.Load() < int64(size) {
					n, err := dst.Read(buf[:min(len(buf), size-int(f.read.Load()))])
					h.Write(buf[:n])
					f.read.Add(int64(n))
					if err != nil {
						f.err = err
						return
					}
				}
				copy(f.sum[:], h.Sum(nil))
			}()
		}
	}
	return flows, func() {
		wg.Wait()
		for i, f := range flows {
			require.NoError(t, f.err, "flow %d", i)
			require.Equal(t, sha256.Sum256(f.data), f.sum, "flow %d: bytes lost, duplicated or reordered", i)
		}
	}
}

// readPast waits until every flow has read at least n bytes.
func readPast(t *testing.T, flows []*flow, n int64) {
	require.Eventually(t, func() bool {
		for _, f := range flows {
			if f.read.Load() < n && f.err == nil {
				return false
			}
		}
		return true
	}, 30*time.Second, time.Millisecond, "every flow should pass %d bytes", n)
}

func pairsOf(t *testing.T, a, b *Endpoint, n, port int) [][2]*Conn {
	var ps [][2]*Conn
	for i := range n {
		c1, c2 := connPair(t, a, b, port+i)
		t.Cleanup(func() { c1.Close(); c2.Close() })
		ps = append(ps, [2]*Conn{c1, c2})
	}
	return ps
}

func epoch(ep *Endpoint) uint32 {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.cur == nil {
		return 0
	}
	return ep.cur.sess.Epoch
}

// newEpoch waits for ep's session to be another than old, and returns its
// epoch.
func newEpoch(t *testing.T, ep *Endpoint, old uint32) uint32 {
	var e uint32
	require.Eventually(t, func() bool {
		e = epoch(ep)
		return e != 0 && e != old
	}, 30*time.Second, time.Millisecond, "a new session")
	return e
}

// resumed waits for n resumptions on each of a and b.
func resumed(t *testing.T, a, b *Endpoint, n int64) {
	require.Eventually(t, func() bool {
		return a.Stats().Resumptions >= n && b.Stats().Resumptions >= n
	}, 30*time.Second, time.Millisecond, "%d resumptions on each end", n)
}

// restart fails the current session of ep as the link does when its peer
// starts a new one: both ends begin a new session.
func restart(ep *Endpoint) {
	ep.mu.Lock()
	st := ep.cur
	ep.mu.Unlock()
	if st != nil {
		st.sess.Fail(fmt.Errorf("test: %w", partition.ErrPeerRestarted))
	}
}

// A call parked with a deadline when its session ends sleeps until the
// end has been acted on (the connection paused), rather than find its
// session's channel closed at every park and spin meanwhile; then it
// resumes on the next session and reads what comes there.
func TestParkedReadWaitsForSessionFinish(t *testing.T) {
	a, b := endpoints(t, "ntbtest", Config{})
	c1, c2 := connPair(t, a, b, 9)
	defer c1.Close()
	defer c2.Close()
	st := c2.st()
	st.turns.mu.Lock() // finish takes it first: it waits until the check below
	locked := true
	defer func() {
		if locked {
			st.turns.mu.Unlock()
		}
	}()
	require.NoError(t, c2.SetReadDeadline(time.Now().Add(time.Minute)))
	got := make(chan error, 1)
	go func() {
		buf := make([]byte, 1)
		_, err := io.ReadFull(c2, buf)
		if err == nil && buf[0] != 'x' {
			err = fmt.Errorf("read %q, want x", buf)
		}
		got <- err
	}()
	require.Eventually(t, func() bool { return c2.sleepers.Load() > 0 }, 30*time.Second, time.Millisecond, "the Read parked")
	st.sess.Fail(fmt.Errorf("test: %w", partition.ErrPeerRestarted))
	<-st.sess.Done()
	select {
	case <-c2.sessionDone():
		t.Fatal("a parked call's session channel is closed before the session's end was acted on")
	default:
	}
	st.turns.mu.Unlock()
	locked = false
	<-st.finished
	_, err := c1.Write([]byte("x"))
	require.NoError(t, err)
	require.NoError(t, <-got)
}

// A session restarted twice mid-stream: 1.5 MiB each way over four
// connections arrives byte-exact on the same Conns.
func TestResumeSessionRestart(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		lw := &logWatch{t: t}
		a, b := endpoints(t, backend, Config{Partitions: 2, Logf: lw.logf})
		pairs := pairsOf(t, a, b, 4, 100)
		const size = 3 << 19
		flows, wait := xfer(t, pairs, size)
		readPast(t, flows, size/4)
		first := epoch(a)
		restart(b) // the follower's: the leader sees a new hello
		second := newEpoch(t, a, first)
		resumed(t, a, b, 4)
		readPast(t, flows, size/2)
		restart(a) // the leader's
		newEpoch(t, a, second)
		wait()
		// Connections whose flows were done resume too, once a poll
		// reads their RESUME.
		resumed(t, a, b, 8)
		require.Zero(t, a.Stats().Resets+b.Stats().Resets)
		require.GreaterOrEqual(t, lw.count("resumed on session"), 16, "a log line a resumption")
	})
}

// The worker core models resume as the inline one does.
func TestResumeWorkers(t *testing.T) {
	for _, m := range []CoreModel{CoreShared, CoreSplit} {
		t.Run(m.String(), func(t *testing.T) {
			a, b := endpoints(t, "ntbtest", Config{CoreModel: m, Partitions: 2})
			pairs := pairsOf(t, a, b, 2, 700)
			const size = 1 << 20
			flows, wait := xfer(t, pairs, size)
			readPast(t, flows, size/4)
			first := epoch(a)
			restart(b)
			newEpoch(t, a, first)
			wait()
			resumed(t, a, b, 2)
		})
	}
}

// A link forced down for a while mid-stream, then up: the transfer
// completes byte-exact on the same Conns.
func TestResumeLinkFlap(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		da, db := backends[backend](t)
		a, b := attachPair(t, da, db, Config{})
		pairs := pairsOf(t, a, b, 3, 200)
		const size = 3 << 19
		flows, wait := xfer(t, pairs, size)
		readPast(t, flows, size/3)
		down, up := func() { da.(*ntbtest.Device).SetLink(ntb.LinkDown, "test pull") }, func() { da.(*ntbtest.Device).SetLink(ntb.LinkUp, "test") }
		if backend == "shm" {
			down, up = da.(*shm.Device).ForceLinkDown, da.(*shm.Device).ForceLinkUp
		}
		down()
		require.Eventually(t, func() bool { return epoch(a) == 0 && epoch(b) == 0 }, 30*time.Second, time.Millisecond,
			"both ends should see the link down")
		for i, f := range flows {
			require.NoError(t, f.err, "flow %d failed while the link was down", i)
		}
		up()
		wait()
		resumed(t, a, b, 3)
	})
}

// A link whose peer is suspect keeps its session and its connections; a
// transfer across the suspicion completes.
func TestResumeSuspectPauses(t *testing.T) {
	da, db := livePair(t)
	lw := &logWatch{t: t}
	a, b := attachPair(t, da, db, Config{UserTimeout: 20 * time.Second, Logf: lw.logf})
	pairs := pairsOf(t, a, b, 2, 300)
	first := epoch(a)
	da.suspect.Store(true)
	db.suspect.Store(true)
	require.Eventually(t, func() bool { return lw.count("peer suspect") >= 2 }, 30*time.Second, time.Millisecond,
		"both ends should notice the suspicion")
	flows, wait := xfer(t, pairs, 1<<20)
	readPast(t, flows, 1<<18)
	da.suspect.Store(false)
	db.suspect.Store(false)
	wait()
	require.Equal(t, first, epoch(a), "the session survives a suspicion")
	require.Zero(t, a.Stats().Resumptions)
}

// blocked starts a Read and a Write on c1 that cannot complete (its peer
// c2 writes and reads nothing: the window fills), and returns their
// errors.
func blocked(t *testing.T, c1, c2 *Conn) (readErr, writeErr <-chan error) {
	re, we := make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := c1.Read(make([]byte, 10))
		re <- err
	}()
	go func() {
		_, err := c1.Write(make([]byte, 64<<20))
		we <- err
	}()
	require.Eventually(t, func() bool {
		return c1.inRead.Load() && c1.ep.Stats().CreditWaits > 0
	}, 30*time.Second, time.Millisecond, "the Read and the Write should block")
	return re, we
}

func waitErr(t *testing.T, ch <-chan error, what string) error {
	select {
	case err := <-ch:
		require.Error(t, err, what)
		var op *net.OpError
		require.ErrorAs(t, err, &op, "%s: a *net.OpError", what)
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not fail", what)
		return nil
	}
}

// A peer gone (its process exited) or closed fails blocked calls with
// ECONNRESET, the message naming the cause; ErrLinkDown still matches.
func TestResumePeerGoneResets(t *testing.T) {
	for _, tc := range []struct {
		cause ntb.Cause
		why   string
	}{{ntb.CauseGone, "connection reset by peer: peer process exited"}, {ntb.CauseClosed, "connection reset by peer: peer endpoint closed"}} {
		t.Run(tc.cause.String(), func(t *testing.T) {
			da, db := livePair(t)
			a, b := attachPair(t, da, db, Config{})
			c1, c2 := connPair(t, a, b, 400)
			re, we := blocked(t, c1, c2)
			da.cause.Store(int32(tc.cause))
			db.cause.Store(int32(tc.cause))
			da.SetLink(ntb.LinkDown, "peer "+tc.cause.String())
			for _, e := range []struct {
				ch   <-chan error
				what string
			}{{re, "read"}, {we, "write"}} {
				err := waitErr(t, e.ch, e.what)
				require.ErrorIs(t, err, syscall.ECONNRESET, e.what)
				require.ErrorIs(t, err, ErrLinkDown, e.what)
				require.Contains(t, err.Error(), tc.why, e.what)
			}
			_, err := c1.Write([]byte("x"))
			require.ErrorIs(t, err, syscall.ECONNRESET, "a later write")
		})
	}
}

// A peer that stays unreachable past the user timeout — a link down that
// does not come back, a suspicion that does not end — fails blocked
// calls with ETIMEDOUT.
func TestResumeUserTimeout(t *testing.T) {
	for _, mode := range []string{"down", "suspect"} {
		t.Run(mode, func(t *testing.T) {
			da, db := livePair(t)
			a, b := attachPair(t, da, db, Config{UserTimeout: 200 * time.Millisecond})
			c1, c2 := connPair(t, a, b, 500)
			re, we := blocked(t, c1, c2)
			if mode == "down" {
				da.SetLink(ntb.LinkDown, "test pull")
			} else {
				da.suspect.Store(true) // a suspects b (b, which a then leaves, sees a restart)
			}
			for _, e := range []struct {
				ch   <-chan error
				what string
			}{{re, "read"}, {we, "write"}} {
				err := waitErr(t, e.ch, e.what)
				require.ErrorIs(t, err, syscall.ETIMEDOUT, e.what)
				require.ErrorIs(t, err, ErrLinkDown, e.what)
				var ne interface{ Timeout() bool }
				require.True(t, errors.As(err, &ne) && ne.Timeout(), "%s: a timeout", e.what)
			}
		})
	}
}

// A peer that lost its connections (a new process on the same link)
// answers their RESUME with RESET: they fail with ECONNRESET.
func TestResumeUnknownPeerResets(t *testing.T) {
	da, db := livePair(t)
	a, b := attachPair(t, da, db, Config{})
	c1, _ := connPair(t, a, b, 600)
	errc := make(chan error, 1)
	go func() {
		_, err := c1.Read(make([]byte, 10))
		errc <- err
	}()
	require.Eventually(t, func() bool { return c1.inRead.Load() }, 30*time.Second, time.Millisecond)
	// b forgets every connection, as a restarted process would.
	b.mu.Lock()
	st := b.cur
	b.mu.Unlock()
	for i := range st.conns {
		if c := st.conns[i].Load(); c != nil {
			c.nonce = 0
		}
	}
	restart(b)
	err := waitErr(t, errc, "read")
	require.ErrorIs(t, err, syscall.ECONNRESET)
	require.Contains(t, err.Error(), "peer has no such connection")
}

// Retained by copy, the ring keeps exactly the bytes between the peer's
// acknowledgement and what was sent, across growth and wrap.
func TestKeepRing(t *testing.T) {
	var r retention
	rng := rand.New(rand.NewPCG(1, 2))
	var stream []byte
	var sent, ack int64
	for range 2000 {
		n := 1 + rng.IntN(9000)
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		stream = append(stream, b...)
		r.add(sent, b, ack)
		sent += int64(n)
		// The peer acknowledges some, keeping at most 64 KiB in flight.
		ack = max(ack, sent-int64(rng.IntN(64<<10)))
		require.True(t, r.holds(ack, sent))
		for o := ack; o < sent; {
			kept := r.bytesAt(o, sent)
			require.NotEmpty(t, kept, "byte %d not retained", o)
			if string(kept) != string(stream[o:o+int64(len(kept))]) {
				t.Fatalf("bytes from %d lost (kept %d..%d in %d)", o, ack, sent, r.size())
			}
			o += int64(len(kept))
		}
	}
	require.LessOrEqual(t, r.size(), 128<<10, "retention grows to the bytes in flight, rounded up")
}

// FIN and CLOSE keep their place behind the bytes sent again: a stream
// half-closed across a restart ends with io.EOF after its last byte.
func TestResumeFinAndClose(t *testing.T) {
	a, b := endpoints(t, "ntbtest", Config{})
	c1, c2 := connPair(t, a, b, 800)
	data := make([]byte, 3<<19)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	werr := make(chan error, 1)
	go func() {
		_, err := c1.Write(data)
		if err == nil {
			err = c1.CloseWrite()
		}
		werr <- err
	}()
	got := make([]byte, 0, len(data))
	buf := make([]byte, 32<<10)
	restarted := false
	for {
		n, err := c2.Read(buf)
		got = append(got, buf[:n]...)
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		if !restarted && len(got) >= len(data)/3 {
			first := epoch(a)
			restart(b)
			newEpoch(t, a, first)
			restarted = true
		}
	}
	require.NoError(t, <-werr)
	require.Equal(t, sha256.Sum256(data), sha256.Sum256(got), "bytes lost, duplicated or reordered")
	// The other way: a reply, then CLOSE, across a second restart.
	_, err := c2.Write([]byte("done"))
	require.NoError(t, err)
	require.NoError(t, c2.Close())
	second := epoch(a)
	restart(a)
	newEpoch(t, a, second)
	reply, err := io.ReadAll(c1)
	require.NoError(t, err)
	require.Equal(t, "done", string(reply))
}

// The fake device's own liveness (ntbtest): a killed peer and a closed one
// reset, a silent one pauses until heard again, then resumes nothing
// (the session never ended), and one silent past its timeout times out.
func TestResumeNtbtestLiveness(t *testing.T) {
	for _, tc := range []struct {
		name  string
		act   func(peer *ntbtest.Device)
		errno syscall.Errno
		why   string
	}{
		{"kill", (*ntbtest.Device).Kill, syscall.ECONNRESET, "peer process exited"},
		{"close", func(d *ntbtest.Device) { d.Close() }, syscall.ECONNRESET, "peer endpoint closed"},
		{"silence-expired", func(d *ntbtest.Device) { d.SilenceHeartbeat(true); d.ExpireSilence() }, syscall.ETIMEDOUT, "peer silent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			da, db := ntbtest.NewPair(1 << 20)
			t.Cleanup(func() { da.Close(); db.Close() })
			a, b := attachPair(t, da, db, Config{})
			c1, c2 := connPair(t, a, b, 900)
			re, we := blocked(t, c1, c2)
			tc.act(db)
			for _, e := range []struct {
				ch   <-chan error
				what string
			}{{re, "read"}, {we, "write"}} {
				err := waitErr(t, e.ch, e.what)
				require.ErrorIs(t, err, tc.errno, e.what)
				require.ErrorIs(t, err, ErrLinkDown, e.what)
				require.Contains(t, err.Error(), tc.why, e.what)
			}
		})
	}
	t.Run("silence", func(t *testing.T) {
		da, db := ntbtest.NewPair(1 << 20)
		t.Cleanup(func() { da.Close(); db.Close() })
		a, b := attachPair(t, da, db, Config{})
		pairs := pairsOf(t, a, b, 2, 950)
		first := epoch(a)
		db.SilenceHeartbeat(true)
		require.True(t, da.Suspect())
		flows, wait := xfer(t, pairs, 1<<20)
		readPast(t, flows, 1<<18)
		db.SilenceHeartbeat(false)
		wait()
		require.Equal(t, first, epoch(a), "a suspicion ends no session")
	})
}

// A connection closed at this end whose peer answered with CLOSE and
// freed it, the answer lost in the old rings: across a restart the
// peer's RESET for it is that orderly end (the peer frees a connection
// only once both CLOSEs have passed at its end), not a reset.
func TestResumeLostCloseEndsOrderly(t *testing.T) {
	a, b := endpoints(t, "ntbtest", Config{})
	ca, cb := connPair(t, a, b, 900)
	_, err := ca.Write([]byte("last words"))
	require.NoError(t, err)
	// Nothing at a consumes a frame from the rings until its session has
	// ended: b's answering CLOSE stays in them.
	a.mu.Lock()
	old := a.cur
	a.mu.Unlock()
	rings := append(old.parts[:len(old.parts):len(old.parts)], old.control)
	for _, p := range rings {
		p.LockRX()
	}
	locked := true
	unlock := func() {
		if locked {
			for _, p := range rings {
				p.UnlockRX()
			}
			locked = false
		}
	}
	defer unlock()
	require.NoError(t, ca.Close())
	got, err := io.ReadAll(cb)
	require.NoError(t, err, "b reads a's bytes, then io.EOF")
	require.Equal(t, "last words", string(got))
	require.Eventually(t, func() bool {
		cb.mu.Lock()
		defer cb.mu.Unlock()
		return cb.idFreed
	}, 30*time.Second, time.Millisecond, "b answers a's CLOSE and frees the connection")
	restart(b)
	require.Eventually(t, func() bool { return old.sess.Err() != nil }, 30*time.Second, time.Millisecond,
		"a's session ends with b's restart")
	unlock()
	newEpoch(t, a, old.sess.Epoch)
	require.Eventually(t, ca.Ended, 30*time.Second, time.Millisecond, "a's connection ends once b answers its RESUME")
	require.NoError(t, ca.failure(), "the peer ended the connection orderly")
	ca.mu.Lock()
	freed := ca.idFreed
	ca.mu.Unlock()
	require.True(t, freed, "a frees the connection's id")
	require.Zero(t, ca.pausedAt.Load(), "nothing waits to resume")
	_, err = ca.Read(make([]byte, 1))
	require.ErrorIs(t, err, net.ErrClosed, "a closed connection reads net.ErrClosed, as ever")
}

// An aborted connection whose CLOSE is lost with the old rings sends it
// again on the next session as the abort it was: the peer reads what
// came before, then ECONNRESET, not io.EOF.
func TestResumeLostAbortResets(t *testing.T) {
	a, b := endpoints(t, "ntbtest", Config{})
	ca, cb := connPair(t, a, b, 910)
	// Nothing at b consumes a frame from the rings until its session has
	// ended: a's bytes and its aborting CLOSE stay in them.
	b.mu.Lock()
	old := b.cur
	b.mu.Unlock()
	rings := append(old.parts[:len(old.parts):len(old.parts)], old.control)
	for _, p := range rings {
		p.LockRX()
	}
	locked := true
	unlock := func() {
		if locked {
			for _, p := range rings {
				p.UnlockRX()
			}
			locked = false
		}
	}
	defer unlock()
	_, err := ca.Write([]byte("last words"))
	require.NoError(t, err)
	require.NoError(t, ca.Abort())
	require.Eventually(t, func() bool {
		ca.smu.Lock()
		defer ca.smu.Unlock()
		return len(ca.frames) == 0 && len(ca.after) == 0
	}, 30*time.Second, time.Millisecond, "a's CLOSE has gone into the rings")
	restart(a)
	require.Eventually(t, func() bool { return old.sess.Err() != nil }, 30*time.Second, time.Millisecond,
		"b's session ends with a's restart")
	unlock()
	newEpoch(t, b, old.sess.Epoch)
	got, err := io.ReadAll(cb)
	require.Equal(t, "last words", string(got), "b reads a's bytes, sent again")
	require.ErrorIs(t, err, syscall.ECONNRESET, "then the abort, sent again")
	require.NoError(t, cb.Close())
}

// A CREDIT of an earlier session's connection is stale for a new
// connection given the same id on a new session: incarnations do not
// restart with a session. Here a's session fails on a protocol violation,
// so a's connections fail while b, told only that a started a new
// session, resumes its own and may send CREDIT for it until a's RESET
// arrives. (CI once saw "credit 420444 outside [0, 0]" on a new dial.)
func TestStaleCreditAcrossSessions(t *testing.T) {
	da, db := livePair(t)
	a, b := attachPair(t, da, db, Config{})
	c1, _ := connPair(t, a, b, 610)
	id, gen := c1.id, c1.gen
	first := epoch(a)
	a.mu.Lock()
	st := a.cur
	a.mu.Unlock()
	st.sess.Fail(errors.New("test: protocol violation from peer"))
	newEpoch(t, a, first)
	c3, c4 := connPair(t, a, b, 611)
	require.Equal(t, id, c3.id, "the new session hands out the same id")
	require.NotEqual(t, gen, c3.gen)
	a.mu.Lock()
	st = a.cur
	a.mu.Unlock()
	stale := creditMsg{consumed: 420444, gen: gen, floor: DefaultMTU}
	require.NoError(t, st.dispatchControl(kindCredit, id, stale.encode(nil)))
	require.NoError(t, transfer(c3, c4, 1<<20, 1), "the new connection carries on")
}
