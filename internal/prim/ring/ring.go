// Package ring is a single-producer, single-consumer record ring over two
// pieces of shared memory, built for a link where writes are cheap and reads
// across it are not.
//
// The records live in the consumer's memory (the producer writes them
// remotely); the consumer's read index is written back lazily into a small
// control block in the producer's memory. Each side therefore polls only
// its own memory and writes only the other's: nobody reads an index across
// the bridge, and no word is written by both sides.
//
// Data region (consumer's memory; "C" = written by the consumer, "P" = by
// the producer):
//
//	off  size  by  field
//	  0     4   C  magic "NTRG"
//	  4     2   C  layout version
//	  6     2   C  header size (64)
//	  8     8   C  data size S (power of two, 4 KiB .. 1 GiB)
//	 16     8   P  space-wake generation: "ring me when you write back"
//	 24    40   -  reserved
//	 64     S   P  records
//
// Control block (producer's memory):
//
//	off  size  by  field
//	  0     4   P  magic "NTRC"
//	  4     2   P  layout version
//	  6     2   -  reserved
//	  8     8   C  read index written back (bytes consumed, monotonic)
//	 16     8   C  data-wake generation: "ring me when you publish"
//	 24    40   -  reserved
//
// A record is an 8-byte header followed by its payload, padded to 8 bytes.
// The producer writes the payload first, then stores the header with one
// atomic 8-byte store: the header publishes the record. Before publishing it
// zeroes the word after the record, so the consumer always finds either a
// zero word (nothing yet) or a fresh header, never stale bytes of an earlier
// lap. A record never wraps; a padding record fills the end of the ring.
//
// Header (little-endian uint64):
//
//	bits  0..31  payload length in bytes
//	bits 32..39  flags: 0x01 valid, 0x02 padding, 0x04 write back read index
//	bits 40..63  tag, opaque to the ring (the link layer's frame type and
//	             connection id)
//
// Lazy write-back: the producer keeps a shadow of the read index and only
// refreshes it from its control block. When the ring, as the producer sees
// it, is at least half full after a record, that record carries flag 0x04
// and the consumer writes its read index back after releasing it. A record
// is at most a quarter of the ring (MaxPayload), so a producer that finds no
// room always has a flagged record still unconsumed, and will hear back.
//
// Concurrency: a Producer and a Consumer are each used by one goroutine at a
// time (callers serialise with a lock). The package does no I/O: Commit and
// Release return whether the peer asked to be woken, and the caller rings the
// doorbell.
package ring

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Layout constants; see the package comment.
const (
	HeaderSize = 64 // bytes before the records in the data region
	CtlSize    = 64 // bytes of the control block

	Version = 1

	MinSize = 4 << 10
	MaxSize = 1 << 30

	dataMagic = 0x4752544e // "NTRG"
	ctlMagic  = 0x4352544e // "NTRC"

	offMagic     = 0
	offVersion   = 4
	offHdrSize   = 6
	offSize      = 8
	offSpaceWake = 16

	offReadIdx  = 8
	offDataWake = 16

	recHdr = 8 // record header size

	flagValid     = 0x01
	flagPad       = 0x02
	flagWriteBack = 0x04
	knownFlags    = flagValid | flagPad | flagWriteBack

	// MaxTag is the largest tag a record can carry.
	MaxTag = 1<<24 - 1
)

var (
	// ErrFull means the ring has no room for the record now; retry after
	// the consumer writes its read index back.
	ErrFull = errors.New("ring full")
	// ErrCorrupt wraps every inconsistency found in peer-written memory.
	// A ring that returned it stays failed.
	ErrCorrupt = errors.New("ring corrupt")
	// ErrLayout reports a region whose magic, version or size does not
	// match this build.
	ErrLayout = errors.New("ring layout mismatch")
)

// RegionSize is the bytes a data region with a ring of size bytes takes.
func RegionSize(size int) int { return HeaderSize + size }

