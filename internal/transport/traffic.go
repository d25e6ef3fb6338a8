package transport

import (
	"sync/atomic"
	"time"
)

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
	// says so without reading the clock, which small reads would pay for
	// on every call.
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
// a small message that arrives meanwhile waits for its end, and a whole
// 64 KiB record's copy takes longer than a small message's round trip.
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
