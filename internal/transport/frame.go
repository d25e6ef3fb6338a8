package transport

import (
	"encoding/binary"
	"fmt"

	"github.com/ntstack/ntstack/internal/prim/ring"
)

// Frames. Every ring record is one frame; the ring's 24-bit tag carries the
// frame kind and the connection id it is addressed to, so a data frame is
// nothing but payload:
//
//	tag bits 20..23  kind
//	tag bits  0..19  connection id at the receiver (OPEN/ACCEPT/REFUSE: the dialer's)
//
//	kind    payload (little endian)                 meaning
//	OPEN    port u16, 0 u16, window u32, gen u32,   dial port; the dialer receives up to window bytes;
//	        nonce u64                               the connection's identity for RESUME (resume.go)
//	ACCEPT  acceptor's id u32, window u32, gen u32  connection established
//	REFUSE  code u32                                no listener / backlog full
//	DATA    bytes                                   stream bytes, at most the sender's credit
//	FIN     -                                       no more DATA from me (CloseWrite)
//	CLOSE   - or abort u8 (1)                       no more frames of any kind from me; with abort
//	                                                (Abort) my stream ends short: fail, as at a reset
//	CREDIT  consumed u64, gen u32, floor u32        you may have window bytes beyond consumed in flight;
//	                                                once I have read all you sent, at least floor of
//	                                                them will be free (wait for that, not less)
//	MOVE    partition u32                           my frames for this connection continue on that partition
//	WANT    consumed u64, gen u32, inflight u32     I wait for credit: the last CREDIT I had said consumed,
//	                                                and I have sent inflight bytes beyond it (see turns.go)
//	RESUME  nonce u64, received u64, credit u64,    on a new session: send again from received (resume.go)
//	        floor u32, id u32
//	RESET   nonce u64                               I have no connection for your RESUME
//
// A CREDIT's floor may have floorPooled set: credit comes in turns, and the
// writer sends WANT when it waits for credit.
//
// CREDIT and WANT travel on the control ring, every other frame on the data
// partition the sending side placed the connection on; OPEN's and ACCEPT's
// partitions tell the receiver where a connection's frames come from. A
// sender migrating a connection sends MOVE as its last frame on the old
// partition; the receiver holds frames that arrive on the new one until it
// has read the MOVE, so bytes stay in order.
//
// gen is the sender's incarnation number of the connection (OPEN, ACCEPT)
// and, in CREDIT, the receiver's: credits travel on their own ring and may
// arrive after the CLOSE that freed the id, even after the id was reused;
// a CREDIT whose gen does not match is stale and ignored. Incarnations
// count over the endpoint's life, not a session's: a connection resumed
// on a new session by one side only (the other forgot it) sends with the
// old gen until the RESET reaches it, and a new connection given the same
// id must not take that for its own.
//
// Each side sends exactly one CLOSE per connection (on Close, or in answer
// to the peer's), and frees the id once it has both sent and received one:
// rings are FIFO, so no frame for the id can follow.
const (
	kindOpen   = 1
	kindAccept = 2
	kindRefuse = 3
	kindData   = 4
	kindFin    = 5
	kindClose  = 6
	kindCredit = 7
	kindMove   = 8
	kindWant   = 9
	kindResume = 10
	kindReset  = 11

	idBits = 20
	maxID  = 1<<idBits - 1

	refuseNoListener = 1
	refuseBacklog    = 2
	refuseNoIDs      = 3
	refuseQuota      = 4
	refusePartitions = 5
)

func makeTag(kind, id uint32) uint32 { return kind<<idBits | id }

func splitTag(tag uint32) (kind, id uint32) { return tag >> idBits, tag & maxID }

var _ = ring.MaxTag >> idBits // kinds fit in the tag's top 4 bits

type openMsg struct {
	port   uint16
	window uint32
	gen    uint32
	nonce  uint64 // 0 from a dialer that cannot resume (a 12-byte OPEN)
}

type acceptMsg struct {
	id     uint32
	window uint32
	gen    uint32
	// dialGen echoes the OPEN's gen, so a dialer tells an ACCEPT meant for
	// an earlier incarnation of its id (echoed is false for a 12-byte
	// ACCEPT from an older build, which has no echo).
	dialGen uint32
	echoed  bool
}

type creditMsg struct {
	consumed uint64
	gen      uint32
	floor    uint32 // credit the writer can count on once all is read (see Conn.consumed)
}

type wantMsg struct {
	consumed uint64 // as in the writer's last CREDIT
	gen      uint32 // the receiver's incarnation, as in CREDIT
	inflight uint32 // sent beyond consumed (at most the window)
}

