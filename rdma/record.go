package rdma

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Records are the framing both providers share. The TCP provider writes
// them back to back on the stream; the verbs provider places them in the
// peer's receive ring, each at an 8-byte-aligned offset (see ring.go).
//
// Record header, 8 bytes, little-endian, written by the sender:
//
//	off  size  field
//	  0     4  payload length in bytes (0 for recFin and recPad)
//	  4     1  type: recData, recFin, recPad
//	  5     1  reserved, zero
//	  6     2  recMagic ("NR"), a cheap check against misparsing
//	  8     n  payload (recData only)
//
// recPad fills the rest of a ring from its offset to the end (the next
// record starts at offset 0); it never appears on a stream. recFin ends
// the sender's direction (CloseWrite); nothing follows it.
const (
	recHdrSize = 8

	recOffLen   = 0
	recOffType  = 4
	recOffRsvd  = 5
	recOffMagic = 6

	recMagic = 0x524e // "NR" in little-endian byte order

	// MaxRecordPayload bounds a record's payload: a large write is cut
	// into records of at most 64 KiB, and a receiver rejects a longer
	// one as corrupt.
	MaxRecordPayload = 64 << 10
)

// Record types.
const (
	recData byte = 1
	recFin  byte = 2
	recPad  byte = 3
)

// errProtocol is wrapped by every error that comes from a peer breaking
// the framing or the ring protocol; the connection is failed, never
// trusted again.
var errProtocol = errors.New("rdma protocol violation")

// recHeader is a decoded record header.
type recHeader struct {
	typ byte
	n   int // payload length
}

// putHeader encodes h into b[:recHdrSize].
func putHeader(b []byte, typ byte, n int) {
	binary.LittleEndian.PutUint32(b[recOffLen:], uint32(n))
	b[recOffType] = typ
	b[recOffRsvd] = 0
	binary.LittleEndian.PutUint16(b[recOffMagic:], recMagic)
}

// parseHeader decodes and validates a peer-written header. b must hold
// recHdrSize bytes, copied out of shared memory first where the peer can
// still write them.
func parseHeader(b []byte) (recHeader, error) {
	if len(b) < recHdrSize {
		return recHeader{}, fmt.Errorf("record header: %d bytes: %w", len(b), errProtocol)
	}
	if m := binary.LittleEndian.Uint16(b[recOffMagic:]); m != recMagic || b[recOffRsvd] != 0 {
		return recHeader{}, fmt.Errorf("record header % x: bad magic: %w", b[:recHdrSize], errProtocol)
	}
	n := binary.LittleEndian.Uint32(b[recOffLen:])
	h := recHeader{typ: b[recOffType]}
	switch h.typ {
	case recData:
		if n > MaxRecordPayload {
			return recHeader{}, fmt.Errorf("record length %d over %d: %w", n, MaxRecordPayload, errProtocol)
		}
		h.n = int(n)
	case recFin, recPad:
		if n != 0 {
			return recHeader{}, fmt.Errorf("record type %d with length %d: %w", h.typ, n, errProtocol)
		}
	default:
		return recHeader{}, fmt.Errorf("record type %d: %w", h.typ, errProtocol)
	}
	return h, nil
}
