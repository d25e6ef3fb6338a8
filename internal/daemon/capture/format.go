// Package capture records the frames crossing an ntstack link to pcapng
// files that Wireshark, tshark and gopacket read.
//
// A transport.Endpoint tap (Endpoint.AddTap) sees every frame the endpoint
// writes into or takes off a ring; StartTap copies them (snapped to a few
// hundred bytes by default) into a bounded queue, and a Writer writes each as
// one packet of link type LINKTYPE_USER0: the 24-byte pseudo-header drawn
// below, then the frame's payload. LayerTypeNTStack decodes that with
// gopacket (and LayerTypeNTStackLeg the header of an ntproxy leg frame
// inside a DATA payload); ntstack.lua, written out by `ntmon capture -lua`,
// does the same for Wireshark.
//
// On a host, ntproxy streams captures of its rack links from its admin
// socket (Path, Request) and `ntmon capture` saves them (Fetch):
//
//	ntmon capture -link ntb0 -count 200 -w kv.pcapng   # ntb0: a link name or the peer's host name
//	ntmon capture -link ntb0 -conn 3 -duration 10s -w conn3.pcapng
//	ntmon capture -lua ntstack.lua                    # the Wireshark dissector
//	tshark -r kv.pcapng -X lua_script:ntstack.lua -T fields -e ntstack.dir -e ntstack.kind -e ntstack.conn
//	wireshark -X lua_script:ntstack.lua kv.pcapng      # or copy it to ~/.local/lib/wireshark/plugins/
//
// Why LINKTYPE_USER0 (147): ntstack frames have no link type of their own,
// and tcpdump.org reserves USER0..USER15 (147..162) for private protocols.
// Wireshark dissects them through the "wtap_encap" table entry wtap.USER0,
// where ntstack.lua registers. Other private protocols use 147 too, so each
// file says what it holds in its section header comment, and every packet
// starts with a version byte a decoder checks.
//
// Concurrency: a Tap is fed from the data path concurrently and read by one
// goroutine; a Writer is used by one goroutine at a time. The layer decoders
// are safe for concurrent use. Lifetime: a Tap's records own their payload
// copies; Stop a Tap, or it keeps costing the data path a copy per frame.
package capture

import (
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"time"

	"github.com/gopacket/gopacket/layers"
	"github.com/ntstack/ntstack/internal/transport"
)

// LinkType is the pcap link type of ntstack captures: LINKTYPE_USER0.
const LinkType = layers.LinkType(147)

// The pseudo-header, version 1. Every packet of a capture starts with it,
// little-endian; the capturing process writes all of it (peer-written
// bytes are only the payload, and the conn id of a received frame):
//
//	off  size  field
//	  0     1  version   1
//	  1     1  hdrlen    24: the payload starts here (a later version may append fields)
//	  2     1  dir       0 tx: the capturing end wrote the frame; 1 rx: it read it
//	  3     1  ring      data partition 0..29, or 255: the control ring
//	  4     1  kind      1 OPEN, 2 ACCEPT, 3 REFUSE, 4 DATA, 5 FIN, 6 CLOSE, 7 CREDIT, 8 MOVE, 9 WANT
//	  5     1  flags     bit 0 (FlagLeg): the link joins two ntproxies, DATA carries leg frames
//	  6     2  reserved  0
//	  8     4  conn      ring tag bits 0..19: the connection id at the frame's receiver (OPEN: the dialer's)
//	 12     4  local     the capturing end's connection id, 0: none (a received OPEN, a REFUSE sent)
//	 16     4  length    the frame's payload length in the ring
//	 20     4  link      LinkID of the link's name (the pcapng interface's name)
//	 24        payload   the first min(length, snap) bytes of the frame's payload
//
// So a packet's original length is 24+length and its captured length
// 24+min(length, snap). The payload of each kind is as in internal/transport/frame.go:
//
//	OPEN    port u16, 0 u16, window u32, gen u32[, nonce u64] (12 or 20)
//	RESUME  nonce u64, received u64, credit u64, floor u32, id u32 (32)
//	RESET   nonce u64 (8)
//	ACCEPT  id u32, window u32, gen u32[, dialgen u32] (12 or 16)
//	REFUSE  code u32                                 (4)
//	DATA    stream bytes (on a FlagLeg link: leg frames, see LegHeaderLen)
//	FIN, CLOSE  nothing
//	CREDIT  consumed u64, gen u32, floor u32         (16)
//	MOVE    partition u32                            (4)
//	WANT    consumed u64, gen u32, inflight u32      (16)
const (
	Version = 1

	offVersion  = 0
	offHdrLen   = 1
	offDir      = 2
	offRing     = 3
	offKind     = 4
	offFlags    = 5
	offReserved = 6
	offConn     = 8
	offLocal    = 12
	offLength   = 16
	offLink     = 20
	HeaderLen   = 24

	// RingControl is the ring byte of a frame on the control ring.
	RingControl = 255

	// FlagLeg marks a capture of a link between two ntproxies.
	FlagLeg = 1 << 0
)

