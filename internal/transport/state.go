package transport

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

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
	nextGen  atomic.Uint32 // connection incarnations
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

	mu sync.Mutex
	// mu protects the following fields.
	free   []uint32 // released ids, oldest first
	nextID uint32   // next never-used id
	ctlq   []ctlFrame

	ctlPending atomic.Bool // len(ctlq) > 0

	workers int          // worker goroutines (CoreShared, CoreSplit)
	asleep  atomic.Int32 // of them, asleep on the doorbell

	turns turns // writers waiting for credit in turns
}

// ctlFrame is a frame waiting for room in its ring.
type ctlFrame struct {
	part  *partition.Partition
	tag   uint32
	local uint32 // loose frames: our connection's id, for taps (0: none)
	n     int
	body  [16]byte // the largest frame body: ACCEPT
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
	c.st = st
	c.gen = st.nextGen.Add(1)
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
// own connection. Measured with 64 KiB streams on one partition (8 MiB
// ring), this took 32 connections from 2.7 to 7.5 GB/s and 64 from 2.2
// to 7.0. With Config.QoS the connections of a class share one partition
// per unit, so only those rings count: two class-7 streams over 8 QoS
// partitions (1 MiB rings) otherwise kept their partition's ring full.
//
// The bulk connections are those that received a record of more than
// smallWrite lately (st.bulk, two periods of smallRecent), and those
// waiting in line for a turn, which receive nothing meanwhile; at most
// the live ones, at least one. Idle connections, and those carrying small
// messages only, hold no share: split over every live connection, as
// until 85874a3, a stream beside three or seven idle ones moved 15-16
// GB/s against 21-23 alone (Intel VM, one run each). The credit an idle connection was granted before stays granted
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

// smallRecent is how long a connection counts as bulk after its last large
// record, and a partition as carrying small-message traffic after the last
// small record of a connection that is not bulk (see Conn.noteData):
// longer than the gaps of a sporadic flow (a message a millisecond). (As
// a reader that leaves its neighbours' records to their readers, a
// connection counts as bulk until a small record comes after this long:
// Conn.bulkReader.) Endpoint.smallFor holds it.
const smallRecent = 10 * time.Millisecond

// partTraffic is what a data partition has carried lately, as its
// receiver sees it: when a small message last came, and how many bulk
// connections sent records lately. Written under the partition's RX
// lock, read by anyone.
type partTraffic struct {
	smallAt atomic.Int64 // ep.now()+1 of the last small-message record; 0: none lately (see sharedShare)
	bulk    periodCount  // bulk connections seen
}

// periodCount counts connections per period (of ep.smallFor), in the
// current and the previous one: each slot holds a period's number in its
// high bits and its count in the low periodBits, so that writers on
// several partitions count without a lock.
type periodCount [2]atomic.Int64

const periodBits = 24

// count counts a connection seen for the first time in period e.
func (pc *periodCount) count(e int64) {
	slot := &pc[e&1]
	for {
		old := slot.Load()
		v := e<<periodBits | 1
		if old>>periodBits == e {
			v = old + 1
		}
		if slot.CompareAndSwap(old, v) {
			return
		}
	}
}

// noteBulkPeriod raises st.bulkLast to period e (counters on several
// partitions may race; the latest period wins).
func (st *state) noteBulkPeriod(e int64) {
	for {
		last := st.bulkLast.Load()
		if last >= e || st.bulkLast.CompareAndSwap(last, e) {
			return
		}
	}
}

// recent is how many connections were counted in period e or the one
// before it, whichever counted more.
func (pc *periodCount) recent(e int64) int64 {
	n := int64(0)
	for slot := range pc {
		if v := pc[slot].Load(); v>>periodBits == e || v>>periodBits == e-1 {
			n = max(n, v&(1<<periodBits-1))
		}
	}
	return n
}

// sharedShare is c's window while its partition carries a small-message
// connection: Config.SharedWindow split among the partition's bulk
// connections (at least minShare each), so that a small message finds at
// most about that much bulk data ahead of it in the ring. Every connection
// of the partition gets it, not only those that sent large records lately:
// one that was idle, or paused longer than smallRecent, would otherwise
// come back with its whole window in one burst. 0 when the partition
// carries no small messages (or SharedWindow is off).
func (st *state) sharedShare(c *Conn) int64 {
	w := int64(st.ep.cfg.SharedWindow)
	part := int(c.rxPart.Load())
	if w <= 0 || part < 0 || part >= len(st.traffic) {
		return 0
	}
	pt := &st.traffic[part]
	// consumed asks on every Read: once a small message is old news, 0
	// says so without reading the clock (4 KiB reads spent 16 % of the
	// reader's CPU in clock reads).
	small := pt.smallAt.Load()
	if small == 0 {
		return 0
	}
	now, recent := st.ep.now()+1, st.ep.smallFor
	if now-small > recent {
		pt.smallAt.CompareAndSwap(small, 0)
		return 0
	}
	return max(w/max(pt.bulk.recent(now/recent), 1), minShare)
}

// smallTraffic reports whether data partition part carried small
// messages within smallFor (as sharedShare sees it), reading the clock
// only if it carried any since sharedShare last looked.
func (st *state) smallTraffic(part int) bool {
	small := st.traffic[part].smallAt.Load()
	return small != 0 && st.ep.now()+1-small <= st.ep.smallFor
}

// smallPiece is how much of a bulk record is copied in one go, between
// yields of the processor, on a partition that carries small messages
// (smallTraffic): the record a writer sends and the part of a record a
// Read takes. A process with one P runs nothing else during a copy, and
// a small message that arrives meanwhile waits for its end: 64 KiB takes
// 2-3 µs to copy on the AMD VM, beside the ~1 µs round trip of 64 B.
const smallPiece = 16 << 10

// piece is the part of b that a Read by self takes of a record's n bytes
// from data partition part (self's goroutine): a smallPiece of a larger
// record while the partition carries small messages, to yield between
// pieces (self.cut says so to Read), all of b otherwise.
func (st *state) piece(part int, self *Conn, b []byte, n int) []byte {
	self.cut = n > smallPiece && len(b) > smallPiece && st.smallTraffic(part)
	if self.cut {
		return b[:smallPiece]
	}
	return b
}

// smallLately reports whether any data partition carried a small-message
// record lately (as sharedShare sees it, without reading the clock).
func (st *state) smallLately() bool {
	for i := range st.traffic {
		if st.traffic[i].smallAt.Load() != 0 {
			return true
		}
	}
	return false
}

// sharedBound is c's window while the shared window bounds it beside a
// small-message flow: sharedShare, when it is less than share (st.share
// now); 0 otherwise (see Conn.creditLocked).
func (st *state) sharedBound(c *Conn, share int64) int64 {
	if w := st.sharedShare(c); w < share {
		return w
	}
	return 0
}

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
// serving it (CoreInline: whoever passes by sends for everyone).
func (st *state) serveUnits() {
	for _, u := range st.units {
		u.tryServe(nil)
	}
}

// pollBatch bounds the records one poll takes per ring, so a caller whose
// record arrived returns promptly even under a flood for other
// connections.
const pollBatch = 64

// poll consumes records from the control ring and the data rings nobody
// else is consuming, starting with self's. DATA for self goes straight
// into b (self and b may be nil). It returns the bytes copied into b and
// the records consumed.
func (st *state) poll(self *Conn, b []byte) (n, records int) {
	return st.pollServe(self, b, true)
}

// pollServe is poll, serving the units afterwards only if serve is set.
func (st *state) pollServe(self *Conn, b []byte, serve bool) (n, records int) {
	records = st.pollRing(st.control, nil, nil)
	first := 0
	if self != nil {
		first = max(int(self.rxPart.Load()), 0)
	}
	left := false
	looked := 0
	for k := range st.parts {
		p := st.parts[(first+k)%len(st.parts)]
		if !p.TryLockRX() {
			continue
		}
		looked++
		got, r := st.pollLocked(p, self, b, false)
		left = left || st.headWait[p.Index] != 0
		p.UnlockRX()
		if st.turns.nwait.Load() > 0 {
			st.serveTurns()
		}
		records += r
		if got > 0 {
			self.consumed(got)
			n = got
			break
		}
	}
	if records == 0 && looked == len(st.parts) && !left {
		st.expireIdleTurns() // every ring empty
	}
	if n == 0 && serve {
		// Serve frames the RX path queued (ACCEPT, CLOSE answers; their
		// queueFrame also tried) and whatever else waits. Not when the
		// caller's data came: it returns to its application now rather
		// than copying other connections' bulk records first — a
		// request/response flow's reader would otherwise send its
		// neighbour's records before taking its own response.
		st.serveUnits()
	}
	if records > 0 && n == 0 {
		st.ep.noteProgress() // with n > 0, Read notes it
	}
	if left && n == 0 {
		runtime.Gosched() // let the reader we leave records to run
	}
	return n, records
}

// Bounds of leaving a record for its reader (see leaveForReader): a record
// waits at the head of its ring for at most headWaitMax, and for a reader
// outside Read only if it left Read within readerBack.
const (
	headWaitMax = 200 * time.Microsecond
	readerBack  = 20 * time.Microsecond
)

// leaveForReader reports whether a bulk reader's poll of data partition
// part (RX lock held; now is ep.now()) should leave the DATA record at its
// head, for connection id, to that connection's own reader instead of
// queueing it.
//
// A record that meets no posted Read buffer is copied twice: into the
// connection's queue, then out to the application. With more connections
// than CPUs that was most records: a reader's buffer is posted only while
// it blocks, and the reader that polls is running, so the others are
// between Reads, runnable but not running (at 2 connections of 64 KiB
// streams on one partition, 57% of records, and ~75% of the receiver's
// CPU). Leaving the record, and yielding, lets its reader copy it once.
// Only bulk readers leave records: a request/response flow's reader takes
// its neighbours' records and moves on, as before, rather than wait for
// their readers to run (that took a 64 B flow's median round trip beside
// a bulk flow from 1.5 to 10 µs).
//
// It is left only while its reader is about to come: the reader has no
// buffer posted (a posted one takes the record at once), and it is in Read
// and not blocked (a blocked reader has a buffer posted) or left Read
// within readerBack; and the record has waited at the head for less than
// headWaitMax, so a reader that does not come costs its neighbours at most
// that long. The workers never leave a record.
//
// The poller leaves records as a bulk reader does. It drains the rings
// when no caller runs — every reader blocked, each with its buffer posted
// — and taking a 64 KiB record for a 16 KiB buffer queued the other 48
// KiB: at 64 connections ~4 % of the bytes were copied twice, and the
// receiver spent ~3 % of its CPU on the queue (6.8 k queued records in 2
// s, 1.6 k when the poller leaves them).
//
// A blocked reader whose posted buffer is smaller than the record (n
// bytes, or what a Read left of it) is woken instead, to take the record
// in parts from the ring (takeRest): filling its buffer would queue the
// rest (64 KiB streams read 32 KiB at a time: 8.1 -> 10.9 GB/s at 64
// connections). So is one whose record is larger than smallPiece on a
// partition that carries small messages: it takes the record in pieces,
// yielding between them (see smallPiece), where our copy would be in one
// go.
func (st *state) leaveForReader(part int, id uint32, n int, now int64) bool {
	c := st.lookup(id)
	if c == nil {
		return false
	}
	if !c.inRead.Load() && !c.readerRecent(now) {
		return false
	}
	if w := st.headWait[part]; w != 0 && now-w > int64(headWaitMax) {
		return false
	}
	c.rxmu.Lock()
	small := c.rbuf != nil && c.rn == 0 && (len(c.rbuf) < n || n > smallPiece && st.smallTraffic(part))
	leave := (c.rbuf == nil || small) && int(c.rxPart.Load()) == part && c.flags.Load()&fClosed == 0
	c.rxmu.Unlock()
	if leave && small {
		c.wake(c.rnotify) // come and take it in parts (see takeRest)
	}
	if leave && st.headWait[part] == 0 {
		st.headWait[part] = now
	}
	return leave
}

// pollUnit consumes what waits in a unit's rings and the control ring (a
// worker's RX).
func (st *state) pollUnit(u *unit) int {
	records := st.pollRing(st.control, nil, nil)
	for _, p := range u.parts {
		records += st.pollRing(p, nil, nil)
	}
	if records > 0 {
		st.ep.noteProgress()
	}
	return records
}

func (st *state) pollRing(p *partition.Partition, self *Conn, b []byte) int {
	if !p.TryLockRX() {
		return 0
	}
	_, records := st.pollLocked(p, self, b, false)
	p.UnlockRX()
	if st.turns.nwait.Load() > 0 {
		st.serveTurns() // bytes arrived: room for a turn, perhaps
	}
	return records
}

// unitPending reports whether a record waits in one of the unit's rings
// or the control ring, without taking it (a look for a sleeping worker,
// see workerRecheck). A ring whose RX lock is held is being read.
func (st *state) unitPending(u *unit) bool {
	for _, p := range append(u.parts[:len(u.parts):len(u.parts)], st.control) {
		if !p.TryLockRX() {
			continue
		}
		_, _, ok, err := p.Peek()
		p.UnlockRX()
		if ok || err != nil {
			return true
		}
	}
	return false
}

// armUnit asks the peer to ring before its next record on the unit's rings
// and the control ring.
func (st *state) armUnit(u *unit) {
	for _, p := range append(u.parts[:len(u.parts):len(u.parts)], st.control) {
		p.LockRX()
		p.ArmData()
		p.UnlockRX()
	}
}

// pollLocked consumes up to pollBatch records of ring p (RX lock held),
// returning at the first DATA record for self, which goes straight into b.
// A bulk reader's poll (self set) leaves a DATA record at the head of the
// ring while its connection's reader is about to take it (see
// leaveForReader), and so does the poller's (poller set, self nil) with
// records above smallWrite, the ones worth a second copy's saving; a
// latency-sensitive reader and the workers take their neighbours' records
// and move on.
func (st *state) pollLocked(p *partition.Partition, self *Conn, b []byte, poller bool) (n, records int) {
	part := p.Index
	for records < pollBatch {
		tag, payload, ok, err := p.Peek()
		if err != nil || !ok {
			return 0, records
		}
		kind, id := splitTag(tag)
		if kind == kindData && p != st.control && len(payload)-st.headOff[part] > smallWrite && st.smallTraffic(part) {
			var taken int
			n, taken = st.takeAhead(p, self, b, id)
			if records += taken; n > 0 {
				return n, records
			}
		}
		if kind == kindData && p != st.control && (poller && len(payload) > smallWrite || self != nil && id != self.id) {
			rest := len(payload) - st.headOff[part]
			if (poller || st.headOff[part] > 0 || self.bulkReader()) && st.leaveForReader(part, id, rest, st.ep.now()) {
				return 0, records
			}
		}
		if p != st.control && st.headWait[part] != 0 {
			st.headWait[part] = 0
		}
		if p != st.control && st.headOff[part] > 0 {
			n = st.takeRest(p, self, b, id, payload)
			records++
			if n > 0 {
				return n, records
			}
			continue
		}
		records++
		if ts := st.ep.taps.Load(); ts != nil {
			local := id
			if kind == kindOpen {
				local = 0 // the dialer's id; ours does not exist yet
			}
			ts.emit(st, TapRX, part, tag, local, payload)
		}
		if kind == kindData && self != nil && id == self.id && b != nil && self.takeDirect(part, len(payload)) {
			n = copy(st.piece(part, self, b, len(payload)), payload)
			self.rxmu.Unlock()
			if n < len(payload) {
				st.headOff[part] = n // the rest stays in the ring for the next Read
				self.restWaits.Store(true)
			} else {
				p.Release()
			}
			return n, records
		}
		if p == st.control {
			err = st.dispatchControl(kind, id, payload)
		} else {
			err = st.dispatch(part, kind, id, payload)
		}
		p.Release()
		if err != nil {
			err = fmt.Errorf("protocol violation from peer: %w", err)
			st.ep.logf("%v", err)
			st.sess.Fail(err)
			return 0, records
		}
	}
	return 0, records
}

// aheadRecords is how many records past a bulk record at the head of a
// ring a poll looks at for small messages (see takeAhead).
const aheadRecords = 16

// takeAhead takes the small DATA records (up to smallWrite) queued behind
// the bulk DATA record at the head of data partition p (RX lock held; the
// head's connection is headID) out of order: self's next one into b, if
// b holds it, and the others' into their posted buffers or queues, waking
// their readers; self's ends the look. It returns the bytes copied into
// b and the records taken. A connection's records keep their order: one
// whose record (of any kind) it passes over gets nothing taken after it,
// nor does the head's.
//
// Whoever polled a ring copied the bulk records in front of a small
// message first — to their reader or its queue if the poll was not the
// bulk reader's own, and a bulk reader took its own record and returned,
// leaving the small message behind it for the next poll. That is the head
// of the line that segmentation and the shared window shorten, to a
// record and to a window, but do not remove: beside one 1 MiB-write flow
// in its partition a 64 B flow's p99 was 4.4x its p99 alone on the AMD
// VM, against ~1x for the same flows in partitions of their own. Only
// partitions carrying small messages lately are looked at (their
// traffic's smallAt): elsewhere every record is bulk, and reading ahead
// would cost each of them a dozen cache misses for nothing.
func (st *state) takeAhead(p *partition.Partition, self *Conn, b []byte, headID uint32) (n, taken int) {
	part := p.Index
	passed := make([]uint32, 1, aheadRecords+1) // connections whose order forbids taking
	passed[0] = headID
	skip := func(id uint32) (take, stop bool) {
		passed = append(passed, id)
		return false, false
	}
	_ = p.Ahead(aheadRecords, func(tag uint32, payload []byte) (take, stop bool) {
		kind, id := splitTag(tag)
		if kind != kindData || len(payload) > smallWrite || slices.Contains(passed, id) {
			return skip(id)
		}
		if self != nil && id == self.id {
			if b == nil || len(payload) > len(b) || !self.takeDirect(part, len(payload)) {
				return skip(id)
			}
			if ts := st.ep.taps.Load(); ts != nil {
				ts.emit(st, TapRX, part, tag, id, payload)
			}
			n = copy(b, payload)
			self.rxmu.Unlock()
			st.ep.counters.takenAhead.Add(1)
			taken++
			return true, true // b is done with: the caller returns it
		}
		c := st.lookup(id)
		if c == nil {
			return skip(id) // a stale frame: dropped in its turn
		}
		if ts := st.ep.taps.Load(); ts != nil {
			ts.emit(st, TapRX, part, tag, id, payload)
		}
		st.ep.counters.takenAhead.Add(1)
		taken++
		if err := c.deliver(part, kindData, payload); err != nil {
			err = fmt.Errorf("protocol violation from peer: %w", err)
			st.ep.logf("%v", err)
			st.sess.Fail(err)
			return true, true
		}
		return true, false
	}) // an error failed the session; the next Peek returns it
	return n, taken
}

// takeRest consumes what a Read left of the DATA record at the head of data
// partition p (RX lock held): the record was accounted and tapped when the
// Read took its first part. If it is self's, the next part goes into b and
// its size is returned (the record is released once it is all read);
// otherwise the rest goes to its connection's posted buffer or queue.
//
// A Read smaller than a record (bufio's 4 KiB, io.Copy's 32 KiB) thus
// copies it once, straight from the ring, as a Read of a whole record
// does. Queueing the rest, as before, held a 64 KiB stream read 32 KiB at
// a time to 11.3 GB/s against 13.1 now (4 KiB at a time: 8.8 against
// 9.2, where the calls themselves cost most). The rest waits at the head,
// holding up the records behind it, while its reader is about to come
// back: a bulk reader's poll leaves it as it leaves any record
// (leaveForReader, checked before), and every other poll takes it.
func (st *state) takeRest(p *partition.Partition, self *Conn, b []byte, id uint32, payload []byte) int {
	part := p.Index
	rest := payload[st.headOff[part]:]
	if self != nil && id == self.id && b != nil && self.takeRestDirect() {
		n := copy(st.piece(part, self, b, len(rest)), rest)
		if n < len(rest) {
			st.headOff[part] += n
			return n
		}
		st.headOff[part] = 0
		self.restWaits.Store(false)
		p.Release()
		return n
	}
	st.headOff[part] = 0
	if c := st.lookup(id); c != nil {
		c.restWaits.Store(false)
		c.rxmu.Lock()
		c.actLocked(kindData, rest) // DATA: never an error
		c.rxmu.Unlock()
	}
	p.Release()
	return 0
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
	c.peerID, c.window, c.peerGen = peerID, int64(m.window), m.gen
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
	if !ln.offer(c) {
		c.releaseLocal()
		refuse(refuseBacklog)
		return
	}
	c.queueFrame(kindAccept, acceptMsg{id: c.id, window: uint32(st.window), gen: c.gen, dialGen: m.gen}.encode(nil))
}

func le32(v uint32) []byte { return []byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)} }

