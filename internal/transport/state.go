package transport

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/ntstack/ntstack/internal/prim/credit"
	"github.com/ntstack/ntstack/partition"
)

// state is the endpoint's side of one session: its units, its connection
// table and the queue of frames that belong to no connection.
type state struct {
	ep      *Endpoint
	sess    *partition.Session
	parts   []*partition.Partition // data partitions, by index
	control *partition.Partition   // the control ring: CREDIT only
	units   []*unit
	conns   []atomic.Pointer[Conn] // by local id; nil = free

	nextUnit atomic.Uint32 // round-robin placement
	live     atomic.Int32  // connections holding an id
	bulk     periodCount   // connections that received bulk records lately (see share)
	bulkLast atomic.Int64  // the last period bulk counts a connection in
	rxRings  int64         // bytes of the inbound data rings one class's connections use, together
	window   int64         // each connection's receive window: Config.Window, at most half a ring (see share)
	traffic  []partTraffic // per data partition, what it carries (see Conn.noteData)
	// headWait is, per data partition, ep.now() since when its head record
	// has been left for its reader (0: it is not); guarded by the
	// partition's RX lock.
	headWait []int64
	// headOff is, per data partition, how much of the DATA record at its
	// head a Read has taken so far (0: none; see pollLocked); guarded by
	// the partition's RX lock.
	headOff []int
	// refs is, per data partition, the spans retained by reference that
	// lie in its TX ring (keep.go); guarded by the partition's TX lock.
	refs []ringRefs

	mu sync.Mutex
	// mu protects the following fields.
	free   []uint32 // released ids, oldest first
	nextID uint32   // next never-used id
	ctlq   []ctlFrame

	ctlPending atomic.Bool // len(ctlq) > 0

	workers int          // worker goroutines (CoreShared, CoreSplit)
	asleep  atomic.Int32 // of them, asleep on the doorbell

	turns turns // writers waiting for credit in turns

	finishOnce sync.Once     // the end of the session, acted on (resume.go)
	finished   chan struct{} // closed once finish has acted on it

	// The doorbells are the device's, not a session's, and whoever waits
	// on them clears the bits it finds. The poller (or a worker) of a
	// session that has ended runs on until it sees the end; one that
	// cleared a bit rung for the next session's records would leave that
	// session's poller asleep, armed and already drained, with an OPEN or
	// a RESUME in its rings and nothing to ring again. So a session's
	// doorbell waiters start only once the previous session's have
	// returned (awaitPrev): everything rung before then is in the rings
	// when the new ones first drain them, and after it nobody else
	// clears a bit.
	prevStopped <-chan struct{} // the previous session's stopped, or nil for the first
	waiters     atomic.Int32    // the poller and workers that have not returned
	stopped     chan struct{}   // closed once waiters reaches 0
}

// awaitPrev waits until the previous session's poller and workers have
// returned (see prevStopped). They return as soon as they see their
// session's end, which came before this session began.
func (st *state) awaitPrev() {
	if st.prevStopped != nil {
		<-st.prevStopped
	}
}

// waiterDone records that the poller or a worker has returned: it waits
// on the device's doorbells no more.
func (st *state) waiterDone() {
	if st.waiters.Add(-1) == 0 {
		close(st.stopped)
	}
}

// ctlFrame is a frame waiting for room in its ring.
type ctlFrame struct {
	part  *partition.Partition
	tag   uint32
	local uint32 // loose frames: our connection's id, for taps (0: none)
	n     int
	body  [resumeSize]byte // the largest frame body: RESUME
}

// newConn allocates an id and registers a connection in the table.
func (st *state) newConn(c *Conn) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	var id uint32
	// Fresh ids first, then the longest-free: a late frame for a closed
	// connection (an ACCEPT for a dial given up, a CREDIT) must not find
	// its id already reused by the next connection.
	switch {
	case int(st.nextID) < len(st.conns):
		id = st.nextID
		st.nextID++
	case len(st.free) > 0:
		id = st.free[0]
		st.free = st.free[1:]
	default:
		return fmt.Errorf("%d connections open: %w", len(st.conns)-1, syscall.EMFILE)
	}
	c.id = id
	c.stp.Store(st)
	c.gen = st.ep.nextGen.Add(1)
	st.conns[id].Store(c)
	st.live.Add(1)
	return nil
}