// SizeFor returns the largest valid ring size whose data region fits in n
// bytes, or 0 if none does.
func SizeFor(n int) int {
	s := MaxSize
	for s >= MinSize {
		if RegionSize(s) <= n {
			return s
		}
		s >>= 1
	}
	return 0
}

// Format initialises a data region in the consumer's own memory for a ring
// of RegionSize(len)-HeaderSize bytes. The producer must not be attached.
func Format(data []byte) error {
	size := len(data) - HeaderSize
	if err := checkSize(size); err != nil {
		return fmt.Errorf("format ring: %w", err)
	}
	if err := checkAligned(data); err != nil {
		return fmt.Errorf("format ring: %w", err)
	}
	clear(data[:HeaderSize])
	binary.LittleEndian.PutUint32(data[offMagic:], dataMagic)
	binary.LittleEndian.PutUint16(data[offVersion:], Version)
	binary.LittleEndian.PutUint16(data[offHdrSize:], HeaderSize)
	binary.LittleEndian.PutUint64(data[offSize:], uint64(size))
	store64(data, HeaderSize, 0) // no record at position 0 yet
	return nil
}

// FormatCtl initialises a control block in the producer's own memory.
func FormatCtl(ctl []byte) error {
	if len(ctl) < CtlSize {
		return fmt.Errorf("format ring control: %d bytes, need %d: %w", len(ctl), CtlSize, ErrLayout)
	}
	if err := checkAligned(ctl); err != nil {
		return fmt.Errorf("format ring control: %w", err)
	}
	clear(ctl[:CtlSize])
	binary.LittleEndian.PutUint32(ctl[offMagic:], ctlMagic)
	binary.LittleEndian.PutUint16(ctl[offVersion:], Version)
	return nil
}

func checkSize(size int) error {
	if size < MinSize || size > MaxSize || size&(size-1) != 0 {
		return fmt.Errorf("ring size %d is not a power of two in [%d, %d]: %w", size, MinSize, MaxSize, ErrLayout)
	}
	return nil
}

// checkRegion validates a data region header. It is read once, at attach.
func checkRegion(data []byte) (int, error) {
	if len(data) < HeaderSize+MinSize {
		return 0, fmt.Errorf("data region of %d bytes is too small: %w", len(data), ErrLayout)
	}
	if m := binary.LittleEndian.Uint32(data[offMagic:]); m != dataMagic {
		return 0, fmt.Errorf("data region magic %#x, want %#x: %w", m, dataMagic, ErrLayout)
	}
	if v := binary.LittleEndian.Uint16(data[offVersion:]); v != Version {
		return 0, fmt.Errorf("data region version %d, this build speaks %d: %w", v, Version, ErrLayout)
	}
	if h := binary.LittleEndian.Uint16(data[offHdrSize:]); h != HeaderSize {
		return 0, fmt.Errorf("data region header size %d, want %d: %w", h, HeaderSize, ErrLayout)
	}
	size := binary.LittleEndian.Uint64(data[offSize:])
	if size > MaxSize || int(size) != len(data)-HeaderSize {
		return 0, fmt.Errorf("data region says %d bytes of ring, region holds %d: %w", size, len(data)-HeaderSize, ErrLayout)
	}
	if err := checkSize(int(size)); err != nil {
		return 0, err
	}
	return int(size), checkAligned(data)
}

func checkCtl(ctl []byte) error {
	if len(ctl) < CtlSize {
		return fmt.Errorf("control block of %d bytes, need %d: %w", len(ctl), CtlSize, ErrLayout)
	}
	if m := binary.LittleEndian.Uint32(ctl[offMagic:]); m != ctlMagic {
		return fmt.Errorf("control block magic %#x, want %#x: %w", m, ctlMagic, ErrLayout)
	}
	if v := binary.LittleEndian.Uint16(ctl[offVersion:]); v != Version {
		return fmt.Errorf("control block version %d, this build speaks %d: %w", v, Version, ErrLayout)
	}
	return checkAligned(ctl)
}

func align8(n int) int { return (n + 7) &^ 7 }