// drainLocked consumes everything queued in ring p (RX lock held) for the
// poller, except a DATA record left at the head for its reader; it reports
// whether it left one.
func (st *state) drainLocked(p *partition.Partition) bool {
	for {
		if _, records := st.pollLocked(p, nil, nil, true); records == 0 {
			return p != st.control && st.headWait[p.Index] != 0
		}
	}
}

// idleGrace is how long the endpoint must go without a spinning caller or
// a new Read or Write before the poller arms the doorbell for frames nobody
// waits for (an OPEN for a listener with no Accept pending, data for a
// connection not being read). A parked caller arms it at once. Arming while
// callers come and go between round trips would make every message ring a
// doorbell.
//
// A pending Accept is such a frame nobody waits for while calls come (the
// callers' polls take OPEN frames off the rings too), and arms the doorbell
// only once they stop. Counted as a parked caller, it made every endpoint
// with a listener — each of ntproxy's memory links and rack links, any
// server — ring a doorbell for nearly every record it received: a futex
// wake-up at the sender and a poller thread woken at the receiver (a
// proxied 64 KiB stream ran at 0.5-0.6 GB/s with that, 0.8-1.0 without, on
// the 2-vCPU VM before the proxy's copies were cut).
const idleGrace = 2 * time.Millisecond