// share is the receive window a connection grants its peer now: the
// configured window, or less — half the inbound rings split evenly among
// the bulk connections — when there are so many that their windows
// together would fill the rings. A full ring stalls every connection
// behind it (their writers spin or park on ring space, the reader copies
// into queues that outgrow the caches); a withheld credit stalls only its
// own connection. With Config.QoS the connections of a class share one partition
// per unit, so only those rings count: two class-7 streams over 8 QoS
// partitions (1 MiB rings) otherwise kept their partition's ring full.
//
// The bulk connections are those that received a record of more than
// smallWrite lately (st.bulk, two periods of smallRecent), and those
// waiting in line for a turn, which receive nothing meanwhile; at most
// the live ones, at least one. Idle connections, and those carrying small
// messages only, hold no share: split over every live connection, a
// stream beside idle ones would get a fraction of the rings it could use.
// The credit an idle connection was granted before stays granted
// (credit is never recalled): should it and the others all send at once,
// the rings hold more than half for a while, and writers wait for room,
// as beyond the turns' pool (see turns.go).
//
// Nor is a window more than half the ring its connection's records land
// in (st.window, which OPEN and ACCEPT announce): a larger one would let
// a connection's writer fill the ring before its first CREDIT, and with
// several partitions and few connections half the rings together would
// fill one.
func (st *state) share() int64 {
	w := st.window
	if live := int64(st.live.Load()); live > 0 {
		n := min(max(st.bulk.recent(st.bulkLast.Load())+int64(st.turns.nwait.Load()), 1), live)
		w = credit.Share(st.rxRings, w, n)
	}
	return w
}

// minShare is the least window share (credit.MinShare).
const minShare = credit.MinShare

// releaseID frees c's id. Only the connection that holds an id frees it:
// a second release (two teardown paths racing) must not free the id of the
// connection that reused it, nor list the id twice.
func (st *state) releaseID(c *Conn) {
	if !st.conns[c.id].CompareAndSwap(c, nil) {
		return
	}
	st.live.Add(-1)
	st.mu.Lock()
	st.free = append(st.free, c.id)
	st.mu.Unlock()
}

func (st *state) lookup(id uint32) *Conn {
	if id == 0 || int(id) >= len(st.conns) {
		return nil
	}
	return st.conns[id].Load()
}

// sendLoose sends a frame that belongs to no connection's stream (REFUSE,
// CREDIT) without blocking: if its ring is full it is queued, in order,
// and the poller sends it later. local is our connection's id (0: none),
// for taps.
func (st *state) sendLoose(p *partition.Partition, kind, id, local uint32, body []byte) {
	if !st.ctlPending.Load() && p.TrySend(makeTag(kind, id), body, nil) == nil {
		if ts := st.ep.taps.Load(); ts != nil {
			ts.emit(st, TapTX, p.Index, makeTag(kind, id), local, body)
		}
		return
	}
	f := ctlFrame{part: p, tag: makeTag(kind, id), local: local, n: len(body)}
	copy(f.body[:], body)
	st.mu.Lock()
	st.ctlq = append(st.ctlq, f)
	st.ctlPending.Store(true)
	st.mu.Unlock()
	if !st.flushCtl() {
		st.ep.kickPoller()
	}
}

// flushCtl sends queued loose frames; it reports whether the queue is
// empty.
func (st *state) flushCtl() bool {
	if !st.ctlPending.Load() {
		return true
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	sent := 0
	for _, f := range st.ctlq {
		if err := f.part.TrySend(f.tag, f.body[:f.n], nil); err != nil {
			break
		}
		if ts := st.ep.taps.Load(); ts != nil {
			ts.emit(st, TapTX, f.part.Index, f.tag, f.local, f.body[:f.n])
		}
		sent++
	}
	st.ctlq = st.ctlq[:copy(st.ctlq, st.ctlq[sent:])]
	st.ctlPending.Store(len(st.ctlq) > 0)
	return len(st.ctlq) == 0
}

// serveUnits serves every unit that has queued connections and nobody
// serving it (CoreInline: whoever passes by sends for everyone). It
// reports whether it sent anything.
func (st *state) serveUnits() bool {
	progress := false
	for _, u := range st.units {
		if p, _, _ := u.tryServe(nil); p {
			progress = true
		}
	}
	return progress
}

// armCtl arms the space doorbell of the ring the first queued loose frame
// waits for and reports whether room for it appeared meanwhile. Loose
// frames go on the control ring (CREDIT, WANT) and on data partitions
// (CLOSE, REFUSE, RESET), sent in order (flushCtl), so the head's ring is
// the one that holds the queue up: the control ring's room says nothing
// of a full data partition's.
func (st *state) armCtl() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.ctlq) == 0 {
		return true // flushed meanwhile
	}
	f := &st.ctlq[0]
	return f.part.ArmSpace(max(f.n, 64))
}

