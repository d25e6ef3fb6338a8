package partition

import (
	"encoding/binary"
	"fmt"

	"github.com/ntstack/ntstack/internal/prim/ring"
)

// Window layout. Each side formats its own inbound window; the peer writes
// everything in it afterwards except the header:
//
//	off                     size           written by  what
//	0                       64             owner       window header (below)
//	4 KiB + 64*i            64             peer        control block of our TX ring i, 0 <= i <= P
//	                                                   (the peer, its consumer, writes back its read index)
//	D + i*(64+R)            64 + R         peer        data region of our RX ring of partition i < P
//	                                                   (the peer, its producer, writes records)
//	D + P*(64+R)            64 + C         peer        data region of our RX control ring (ring P)
//
// with D = 4 KiB + 64*(P+1) rounded up to 4 KiB, C = W/64 clamped to
// [4 KiB, 64 KiB] (64 KiB for windows of 4 MiB and more), and R the
// largest power of two with D + P*(64+R) + 64 + C <= W for window size W
// and P data partitions. For the default 16 MiB window: P = 1 gives
// R = 8 MiB (a 16 MiB ring would need 16 MiB + 8 KiB + 64); 8 MiB rings
// stream fastest on this machine class (DESIGN.md §4). P = 2..3 give 4 MiB,
// P = 4..7 give 2 MiB.
//
// The control ring carries flow-control signals (credits) only, so they
// never wait behind bulk data; at 24 bytes a record its 64 KiB hold 2730
// of them, and its sender coalesces when it is full.
//
// Window header:
//
//	off  size  field
//	  0     4  magic "NTBP"
//	  4     2  layout version
//	  6     2  partitions P
//	  8     8  window size W
//	 16     8  ring size R
const (
	winMagic = 0x5042544e // "NTBP"
	// winVersion also versions the frames socklike sends through the
	// rings, so a peer that speaks others is refused at attach, not at its
	// first odd frame. 3: CREDIT carries a floor (16 bytes, not 12).
	winVersion = 3

	offWinMagic      = 0
	offWinVersion    = 4
	offWinPartitions = 6
	offWinSize       = 8
	offWinRing       = 16

	ctlBase = 4096

	// MaxPartitions bounds P so every ring, the control ring included,
	// keeps a doorbell pair (bits 2i, 2i+1) below the session bit.
	MaxPartitions = 30

	// MaxControlRing bounds C, the size of the control ring.
	MaxControlRing = 64 << 10
)

// Layout is the arithmetic of one side's inbound window.
type Layout struct {
	Window      int
	Partitions  int
	RingSize    int
	ControlRing int
	dataBase    int
}

// NewLayout computes the layout of a window of the given size.
func NewLayout(window, partitions int) (Layout, error) {
	if partitions < 1 || partitions > MaxPartitions {
		return Layout{}, fmt.Errorf("partitions %d: want 1..%d", partitions, MaxPartitions)
	}
	l := Layout{Window: window, Partitions: partitions}
	l.dataBase = (ctlBase + ring.CtlSize*(partitions+1) + 4095) &^ 4095
	l.ControlRing = min(max(ring.SizeFor(window/64), ring.MinSize), MaxControlRing)
	if rest := window - l.dataBase - ring.RegionSize(l.ControlRing); rest > 0 {
		l.RingSize = ring.SizeFor(rest / partitions)
	}
	if l.RingSize == 0 {
		return Layout{}, fmt.Errorf("window of %d bytes cannot hold %d partitions of at least %d bytes", window, partitions, ring.MinSize)
	}
	return l, nil
}

// CtlOffset is the window offset of ring i's TX control block (i == P:
// the control ring).
func (l Layout) CtlOffset(i int) int { return ctlBase + ring.CtlSize*i }

// DataOffset is the window offset of ring i's RX data region (i == P: the
// control ring).
func (l Layout) DataOffset(i int) int { return l.dataBase + ring.RegionSize(l.RingSize)*i }

// ringSize is the size of ring i.
func (l Layout) ringSize(i int) int {
	if i == l.Partitions {
		return l.ControlRing
	}
	return l.RingSize
}

// Ctl returns the control block of ring i's TX ring in window w.
func (l Layout) Ctl(w []byte, i int) []byte {
	off := l.CtlOffset(i)
	return w[off : off+ring.CtlSize]
}

// Data returns the data region of ring i's RX ring in window w.
func (l Layout) Data(w []byte, i int) []byte {
	off := l.DataOffset(i)
	return w[off : off+ring.RegionSize(l.ringSize(i))]
}

// format writes the header and formats every ring region of our own
// inbound window.
func (l Layout) format(w []byte) error {
	if len(w) < l.Window {
		return fmt.Errorf("format window: %d bytes, layout needs %d", len(w), l.Window)
	}
	clear(w[:64])
	binary.LittleEndian.PutUint32(w[offWinMagic:], winMagic)
	binary.LittleEndian.PutUint16(w[offWinVersion:], winVersion)
	binary.LittleEndian.PutUint16(w[offWinPartitions:], uint16(l.Partitions))
	binary.LittleEndian.PutUint64(w[offWinSize:], uint64(l.Window))
	binary.LittleEndian.PutUint64(w[offWinRing:], uint64(l.RingSize))
	for i := range l.Partitions + 1 {
		if err := ring.FormatCtl(l.Ctl(w, i)); err != nil {
			return err
		}
		if err := ring.Format(l.Data(w, i)); err != nil {
			return err
		}
	}
	return nil
}

// peerLayout reads and checks the header of the peer's window (our
// outbound window; a read across the bridge, done once per session).
func peerLayout(w []byte, partitions int) (Layout, error) {
	if len(w) < 64 {
		return Layout{}, fmt.Errorf("peer window of %d bytes", len(w))
	}
	magic := binary.LittleEndian.Uint32(w[offWinMagic:])
	version := binary.LittleEndian.Uint16(w[offWinVersion:])
	parts := int(binary.LittleEndian.Uint16(w[offWinPartitions:]))
	size := binary.LittleEndian.Uint64(w[offWinSize:])
	switch {
	case magic != winMagic:
		return Layout{}, fmt.Errorf("peer window magic %#x is not ntstack's %#x", magic, winMagic)
	case version != winVersion:
		return Layout{}, fmt.Errorf("peer speaks window layout version %d, this build speaks %d", version, winVersion)
	case parts != partitions:
		return Layout{}, fmt.Errorf("peer has %d partitions, this side %d: configure both ends alike", parts, partitions)
	case size != uint64(len(w)):
		return Layout{}, fmt.Errorf("peer window header says %d bytes, the window has %d", size, len(w))
	}
	l, err := NewLayout(len(w), parts)
	if err != nil {
		return Layout{}, fmt.Errorf("peer window: %w", err)
	}
	if r := binary.LittleEndian.Uint64(w[offWinRing:]); r != uint64(l.RingSize) {
		return Layout{}, fmt.Errorf("peer window header says rings of %d bytes, its layout gives %d", r, l.RingSize)
	}
	return l, nil
}