// MaxPayloadFor is the largest payload a ring of size bytes accepts: a
// quarter of the ring less a header, so that a record plus its worst-case
// padding never needs more than half the ring (see the package comment).
func MaxPayloadFor(size int) int { return size/4 - 2*recHdr }

func encodeHeader(n int, flags uint8, tag uint32) uint64 {
	return uint64(uint32(n)) | uint64(flags)<<32 | uint64(tag&MaxTag)<<40
}

// Producer writes records into a ring in the peer's memory.
type Producer struct {
	data []byte // remote: the consumer's data region
	ctl  []byte // local: our control block, written back by the consumer
	size uint64
	mask uint64

	write  uint64 // bytes published, monotonic
	shadow uint64 // consumer's read index as last seen in ctl

	// reservation in progress
	resPos  uint64 // ring offset of the reserved record's header
	resLen  int
	padPos  uint64 // ring offset of the padding record, if any
	padLen  int
	pending bool

	// Batch state: the held-back header that publishes the batch.
	batching, held bool
	heldPos        uint64
	heldHdr        uint64

	dataWakeSeen uint64 // last data-wake generation we answered
	spaceGen     uint64 // our space-wake generation
	err          error
}

// NewProducer attaches the producing side to a freshly formatted ring.
// data is the consumer's data region (formatted by the consumer), ctl our
// control block (formatted by FormatCtl). Both must stay mapped while the
// Producer is used.
func NewProducer(data, ctl []byte) (*Producer, error) {
	size, err := checkRegion(data)
	if err != nil {
		return nil, fmt.Errorf("attach ring producer: %w", err)
	}
	if err := checkCtl(ctl); err != nil {
		return nil, fmt.Errorf("attach ring producer: %w", err)
	}
	// Indices and wake generations start at zero, the formatted values:
	// the consumer may have armed a wake already, which must still count.
	return &Producer{data: data[:HeaderSize+size], ctl: ctl[:CtlSize], size: uint64(size), mask: uint64(size) - 1}, nil
}

// Size is the ring's data size in bytes.
func (p *Producer) Size() int { return int(p.size) }

// MaxPayload is the largest payload Reserve accepts.
func (p *Producer) MaxPayload() int { return MaxPayloadFor(int(p.size)) }

// Err returns the error that failed the producer, if any.
func (p *Producer) Err() error { return p.err }

// refresh reloads the consumer's read index from our own memory and
// validates it against what we have written.
func (p *Producer) refresh() error {
	r := load64(p.ctl, offReadIdx)
	if r-p.shadow > p.write-p.shadow { // r < shadow or r > write, wrap-safe
		p.err = fmt.Errorf("read index %d outside [%d, %d]: %w", r, p.shadow, p.write, ErrCorrupt)
		return p.err
	}
	p.shadow = r
	return nil
}

// Free is the room the producer currently believes the ring has, after
// refreshing its shadow of the read index.
func (p *Producer) Free() (int, error) {
	if p.err != nil {
		return 0, p.err
	}
	if err := p.refresh(); err != nil {
		return 0, err
	}
	return int(p.size - (p.write - p.shadow)), nil
}

// Reserve returns room for a payload of n bytes. The slice aliases the
// peer's memory; fill it, then call Commit. It is valid only until Commit,
// and only one reservation may be outstanding. Reserve returns ErrFull when
// there is no room now.
func (p *Producer) Reserve(n int) ([]byte, error) {
	if p.err != nil {
		return nil, p.err
	}
	if p.pending {
		panic("ring: Reserve with a reservation outstanding")
	}
	if n < 0 || n > p.MaxPayload() {
		return nil, fmt.Errorf("reserve %d bytes: payload limit is %d", n, p.MaxPayload())
	}
	total := uint64(recHdr + align8(n))
	pos := p.write & p.mask
	pad := uint64(0)
	if pos+total > p.size {
		pad = p.size - pos
	}
	need := pad + total + recHdr // + the zero word after the record
	if p.size-(p.write-p.shadow) < need {
		if err := p.refresh(); err != nil {
			return nil, err
		}
		if p.size-(p.write-p.shadow) < need {
			return nil, ErrFull
		}
	}
	p.pending = true
	p.resLen = n
	p.padLen = int(pad)
	p.padPos = pos
	p.resPos = (pos + pad) & p.mask
	off := HeaderSize + int(p.resPos) + recHdr
	return p.data[off : off+n : off+n], nil
}

