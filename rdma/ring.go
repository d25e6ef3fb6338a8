package rdma

import (
	"fmt"
	"math/bits"
)

// The verbs provider's ring, mirroring the NTB ring: each side of a
// connection owns a receive ring in its own registered memory and the peer
// writes records into it with RDMA write-with-immediate ("remote write,
// local read"). The sender keeps a local, registered shadow of the peer's
// ring with the same size and offsets; it builds records in the shadow and
// posts one write for a contiguous range, to the same offsets remotely.
//
//	sender (tx shadow, local)              receiver (rx ring, peer-written)
//	+--------+-------------+-----+         +--------+-------------+-----+
//	| rec    | rec rec     | ... |  write  | rec    | rec rec     | ... |
//	+--------+-------------+-----+ ──────► +--------+-------------+-----+
//	 ^peerCons  ^acked ^posted ^prod          ^cons          ^published
//
// Positions are byte counts since the connection began (uint64, never
// wrapped); a position's ring offset is pos % size. Each record starts at
// an offset aligned to ringAlign and never crosses the ring's end: a
// record is cut short to end exactly at the end, and where only a header
// fits there the sender writes a recPad header and continues at offset 0.
//
// Which side writes what:
//   - prod, posted, acked, peerCons: sender-local. prod advances as records
//     are placed in the shadow, posted as writes are handed to the NIC,
//     acked as their completions arrive, peerCons as credits arrive.
//   - published: receiver-local, taken from each write's immediate: the
//     sender's position after that write.
//   - cons: receiver-local; sent back as a credit (a zero-length write
//     with immediate) once it is creditEvery(size) past the last credit.
//
// Immediates (32 bits, the verbs provider's only signalling):
//
//	bit 31     0: data, the producer position after this write
//	           1: credit, the receiver's consumer position
//	bits 0-30  the position mod 2^31
//
// The receiver rebuilds the full position from the last one it knew:
// positions only advance and never by more than the ring size (at most
// 2^30), so 31 bits are unambiguous. Every immediate, header and length is
// validated before use (the peer is not trusted); a violation fails the
// connection.
//
// Flow control never deadlocks: a sender waits only when less than 16
// bytes are free (a header plus one aligned byte), which means the
// receiver holds more than size-16 unreturned bytes; once it has read
// them, at least creditEvery(size) = size/4 of them are due, so a credit
// is sent.
const (
	ringAlign = 8

	// MinRingSize and MaxRingSize bound a ring: a power of two from 4 KiB
	// (a page) to 1 GiB (half the 31-bit position space of an immediate).
	MinRingSize = 4 << 10
	MaxRingSize = 1 << 30
	// DefaultRingSize is 1 MiB: 16 records of the maximum payload, 3/4 of
	// it writable without waiting for a credit.
	DefaultRingSize = 1 << 20

	immCredit  = 1 << 31
	immPosMask = 1<<31 - 1
)

func alignUp(n uint64) uint64 { return (n + ringAlign - 1) &^ (ringAlign - 1) }

// checkRingSize validates a ring size from configuration or from a peer.
func checkRingSize(size uint64) error {
	if size < MinRingSize || size > MaxRingSize || bits.OnesCount64(size) != 1 {
		return fmt.Errorf("ring size %d: want a power of two in [%d, %d]", size, MinRingSize, MaxRingSize)
	}
	return nil
}

// creditEvery is how far the consumer runs ahead of its last credit
// before it sends another.
func creditEvery(size uint64) uint64 { return size / 4 }

func dataImm(pos uint64) uint32   { return uint32(pos) & immPosMask }
func creditImm(pos uint64) uint32 { return immCredit | uint32(pos)&immPosMask }

// advance rebuilds the position an immediate names, knowing it is not
// behind cur.
func advance(cur uint64, imm uint32) uint64 {
	return cur + uint64((imm-uint32(cur))&immPosMask)
}

// txRing is the sending half: the local shadow of the peer's ring.
// Not safe for concurrent use; the connection's mutex guards it.
type txRing struct {
	buf      []byte // len == size; registered memory in the verbs provider
	size     uint64
	prod     uint64 // next byte to place
	posted   uint64 // bytes handed to the NIC
	acked    uint64 // bytes whose writes completed
	peerCons uint64 // the receiver's consumer position, from credits
}

func newTxRing(buf []byte) *txRing { return &txRing{buf: buf, size: uint64(len(buf))} }

func (r *txRing) free() uint64 { return r.size - (r.prod - r.peerCons) }