// announceIdle tells the device, if it listens (ntb.Idler), that this end
// sleeps with nothing to send — no loose frame, no writer queued or
// parked for credit or room — so that it may check the link less often:
// an idle pair's CPU was mostly the fabric's heartbeats. A sender waiting
// for room keeps them frequent, so that a peer that dies or a link pulled
// mid-transfer is seen as soon as before. The poller or the last worker
// to sleep calls it; Endpoint.busy ends it.
func (st *state) announceIdle() {
	ep := st.ep
	if ep.idler == nil || !st.quiet() || !ep.idle.CompareAndSwap(false, true) {
		return
	}
	ep.idler.Idle(true)
	if !st.quiet() {
		ep.busy() // a writer or a worker came between the look and the announcement
	}
}

// quiet reports whether nothing of ours waits to be sent and every worker
// (if any) sleeps.
func (st *state) quiet() bool {
	return !st.ctlPending.Load() && st.ep.writersOut.Load() == 0 && !st.sendQueued() &&
		int(st.asleep.Load()) == st.workers
}

// sendQueued reports whether a unit has writers queued.
func (st *state) sendQueued() bool {
	for _, u := range st.units {
		if u.queued.Load() > 0 {
			return true
		}
	}
	return false
}

// runPoller keeps loose frames moving and rebalances units; in CoreInline
// it also sleeps on the doorbells while nobody else watches the rings. It
// ends with the session, failing its connections.
func (st *state) runPoller() {
	ep := st.ep
	ctx, cancel := context.WithCancel(context.Background())
	defer context.AfterFunc(st.sess.Context(), cancel)()
	defer cancel()
	defer ep.pollers.Done()
	defer st.failAll()
	timer := time.NewTimer(idleGrace)
	defer timer.Stop()
	pause := func(d time.Duration) { // d 0: until kicked
		if d > 0 {
			timer.Reset(d)
		} else {
			timer.Stop()
		}
		select {
		case <-ep.kick:
		case <-timer.C:
		case <-ctx.Done():
		}
	}
	rings := append(st.parts[:len(st.parts):len(st.parts)], st.control)
	var bits uint64
	for _, p := range rings {
		bits |= p.DataBit() | p.SpaceBit()
	}
	txBytes := make([]uint64, len(st.units))
	nextBalance := time.Now().Add(rebalanceEvery)
	var idleSince time.Time
	var calls uint64
	for ctx.Err() == nil {
		if ep.cfg.Rebalance && time.Now().After(nextBalance) {
			st.rebalance(txBytes)
			nextBalance = time.Now().Add(rebalanceEvery)
		}
		ctlDone := st.flushCtl()
		if ep.cfg.CoreModel != CoreInline {
			// The workers watch the rings; only loose frames are ours
			// (queuing one kicks us), and the units' traffic to compare.
			if ctlDone && ep.cfg.Rebalance {
				pause(rebalanceEvery)
			} else if ctlDone {
				pause(0)
			} else {
				pause(time.Millisecond)
			}
			continue
		}
		st.serveUnits()
		if ctlDone {
			// Somebody polls, or calls keep coming: nothing to do.
			if c := ep.calls.Load(); ep.callersRun() || (c != calls && ep.parked.Load() == 0) {
				calls, idleSince = c, time.Time{}
				pause(idleGrace)
				continue
			}
			if ep.parked.Load() == 0 && ep.accepting.Load() == 0 {
				if idleSince.IsZero() {
					idleSince = time.Now()
				}
				if wait := idleGrace - time.Since(idleSince); wait > 0 {
					pause(wait)
					continue
				}
			}
		}
		locked := 0
		left := false
		for _, p := range rings {
			if p.TryLockRX() {
				p.ArmData() // then look once more before sleeping
				left = st.drainLocked(p) || left
				p.UnlockRX()
				locked++
			}
		}
		if locked < len(rings) || left {
			// A caller is polling and will deliver, or a reader is
			// about to take the record left for it (one asleep on the
			// doorbell would not take it over after headWaitMax); look
			// again soon. Not with a timer: one under a millisecond
			// sleeps ~1.1 ms here, and a large record's copy holds the
			// ring that long only for microseconds.
			runtime.Gosched()
			continue
		}
		st.serveUnits()
		room := false
		for _, u := range st.units {
			if u.queued.Load() > 0 && u.armSpace() {
				room = true
			}
		}
		if room {
			continue // serve at the top
		}
		if !ctlDone && st.control.ArmSpace(64) {
			continue // room appeared: flush at the top
		}
		// The doorbell wait is a blocking system call during which this
		// thread keeps its P until sysmon takes it back — up to 10 ms in a
		// quiet process. Goroutines this loop just woke sit on that P's run
		// queue, so let them run first.
		runtime.Gosched()
		if ctlDone && ep.callersRun() {
			// A caller ran meanwhile and is not parked: it polls. The
			// doorbell wait would hold this process's P (see above)
			// while that caller waits to run — with GOMAXPROCS 1 until
			// the doorbell rings, which with nothing more to publish on
			// the other side may be never, or until sysmon retakes it.
			continue
		}
		st.expireIdleTurns() // the rings are empty
		ep.counters.pollerSleeps.Add(1)
		st.announceIdle()
		_, err := ep.dev.WaitDoorbell(ctx, bits)
		ep.busy()
		if err != nil && ctx.Err() == nil {
			st.sess.Fail(fmt.Errorf("wait for doorbell: %w", err))
			return
		}
		pending := ep.dev.Doorbells() & bits
		ep.dev.ClearDoorbells(pending)
		for _, p := range rings {
			if pending&p.SpaceBit() != 0 {
				ep.spaceArrived()
				break
			}
		}
		for _, p := range rings {
			if p.TryLockRX() {
				st.drainLocked(p)
				p.UnlockRX()
			}
		}
	}
}

// failAll ends every connection of a finished session.
func (st *state) failAll() {
	err := fmt.Errorf("%w: %w", ErrLinkDown, st.sess.Err())
	st.ep.spaceArrived()
	st.turns.mu.Lock()
	if t := st.turns.timer; t != nil {
		t.Stop()
	}
	st.turns.mu.Unlock()
	for i := range st.conns {
		if c := st.conns[i].Load(); c != nil {
			c.fail(err)
		}
	}
	st.ep.mu.Lock()
	if st.ep.cur == st {
		st.ep.cur = nil
	}
	st.ep.mu.Unlock()
	if st.ep.cfg.Logf != nil {
		st.ep.cfg.Logf("%s: connections of session %#x closed: %v", st.ep.dev.Name(), st.sess.Epoch, err)
	}
}