// dispatchControl acts on one frame of the control ring.
func (st *state) dispatchControl(kind, id uint32, payload []byte) error {
	if kind == kindWant {
		m, err := decodeWant(payload)
		if err != nil {
			return err
		}
		c := st.lookup(id)
		if c == nil || c.gen != m.gen {
			return nil // stale, as CREDIT
		}
		return st.want(c, m)
	}
	if kind != kindCredit {
		return fmt.Errorf("frame kind %d on the control ring", kind)
	}
	m, err := decodeCredit(payload)
	if err != nil {
		return err
	}
	c := st.lookup(id)
	if c == nil || c.gen != m.gen {
		return nil // stale: for a connection closed since (see frame.go)
	}
	return c.credit(m)
}

// dispatch acts on one frame from data partition part (RX lock held). An
// error is a protocol violation; it fails the session.
func (st *state) dispatch(part int, kind, id uint32, payload []byte) error {
	switch kind {
	case kindResume:
		return st.resume(part, id, payload)
	case kindReset:
		return st.reset(id, payload)
	}
	if kind == kindOpen {
		m, err := decodeOpen(payload)
		if err != nil {
			return err
		}
		st.accept(part, id, m)
		return nil
	}
	c := st.lookup(id)
	if c == nil {
		if id == 0 || int(id) >= len(st.conns) {
			return fmt.Errorf("frame kind %d for connection %d, outside the table", kind, id)
		}
		// A frame for a connection that has ended — the peer sent it
		// before learning that, as with a dial given up while its ACCEPT
		// was in flight. It concerns no live connection: drop it (an
		// ACCEPT is answered with CLOSE, so its sender does not wait for
		// a dialer that is gone), and keep the session for the others.
		st.ep.counters.staleFrames.Add(1)
		if kind == kindAccept {
			if m, err := decodeAccept(payload); err == nil {
				st.sendLoose(st.parts[part], kindClose, m.id, 0, nil)
			}
		}
		return nil
	}
	return c.deliver(part, kind, payload)
}

// accept handles OPEN: a connection is established as soon as a listener
// has room for it in its backlog, as with TCP.
func (st *state) accept(part int, peerID uint32, m openMsg) {
	refuse := func(code uint32) { st.sendLoose(st.parts[part], kindRefuse, peerID, 0, le32(code)) }
	st.ep.mu.Lock()
	ln := st.ep.listeners[m.port]
	st.ep.mu.Unlock()
	if ln == nil {
		refuse(refuseNoListener)
		return
	}
	c := newConn(st.ep, ln.addr, Addr{Host: st.ep.peerHost(), Port: int(peerID)})
	c.peerID, c.window, c.peerGen, c.nonce = peerID, int64(m.window), m.gen, m.nonce
	c.state = connEstablished
	c.rxPart.Store(int32(part))
	c.prio.Store(uint32(ln.Priority()))
	if err := st.ep.quota.Acquire(st.window); err != nil {
		refuse(refuseQuota)
		return
	}
	if err := st.newConn(c); err != nil {
		st.ep.quota.Release(st.window)
		refuse(refuseNoIDs)
		return
	}
	c.quotaHeld = st.window
	if err := c.placeLocked(); err != nil {
		c.releaseLocal()
		refuse(refusePartitions)
		return
	}
	// ACCEPT is the connection's first frame, queued before the listener
	// hands the connection out: the application's first Write may go into
	// the ring at once (sendNow), and the dialer takes nothing of the
	// connection before its ACCEPT. It is posted once offered, so a full
	// backlog withdraws it unsent.
	f := ctlFrame{tag: makeTag(kindAccept, peerID)}
	f.n = len(acceptMsg{id: c.id, window: uint32(st.window), gen: c.gen, dialGen: m.gen}.encode(f.body[:0]))
	c.smu.Lock()
	c.frames = append(c.frames, f)
	c.smu.Unlock()
	if !ln.offer(c) {
		c.smu.Lock()
		c.frames = nil
		c.smu.Unlock()
		c.releaseLocal()
		refuse(refuseBacklog)
		return
	}
	if h := acceptOffered.Load(); h != nil {
		(*h)(c)
	}
	c.smu.Lock()
	c.unit.postLocked(c)
	c.smu.Unlock()
	if st.ep.cfg.CoreModel == CoreInline {
		st.serveUnits() // full rings: the poller serves on ring space
	}
}

// acceptOffered, if set, runs when accept has handed a connection to its
// listener, before its ACCEPT is posted: tests use it to let the
// application act on the connection first.
var acceptOffered atomic.Pointer[func(*Conn)]

func le32(v uint32) []byte { return []byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)} }
