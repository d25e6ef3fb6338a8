package transport

import (
	"math/bits"
	"sort"
	"sync"

	"github.com/ntstack/ntstack/partition"
)

// retention holds the bytes a connection has sent and the peer has not
// acknowledged (see resume.go), in one of two ways:
//
//   - By reference, on a device whose outbound window is shared memory
//     (ntb.SharedWindow): each DATA record's bytes stay where they were
//     written, in the peer's ring, and only this end ever overwrites
//     them there. A span records where (partition.SendRef). The ring
//     overwrites a span only once the peer has taken it off: the peer
//     holds it then, and the ring's overwrite hook drops it
//     unacknowledged (ringRefs.overwrite), unless the connection moved
//     partitions and the peer may count it lost (see there), when the
//     hook copies it out. When the session ends, takeOver copies out
//     the rest (materialize) before the next session writes the rings.
//     (CREDIT acknowledges late: a receiver sharing its rings reports
//     less than it read, to bound the writer's share, so with many
//     streams most spans meet the ring coming round unacknowledged.)
//     Records of keepSmall bytes or less are copied all the same, into
//     chunks of our own (a span per record would cost more than the
//     copy).
//   - By copy, elsewhere (behind a bridge a posted write may be lost with
//     a failing link, and the peer's ring would not hold it): a ring
//     indexed by stream offset, offset o at ring[o&(len-1)], grown by
//     doubling to the bytes in flight.
//
// Every method takes mu, a leaf lock: it is taken under the sender's smu
// and under a partition's TX lock (the overwrite hook of another
// connection's record).
type retention struct {
	mu sync.Mutex
	// mu protects the following fields.
	ring  []byte     // by copy
	spans []keepSpan // by reference: by offset, contiguous; spans[head:] are live
	head  int
	floor int64    // by reference: the bytes below were taken off the rings (taken)
	free  [][]byte // retired copies, for the next ones (at most keepFree)
}

// keepSmall is the largest record retained by reference as a copy, and
// keepChunk the size its chunks grow to.
// keepFree is how many retired copies a retention holds for reuse.
const (
	keepSmall = 1 << 10
	keepChunk = 64 << 10
	keepFree  = 4
)

// buf returns an empty buffer of at least n bytes' capacity, a retired
// copy if one is large enough.
func (r *retention) buf(n int) []byte {
	for i, b := range r.free {
		if cap(b) >= n {
			last := len(r.free) - 1
			r.free[i], r.free[last] = r.free[last], nil
			r.free = r.free[:last]
			return b[:0]
		}
	}
	return make([]byte, 0, n)
}

// recycle keeps b, a retired copy, for reuse.
func (r *retention) recycle(b []byte) {
	if len(r.free) < keepFree && cap(b) <= keepChunk {
		r.free = append(r.free, b)
	}
}

// keepSpan is retained bytes from stream offset off.
type keepSpan struct {
	off  int64
	b    []byte
	part *partition.Partition // the ring b lies in (nil: b is our own copy)
	at   uint64               // b's write position in part's ring
}

// add retains b, sent at stream offset at, by copy.
func (r *retention) add(at int64, b []byte, peerRead int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	end := at + int64(len(b))
	if need := end - peerRead; need > int64(len(r.ring)) {
		r.grow(at, need, peerRead)
	}
	mask := int64(len(r.ring) - 1)
	n := copy(r.ring[at&mask:], b)
	copy(r.ring, b[n:])
}

// grow makes room for need bytes retained by copy, carrying over the
// retained bytes below at.
func (r *retention) grow(at, need, peerRead int64) {
	size := max(keepMin, 2*len(r.ring), 1<<bits.Len64(uint64(need-1)))
	old := r.ring
	r.ring = make([]byte, size)
	if len(old) == 0 {
		return
	}
	from := max(peerRead, at-int64(len(old)))
	for o := from; o < at; {
		n := min(at-o, int64(len(old))-o&int64(len(old)-1))
		src := old[o&int64(len(old)-1):][:n]
		m := copy(r.ring[o&int64(size-1):], src)
		copy(r.ring, src[m:])
		o += n
	}
}

// addRef retains b, sent at stream offset off, by reference: b lies in
// part's ring at write position at.
func (r *retention) addRef(off int64, b []byte, part *partition.Partition, at uint64, peerRead int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retire(peerRead)
	r.spans = append(r.spans, keepSpan{off: off, b: b, part: part, at: at})
}

// addSmall retains b, a small record sent at stream offset at, by
// reference: as a copy, appended to the last chunk while it has room.
func (r *retention) addSmall(at int64, b []byte, peerRead int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retire(peerRead)
	size := keepMin
	if n := len(r.spans); n > r.head && r.spans[n-1].part == nil {
		last := &r.spans[n-1]
		if last.off+int64(len(last.b)) == at && len(last.b)+len(b) <= cap(last.b) {
			last.b = append(last.b, b...)
			return
		}
		size = min(keepChunk, 2*cap(last.b))
	}
	r.spans = append(r.spans, keepSpan{off: at, b: append(r.buf(max(size, len(b))), b...)})
}

// retire drops the spans the peer has acknowledged, keeping their
// copies for reuse.
func (r *retention) retire(peerRead int64) {
	for r.head < len(r.spans) && r.spans[r.head].off+int64(len(r.spans[r.head].b)) <= peerRead {
		if s := r.spans[r.head]; s.part == nil {
			r.recycle(s.b)
		}
		r.spans[r.head] = keepSpan{}
		r.head++
	}
	if r.head == len(r.spans) {
		r.spans, r.head = r.spans[:0], 0
	} else if r.head >= 64 && r.head*2 >= len(r.spans) {
		n := copy(r.spans, r.spans[r.head:])
		clear(r.spans[n:])
		r.spans, r.head = r.spans[:n], 0
	}
}