// Snap lengths: payload bytes kept per frame. MinSnap keeps every control
// frame whole (ACCEPT and CREDIT, the largest, have 16 bytes) and a leg header; MaxSnap
// keeps a whole ntproxy record (64 KiB and a 13-byte leg header).
const (
	DefaultSnap = 512
	MinSnap     = 32
	MaxSnap     = 64<<10 + 64
)

// Record is one captured frame.
type Record struct {
	Time time.Time
	Dir  transport.TapDir
	Ring int // data partition, or transport.TapControl
	Kind transport.FrameKind
	Leg  bool   // FlagLeg
	Conn uint32 // see the pseudo-header
	// Local is the capturing end's connection id, 0: none.
	Local uint32
	// Link names the link; the pseudo-header carries LinkID(Link).
	Link string
	// Length is the frame's payload length; Payload its first bytes
	// (len(Payload) ≤ Length).
	Length  int
	Payload []byte
}

// LinkID is the pseudo-header's link field for a link name: its 32-bit
// FNV-1a hash.
func LinkID(name string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(name))
	return h.Sum32()
}

// AppendPacket appends r as one packet (pseudo-header and payload) to b.
func AppendPacket(b []byte, r *Record) ([]byte, error) {
	if r.Length < 0 || len(r.Payload) > r.Length || uint64(r.Length) > math.MaxUint32 {
		return b, fmt.Errorf("encode record: %d payload bytes of %d", len(r.Payload), r.Length)
	}
	ring := RingControl
	if r.Ring != transport.TapControl {
		if r.Ring < 0 || r.Ring >= RingControl {
			return b, fmt.Errorf("encode record: ring %d", r.Ring)
		}
		ring = r.Ring
	}
	var flags byte
	if r.Leg {
		flags |= FlagLeg
	}
	var h [HeaderLen]byte
	h[offVersion] = Version
	h[offHdrLen] = HeaderLen
	h[offDir] = byte(r.Dir)
	h[offRing] = byte(ring)
	h[offKind] = byte(r.Kind)
	h[offFlags] = flags
	binary.LittleEndian.PutUint16(h[offReserved:], 0)
	binary.LittleEndian.PutUint32(h[offConn:], r.Conn)
	binary.LittleEndian.PutUint32(h[offLocal:], r.Local)
	binary.LittleEndian.PutUint32(h[offLength:], uint32(r.Length))
	binary.LittleEndian.PutUint32(h[offLink:], LinkID(r.Link))
	b = append(b, h[:]...)
	return append(b, r.Payload...), nil
}

// Leg frames (internal/daemon/proxy/leg.go), inside DATA payloads on a FlagLeg
// link, little-endian:
//
//	off  size  field
//	  0     1  type    1 data, 2 ack, 3 fin, 4 reset
//	  1     8  seq     data: the first byte's number; ack: the next byte expected; fin: the stream's length
//	  9     4  len     payload length (data; 0 otherwise), at most LegMaxPayload
//	 13        payload
//
// A leg frame with up to 8 KiB of payload is one write, one with more is
// two: its header alone, then the payload, straight from the proxy's
// buffer. A DATA frame on a proxy link holds up to a full leg frame, so
// DATA frames and leg frames (or a data frame's header) coincide — except
// when the peer's credit cuts a write in two, and for the connection's
// first bytes (the proxies' JSON handshake). So a DATA payload is read as
// a leg frame only if its header is well formed and accounts for exactly
// the frame's length, or is a data frame's header alone (its payload is
// the next DATA frame's, plain payload); otherwise it stays plain payload.
const (
	legOffType = 0
	legOffSeq  = 1
	legOffLen  = 9
	// LegHeaderLen is the size of a leg frame's header.
	LegHeaderLen = 13
	// LegMaxPayload bounds a leg frame's payload (the proxies'
	// legMaxPayload; a peer that did not say takes 64 KiB).
	LegMaxPayload = 256 << 10

	LegData  = 1
	LegAck   = 2
	LegFin   = 3
	LegReset = 4
)

// isLegFrame reports whether a DATA payload whose first bytes are p and
// whose length in the ring is length is exactly one leg frame, or a data
// frame's header written apart from its payload.
func isLegFrame(p []byte, length uint32) bool {
	if len(p) < LegHeaderLen {
		return false
	}
	typ, n := p[legOffType], binary.LittleEndian.Uint32(p[legOffLen:])
	switch {
	case typ < LegData || typ > LegReset:
		return false
	case n > LegMaxPayload || (typ != LegData && n != 0):
		return false
	}
	return uint64(LegHeaderLen)+uint64(n) == uint64(length) || (length == LegHeaderLen && typ == LegData)
}