// Position is the producer's write position: every byte it has written
// since the ring was formatted, padding and headers included. The byte
// at position q lies at ring offset q mod Size, so a record written up to
// position r overwrites what the lap before left below r-Size.
func (p *Producer) Position() uint64 { return p.write }

// Reach is the write position one past the last byte that a record of n
// payload bytes, reserved now, would write: its padding, its header and
// payload, and the zero word after it.
func (p *Producer) Reach(n int) uint64 {
	total := uint64(recHdr + align8(max(n, 0)))
	pos := p.write & p.mask
	pad := uint64(0)
	if pos+total > p.size {
		pad = p.size - pos
	}
	return p.write + pad + total + recHdr
}

// Reserved is the write position of the outstanding reservation's
// payload (see Position).
func (p *Producer) Reserved() uint64 { return p.write + uint64(p.padLen) + recHdr }

// Shrink cuts the outstanding reservation to its first n payload bytes
// (n ≤ the reserved length), before Commit: for a record filled by a
// source that had less than the room reserved for it.
func (p *Producer) Shrink(n int) {
	if !p.pending || n < 0 || n > p.resLen {
		panic(fmt.Sprintf("ring: Shrink to %d of a %d-byte reservation", n, p.resLen))
	}
	p.resLen = n
}

// Cancel drops the outstanding reservation: nothing was written that the
// consumer can see, and the next Reserve starts where it started.
func (p *Producer) Cancel() {
	if !p.pending {
		panic("ring: Cancel without Reserve")
	}
	p.pending = false
}

// Commit publishes the reserved record with tag (≤ MaxTag). It reports
// whether the consumer asked to be woken: if so, ring its doorbell.
func (p *Producer) Commit(tag uint32) (wake bool) {
	if !p.pending {
		panic("ring: Commit without Reserve")
	}
	p.pending = false
	total := uint64(recHdr + align8(p.resLen))
	end := p.write + uint64(p.padLen) + total
	var flags uint8 = flagValid
	if end-p.shadow >= p.size/2 {
		flags |= flagWriteBack
	}
	store64(p.data, HeaderSize+int((p.resPos+total)&p.mask), 0)
	// The first header of the record (the padding's, if any) publishes it.
	// In a batch the batch's first publishing store is held back until
	// EndBatch: the consumer stops at its zero word and sees nothing after.
	first, firstHdr := p.resPos, encodeHeader(p.resLen, flags, tag)
	if p.padLen > 0 {
		store64(p.data, HeaderSize+int(p.resPos), firstHdr)
		first, firstHdr = p.padPos, encodeHeader(p.padLen-recHdr, flagValid|flagPad, 0)
	}
	p.write = end
	if p.batching {
		if !p.held {
			p.held, p.heldPos, p.heldHdr = true, first, firstHdr
		} else {
			store64(p.data, HeaderSize+int(first), firstHdr)
		}
		return false
	}
	store64(p.data, HeaderSize+int(first), firstHdr)
	return p.wakeWanted()
}

// BeginBatch starts a batch: records committed until EndBatch become
// visible to the consumer together, with one store.
func (p *Producer) BeginBatch() { p.batching = true }

// EndBatch publishes the batch's records and reports, like Commit, whether
// the consumer asked to be woken.
func (p *Producer) EndBatch() (wake bool) {
	p.batching = false
	if !p.held {
		return false
	}
	p.held = false
	store64(p.data, HeaderSize+int(p.heldPos), p.heldHdr)
	return p.wakeWanted()
}

func (p *Producer) wakeWanted() bool {
	if g := load64(p.ctl, offDataWake); g != p.dataWakeSeen {
		p.dataWakeSeen = g
		return true
	}
	return false
}