// find is the index of the live span holding offset o, or -1.
func (r *retention) find(o int64) int {
	live := r.spans[r.head:]
	i := sort.Search(len(live), func(i int) bool { return live[i].off+int64(len(live[i].b)) > o })
	if i == len(live) || live[i].off > o {
		return -1
	}
	return r.head + i
}

// taken drops the spans up to stream offset end, which the peer has
// taken off the rings (ringRefs.overwrite): a resume or a hand-over never
// asks for them again.
func (r *retention) taken(end int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retire(end)
	r.floor = max(r.floor, end)
}

// from is where the retained bytes begin, at least peerRead.
func (r *retention) from(peerRead int64) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return max(r.floor, peerRead)
}

// copyOut copies out of part's ring the unacknowledged bytes of the span
// ending at stream offset end that lies at write position at, before the
// ring overwrites it (the ring's TX lock held).
func (r *retention) copyOut(part *partition.Partition, at uint64, end, peerRead int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i := r.find(end - 1)
	if i < 0 {
		return // acknowledged, or the connection was released
	}
	s := &r.spans[i]
	if s.part != part || s.at != at || s.off+int64(len(s.b)) != end {
		return // copied out already
	}
	lo := max(s.off, peerRead)
	if lo >= end {
		return
	}
	s.b = append(r.buf(int(end-lo)), s.b[lo-s.off:]...)
	s.off, s.part, s.at = lo, nil, 0
}

// materialize makes every retained byte from peerRead our own copy, in
// one span: the session that holds the rings the references point into
// has ended, and the next one will write them (takeOver, before it does).
func (r *retention) materialize(peerRead int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retire(peerRead)
	live := r.spans[r.head:]
	if len(live) == 0 || len(live) == 1 && live[0].part == nil {
		return
	}
	lo := max(live[0].off, peerRead)
	last := live[len(live)-1]
	b := make([]byte, 0, last.off+int64(len(last.b))-lo)
	for _, s := range live {
		b = append(b, s.b[max(lo-s.off, 0):]...)
	}
	clear(r.spans)
	r.spans, r.head = append(r.spans[:0], keepSpan{off: lo, b: b}), 0
}

// holds reports whether every byte from offset from up to sent is
// retained.
func (r *retention) holds(from, sent int64) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if from >= sent {
		return from == sent
	}
	if len(r.ring) > 0 {
		return sent-from <= int64(len(r.ring))
	}
	live := r.spans[r.head:]
	return len(live) > 0 && live[0].off <= from && live[len(live)-1].off+int64(len(live[len(live)-1].b)) >= sent
}

// bytesAt returns retained bytes from offset o, contiguous and at most up
// to end; nil if o is not retained. They stay valid while o is
// unacknowledged; a span's bytes are our own copy once its session has
// ended (materialize), which is when bytes are sent again.
func (r *retention) bytesAt(o, end int64) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ring) > 0 {
		mask := int64(len(r.ring) - 1)
		return r.ring[o&mask:][:min(end-o, int64(len(r.ring))-o&mask)]
	}
	i := r.find(o)
	if i < 0 {
		return nil
	}
	s := r.spans[i]
	return s.b[o-s.off:][:min(end-o, s.off+int64(len(s.b))-o)]
}

// size is the memory the retention holds of its own: by reference, its
// copies and the retired ones kept for reuse (not the spans' records).
func (r *retention) size() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := len(r.ring)
	for _, s := range r.spans[r.head:] {
		if s.part == nil {
			n += cap(s.b)
		}
	}
	for _, b := range r.free {
		n += cap(b)
	}
	return n
}

// reset drops everything retained: nothing will be sent again.
func (r *retention) reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ring, r.spans, r.head, r.free = nil, nil, 0, nil
}

// ringRefs lists, in ring order, the retained spans that lie in one
// partition's TX ring (by reference; guarded by the partition's TX lock).
type ringRefs struct {
	q    []ringRef
	head int
}

type ringRef struct {
	c   *Conn
	end int64  // the stream offset the span ends at
	at  uint64 // its write position in the ring
}

// push lists a span of c's just sent on the ring.
func (q *ringRefs) push(c *Conn, end int64, at uint64) {
	q.q = append(q.q, ringRef{c: c, end: end, at: at})
}

// overwrite is part's overwrite hook: it copies out the unacknowledged
// spans below write position below, and forgets the acknowledged ones at
// the front.
func (q *ringRefs) overwrite(part *partition.Partition, below uint64) {
	for q.head < len(q.q) {
		e := q.q[q.head]
		read := e.c.peerRead.Load()
		acked := e.end <= read
		if !acked && e.at >= below {
			break
		}
		switch {
		case acked:
		case read > e.c.movedAt.Load():
			// The ring overwrites only what the peer took off it, so the
			// peer holds the span, and every byte before it (they came
			// first on this ring, or were read before the last MOVE):
			// its RESUME will count them received.
			e.c.keep.taken(e.end)
		default:
			// The peer may hold it among the frames that came early on
			// this partition while it had not read up to the MOVE, which
			// it counts lost should the session end.
			e.c.keep.copyOut(part, e.at, e.end, read)
		}
		q.q[q.head] = ringRef{}
		q.head++
	}
	if q.head == len(q.q) {
		q.q, q.head = q.q[:0], 0
	} else if q.head >= 64 && q.head*2 >= len(q.q) {
		n := copy(q.q, q.q[q.head:])
		clear(q.q[n:])
		q.q, q.head = q.q[:n], 0
	}
}