// placeData puts the start of p into the ring as one data record, padding
// the ring's end first if only a header fits there. It returns how many
// bytes of p it placed: 0 when fewer than 16 bytes are free.
func (r *txRing) placeData(p []byte) int {
	if len(p) == 0 {
		return 0
	}
	for {
		free := r.free()
		off := r.prod % r.size
		tail := r.size - off
		if tail == recHdrSize && free >= tail {
			putHeader(r.buf[off:], recPad, 0)
			r.prod += tail
			continue
		}
		room := min(free, tail)
		if room < recHdrSize+ringAlign {
			return 0
		}
		n := min(len(p), MaxRecordPayload, int(room-recHdrSize))
		putHeader(r.buf[off:], recData, n)
		copy(r.buf[off+recHdrSize:], p[:n])
		r.prod += alignUp(recHdrSize + uint64(n))
		return n
	}
}

// placeFin puts a recFin record into the ring; false if there is no room.
func (r *txRing) placeFin() bool {
	if r.free() < recHdrSize {
		return false
	}
	putHeader(r.buf[r.prod%r.size:], recFin, 0)
	r.prod += recHdrSize
	return true
}

// next returns the next range to post, [off, off+n) of the shadow, which
// ends at position end; n == 0 when everything placed is posted. A range
// never crosses the ring's end.
func (r *txRing) next() (off, n, end uint64) {
	if r.posted == r.prod {
		return 0, 0, r.posted
	}
	off = r.posted % r.size
	end = min(r.prod, r.posted+(r.size-off))
	return off, end - r.posted, end
}

// credit applies a credit immediate.
func (r *txRing) credit(imm uint32) error {
	next := advance(r.peerCons, imm)
	if next > r.posted {
		return fmt.Errorf("credit to position %d beyond the %d bytes sent: %w", next, r.posted, errProtocol)
	}
	r.peerCons = next
	return nil
}

// rxRing is the receiving half: the ring the peer writes. Not safe for
// concurrent use; the connection's mutex guards it.
type rxRing struct {
	buf       []byte // len == size; peer-written memory
	size      uint64
	published uint64 // the peer's producer position, from immediates
	cons      uint64 // next byte to consume (a record's start)
	credited  uint64 // the consumer position last sent as a credit
	fin       bool   // a recFin was consumed

	// The record being read: cur payload bytes remain at offset curOff;
	// the record ends at position curEnd.
	cur    uint64
	curOff uint64
	curEnd uint64
}

func newRxRing(buf []byte) *rxRing { return &rxRing{buf: buf, size: uint64(len(buf))} }

// publish applies a data immediate.
func (r *rxRing) publish(imm uint32) error {
	next := advance(r.published, imm)
	if next == r.published || next-r.cons > r.size {
		return fmt.Errorf("immediate %#x: producer %d, consumer %d, ring %d: %w", imm, next, r.cons, r.size, errProtocol)
	}
	r.published = next
	return nil
}

// readable reports whether read would return data, the end of the
// stream or an error without waiting for the peer.
func (r *rxRing) readable() bool { return r.cur > 0 || r.fin || r.cons != r.published }

// read copies payload into p across as many published records as it
// can. At a recFin it returns what it has and sets fin.
func (r *rxRing) read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if r.cur > 0 {
			k := min(r.cur, uint64(len(p)-n))
			copy(p[n:], r.buf[r.curOff:r.curOff+k])
			n += int(k)
			r.cur -= k
			r.curOff += k
			if r.cur == 0 {
				r.cons = r.curEnd
			}
			continue
		}
		if r.fin || r.cons == r.published {
			break
		}
		avail := r.published - r.cons
		off := r.cons % r.size
		if avail < recHdrSize {
			return n, fmt.Errorf("%d published bytes at %d, less than a header: %w", avail, r.cons, errProtocol)
		}
		var hb [recHdrSize]byte
		copy(hb[:], r.buf[off:]) // read the peer's header once
		h, err := parseHeader(hb[:])
		if err != nil {
			return n, fmt.Errorf("record at %d: %w", r.cons, err)
		}
		switch h.typ {
		case recPad:
			if skip := r.size - off; skip <= avail {
				r.cons += skip
				continue
			}
			return n, fmt.Errorf("pad at %d runs past the %d published bytes: %w", r.cons, avail, errProtocol)
		case recFin:
			r.cons += recHdrSize
			r.fin = true
		case recData:
			whole := alignUp(recHdrSize + uint64(h.n))
			if off+recHdrSize+uint64(h.n) > r.size || whole > avail {
				return n, fmt.Errorf("record of %d bytes at %d crosses the ring end or the %d published bytes: %w", h.n, r.cons, avail, errProtocol)
			}
			r.cur, r.curOff, r.curEnd = uint64(h.n), off+recHdrSize, r.cons+whole
			if h.n == 0 {
				r.cons = r.curEnd
			}
		}
	}
	return n, nil
}

// creditDue reports whether the consumer has run far enough ahead of its
// last credit to send one.
func (r *rxRing) creditDue() bool { return r.cons-r.credited >= creditEvery(r.size) }