// ArmSpaceWake asks the consumer to ring our doorbell when it next writes
// its read index back. Re-check Free (or retry Reserve) after arming and
// before sleeping.
func (p *Producer) ArmSpaceWake() {
	p.spaceGen++
	store64(p.data, offSpaceWake, p.spaceGen)
}

// Consumer reads records from a ring in its own memory.
// Size is the ring's data capacity in bytes.
func (c *Consumer) Size() int { return int(c.size) }

type Consumer struct {
	data []byte // local: our data region, written by the producer
	ctl  []byte // remote: the producer's control block
	size uint64
	mask uint64

	read uint64 // bytes consumed, monotonic

	cur      uint64 // header of the record returned by Peek, 0 if none
	curTotal uint64
	taken    []taken // records consumed ahead of the head (see Ahead)

	spaceWakeSeen uint64
	dataGen       uint64
	err           error
}

// NewConsumer attaches the consuming side to a freshly formatted ring.
// data is our data region (formatted by Format), ctl the producer's
// control block.
func NewConsumer(data, ctl []byte) (*Consumer, error) {
	size, err := checkRegion(data)
	if err != nil {
		return nil, fmt.Errorf("attach ring consumer: %w", err)
	}
	if err := checkCtl(ctl); err != nil {
		return nil, fmt.Errorf("attach ring consumer: %w", err)
	}
	return &Consumer{data: data[:HeaderSize+size], ctl: ctl[:CtlSize], size: uint64(size), mask: uint64(size) - 1}, nil
}

// Err returns the error that failed the consumer, if any.
func (c *Consumer) Err() error { return c.err }

func (c *Consumer) fail(format string, args ...any) error {
	c.err = fmt.Errorf(format+": %w", append(args, ErrCorrupt)...)
	return c.err
}

// Peek returns the next record, skipping padding. ok is false when the ring
// is empty. payload aliases our memory and stays valid, unchanged by an
// honest producer, until Release; copy out what must outlive it. A
// misbehaving producer can change payload bytes under the reader but cannot
// make the consumer read or write outside the ring.
func (c *Consumer) Peek() (tag uint32, payload []byte, ok bool, err error) {
	if c.err != nil {
		return 0, nil, false, c.err
	}
	if c.cur != 0 {
		return c.decodeCur()
	}
	for {
		h, total, pad, err := c.header(c.read)
		if err != nil || h == 0 {
			return 0, nil, false, err
		}
		if pad {
			c.read += total
			continue
		}
		c.cur, c.curTotal = h, total
		return c.decodeCur()
	}
}

// header reads and checks the header at read index r: h is 0 when nothing
// is published there; total is the bytes the record takes, pad whether it
// is padding.
func (c *Consumer) header(r uint64) (h, total uint64, pad bool, err error) {
	pos := r & c.mask
	h = load64(c.data, HeaderSize+int(pos))
	if h == 0 {
		return 0, 0, false, nil
	}
	n := uint64(uint32(h))
	flags := uint8(h >> 32)
	if flags&^knownFlags != 0 || flags&flagValid == 0 {
		return 0, 0, false, c.fail("record at %d: flags %#x", r, flags)
	}
	room := c.size - pos // bytes from pos to the end of the ring
	if flags&flagPad != 0 {
		// A record always fits at offset 0, so padding there is never
		// honest (and would make Peek spin forever).
		if pos == 0 || n != room-recHdr || flags&flagWriteBack != 0 || h>>40 != 0 {
			return 0, 0, false, c.fail("padding at %d: length %d, want %d", r, n, room-recHdr)
		}
		return h, room, true, nil
	}
	total = recHdr + (n+7)&^7
	if n > uint64(MaxPayloadFor(int(c.size))) || total > room {
		return 0, 0, false, c.fail("record at %d: length %d overruns the ring", r, n)
	}
	return h, total, false, nil
}

// MaxTaken is how many records beyond the head a consumer holds taken (see
// Ahead) at most.
const MaxTaken = 8

