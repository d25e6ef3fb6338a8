package transport

import (
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/ntstack/ntstack/partition"
)

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
// between Reads, runnable but not running. Leaving the record, and
// yielding, lets its reader copy it once. Only bulk readers leave records:
// a request/response flow's reader takes its neighbours' records and moves
// on rather than wait for their readers to run, which would multiply its
// round trip.
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
// — and taking a 64 KiB record for a 16 KiB buffer would queue the other
// 48 KiB, to be copied twice.
//
// A blocked reader whose posted buffer is smaller than the record (n
// bytes, or what a Read left of it) is woken instead, to take the record
// in parts from the ring (takeRest): filling its buffer would queue the
// rest, to be copied twice. So is one whose record is larger than
// smallPiece on a partition that carries small messages: it takes the
// record in pieces, yielding between them (see smallPiece), where our copy
// would be in one go.
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
				self.ringRest.Store(int64(len(payload) - n))
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
// record and to a window, but do not remove: beside one bulk flow in its
// partition a small flow's tail latency was several times its latency
// alone, against the same with partitions of their own. Only
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
// does, rather than copy the rest twice through the queue. The rest waits
// at the head, holding up the records behind it, while its reader is
// about to come back: a bulk reader's poll leaves it as it leaves any record
// (leaveForReader, checked before), and every other poll takes it.
func (st *state) takeRest(p *partition.Partition, self *Conn, b []byte, id uint32, payload []byte) int {
	part := p.Index
	rest := payload[st.headOff[part]:]
	if self != nil && id == self.id && b != nil && self.takeRestDirect() {
		n := copy(st.piece(part, self, b, len(rest)), rest)
		if n < len(rest) {
			st.headOff[part] += n
			self.ringRest.Add(int64(-n))
			return n
		}
		st.headOff[part] = 0
		self.restWaits.Store(false)
		self.ringRest.Store(0)
		p.Release()
		return n
	}
	st.headOff[part] = 0
	if c := st.lookup(id); c != nil {
		c.restWaits.Store(false)
		c.ringRest.Store(0)
		c.rxmu.Lock()
		c.actLocked(kindData, rest) // DATA: never an error
		c.rxmu.Unlock()
	}
	p.Release()
	return 0
}