// wantSize is the size of an encoded WANT.
const wantSize = 16

func (m wantMsg) encode(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, m.consumed)
	b = binary.LittleEndian.AppendUint32(b, m.gen)
	return binary.LittleEndian.AppendUint32(b, m.inflight)
}

func (m openMsg) encode(b []byte) []byte {
	b = binary.LittleEndian.AppendUint16(b, m.port)
	b = binary.LittleEndian.AppendUint16(b, 0)
	b = binary.LittleEndian.AppendUint32(b, m.window)
	b = binary.LittleEndian.AppendUint32(b, m.gen)
	return binary.LittleEndian.AppendUint64(b, m.nonce)
}

func (m acceptMsg) encode(b []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, m.id)
	b = binary.LittleEndian.AppendUint32(b, m.window)
	b = binary.LittleEndian.AppendUint32(b, m.gen)
	return binary.LittleEndian.AppendUint32(b, m.dialGen)
}

// creditSize is the size of an encoded CREDIT.
const creditSize = 16

func (m creditMsg) encode(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, m.consumed)
	b = binary.LittleEndian.AppendUint32(b, m.gen)
	return binary.LittleEndian.AppendUint32(b, m.floor)
}

// Decoders of peer-written payloads: exact lengths, validated values.

func decodeOpen(p []byte) (openMsg, error) {
	if len(p) != 12 && len(p) != 20 {
		return openMsg{}, fmt.Errorf("open frame of %d bytes, want 12 or 20", len(p))
	}
	m := openMsg{port: binary.LittleEndian.Uint16(p), window: binary.LittleEndian.Uint32(p[4:]), gen: binary.LittleEndian.Uint32(p[8:])}
	if len(p) == 20 {
		m.nonce = binary.LittleEndian.Uint64(p[12:])
	}
	if m.window < minWindow || m.window > maxWindow {
		return openMsg{}, fmt.Errorf("open frame window %d outside [%d, %d]", m.window, minWindow, maxWindow)
	}
	return m, nil
}

func decodeAccept(p []byte) (acceptMsg, error) {
	if len(p) != 12 && len(p) != 16 {
		return acceptMsg{}, fmt.Errorf("accept frame of %d bytes, want 12 or 16", len(p))
	}
	m := acceptMsg{id: binary.LittleEndian.Uint32(p), window: binary.LittleEndian.Uint32(p[4:]), gen: binary.LittleEndian.Uint32(p[8:])}
	if len(p) == 16 {
		m.dialGen, m.echoed = binary.LittleEndian.Uint32(p[12:]), true
	}
	if m.id == 0 || m.id > maxID {
		return acceptMsg{}, fmt.Errorf("accept frame id %d outside [1, %d]", m.id, maxID)
	}
	if m.window < minWindow || m.window > maxWindow {
		return acceptMsg{}, fmt.Errorf("accept frame window %d outside [%d, %d]", m.window, minWindow, maxWindow)
	}
	return m, nil
}

func decodeU32(p []byte, what string) (uint32, error) {
	if len(p) != 4 {
		return 0, fmt.Errorf("%s frame of %d bytes, want 4", what, len(p))
	}
	return binary.LittleEndian.Uint32(p), nil
}

func decodeCredit(p []byte) (creditMsg, error) {
	if len(p) != creditSize {
		return creditMsg{}, fmt.Errorf("credit frame of %d bytes, want %d", len(p), creditSize)
	}
	m := creditMsg{consumed: binary.LittleEndian.Uint64(p), gen: binary.LittleEndian.Uint32(p[8:]), floor: binary.LittleEndian.Uint32(p[12:])}
	if f := m.floor &^ floorPooled; f == 0 || f > maxWindow {
		return creditMsg{}, fmt.Errorf("credit frame floor %d outside [1, %d]", m.floor, maxWindow)
	}
	return m, nil
}

func decodeWant(p []byte) (wantMsg, error) {
	if len(p) != wantSize {
		return wantMsg{}, fmt.Errorf("want frame of %d bytes, want %d", len(p), wantSize)
	}
	m := wantMsg{consumed: binary.LittleEndian.Uint64(p), gen: binary.LittleEndian.Uint32(p[8:]), inflight: binary.LittleEndian.Uint32(p[12:])}
	if m.inflight > maxWindow {
		return wantMsg{}, fmt.Errorf("want frame in flight %d beyond %d", m.inflight, maxWindow)
	}
	return m, nil
}