// taken is a record consumed out of order, ahead of the head: its read
// index, the bytes it takes, and whether it asked for a write-back.
type taken struct {
	at, total uint64
	writeBack bool
}

// Ahead calls fn with the published records after the one Peek returned,
// in ring order, at most limit of them, until fn says stop; records taken
// already are passed over. fn may take the record it is given: the
// consumer is then done with it (its payload must be copied out before fn
// returns), and the record is released, its room handed back, when a
// Release of the head reaches it. At most MaxTaken records are held taken;
// Ahead calls fn for none while that many are. It returns the consumer's
// error, if reading ahead found the ring corrupt.
//
// The producer publishes in order and the word after its last record is
// zero (see the package comment), so every header read before the first
// zero one is a record, never a stale word; a batch's records show only
// with its first header.
func (c *Consumer) Ahead(limit int, fn func(tag uint32, payload []byte) (take, stop bool)) error {
	if c.err != nil {
		return c.err
	}
	if c.cur == 0 {
		return nil
	}
	r := c.read + c.curTotal
	for limit > 0 && len(c.taken) < MaxTaken && r-c.read < c.size {
		h, total, pad, err := c.header(r)
		if err != nil || h == 0 {
			return err
		}
		if pad || c.takenAt(r) >= 0 {
			r += total
			continue
		}
		limit--
		off := HeaderSize + int(r&c.mask) + recHdr
		n := int(uint32(h))
		take, stop := fn(uint32(h>>40), c.data[off:off+n:off+n])
		if take {
			c.taken = append(c.taken, taken{at: r, total: total, writeBack: uint8(h>>32)&flagWriteBack != 0})
		}
		if stop {
			return nil
		}
		r += total
	}
	return nil
}

// takenAt is the index in c.taken of the record at read index r, or -1.
func (c *Consumer) takenAt(r uint64) int {
	for i, t := range c.taken {
		if t.at == r {
			return i
		}
	}
	return -1
}

func (c *Consumer) decodeCur() (uint32, []byte, bool, error) {
	off := HeaderSize + int(c.read&c.mask) + recHdr
	n := int(uint32(c.cur))
	return uint32(c.cur >> 40), c.data[off : off+n : off+n], true, nil
}

// Release consumes the record returned by Peek. It reports whether the
// producer asked to be woken: if so, ring its doorbell.
func (c *Consumer) Release() (wake bool) {
	if c.cur == 0 {
		panic("ring: Release without Peek")
	}
	writeBack := uint8(c.cur>>32)&flagWriteBack != 0
	c.read += c.curTotal
	c.cur, c.curTotal = 0, 0
	if len(c.taken) > 0 {
		writeBack = c.passTaken() || writeBack
	}
	if !writeBack {
		return false
	}
	return c.WriteBack()
}

// passTaken moves the head past the taken records (and padding) it has
// reached, and reports whether one of them asked for a write-back.
func (c *Consumer) passTaken() (writeBack bool) {
	for len(c.taken) > 0 {
		if i := c.takenAt(c.read); i >= 0 {
			t := c.taken[i]
			c.read += t.total // as measured when taken
			writeBack = writeBack || t.writeBack
			c.taken = append(c.taken[:i], c.taken[i+1:]...)
			continue
		}
		h, total, pad, err := c.header(c.read)
		if err != nil || !pad || h == 0 {
			return writeBack // an error fails the next Peek
		}
		c.read += total
	}
	return writeBack
}

// WriteBack publishes the read index to the producer now, and reports
// whether the producer asked to be woken. Release calls it when the producer
// asks; call it directly only to hand back room early.
func (c *Consumer) WriteBack() (wake bool) {
	store64(c.ctl, offReadIdx, c.read)
	if g := load64(c.data, offSpaceWake); g != c.spaceWakeSeen {
		c.spaceWakeSeen = g
		return true
	}
	return false
}

// ArmDataWake asks the producer to ring our doorbell when it next
// publishes. Peek again after arming and before sleeping.
func (c *Consumer) ArmDataWake() {
	c.dataGen++
	store64(c.ctl, offDataWake, c.dataGen)
}
