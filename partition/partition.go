package partition

import (
	"errors"
	"sync"

	"github.com/ntstack/ntstack/internal/prim/ring"
	"github.com/ntstack/ntstack/ntb"
)

// Partition is one ring pair of a session: a TX ring in the peer's window
// and an RX ring in ours.
//
// Locking: TrySend and ArmSpace take the TX lock themselves; BeginTX takes
// it for a batch of Sends that EndTX publishes and releases. The RX ring is
// consumed by whoever holds the RX lock (LockRX or TryLockRX); Peek,
// Release and ArmData require it. A corrupt ring fails the session. Lock
// order is RX before TX; never block on the TX ring while holding the RX
// lock (TrySend does not block).
type Partition struct {
	Index int

	sess              *Session
	dev               ntb.Device
	dataBit, spaceBit uint64

	txMu sync.Mutex
	// txMu protects the following fields.
	tx        *ring.Producer
	ringEnd   bool               // EndTX rings the peer whether or not it sleeps armed (RingOnEnd)
	overwrite func(below uint64) // see OnOverwrite

	rxMu sync.Mutex
	// rxMu protects the following fields.
	rx *ring.Consumer
}

// DataBit is the doorbell bit the peer rings when it publishes records for
// us; SpaceBit the one it rings when it hands back room in our TX ring.
func (p *Partition) DataBit() uint64  { return p.dataBit }
func (p *Partition) SpaceBit() uint64 { return p.spaceBit }

// MaxPayload is the largest record TrySend accepts.
func (p *Partition) MaxPayload() int { return p.tx.MaxPayload() }

// RxRingSize is the capacity of the partition's inbound ring, in bytes.
func (p *Partition) RxRingSize() int { return p.rx.Size() }

// Session is the session the partition belongs to.
func (p *Partition) Session() *Session { return p.sess }

// TrySend publishes one record made of hdr followed by body, tagged with tag
// (≤ ring.MaxTag), and rings the peer if it sleeps. It never blocks: with
// no room it returns ring.ErrFull (arm with ArmSpace before sleeping). After
// the session ends it returns the session's error.
func (p *Partition) TrySend(tag uint32, hdr, body []byte) error {
	p.BeginTX()
	err := p.Send(tag, hdr, body)
	p.EndTX()
	return err
}

// BeginTX takes the TX lock and opens a batch: records sent until EndTX
// become visible to the peer together, with one store and at most one
// doorbell.
func (p *Partition) BeginTX() {
	p.txMu.Lock()
	p.tx.BeginBatch()
}

// TryBeginTX is BeginTX if the TX lock is free; it reports whether it
// took it.
func (p *Partition) TryBeginTX() bool {
	if !p.txMu.TryLock() {
		return false
	}
	p.tx.BeginBatch()
	return true
}

// Send adds one record to the batch (between BeginTX and EndTX), as
// TrySend does.
func (p *Partition) Send(tag uint32, hdr, body []byte) error {
	b, err := p.reserve(len(hdr) + len(body))
	if err != nil {
		return err
	}
	copy(b, hdr)
	copy(b[len(hdr):], body)
	p.tx.Commit(tag)
	return nil
}

// SendRef is Send of a record of body alone that also says where its
// payload lies: ref aliases the peer's memory, at is its write position
// (ring.Producer.Position). The bytes stay there until a later record of
// this ring overwrites them (see OnOverwrite) — the peer's ring formats
// rewrite only its headers — so a sender on a device whose outbound
// window is shared memory (ntb.SharedWindow) may keep them by reference
// and read them back, even after the session has ended, as long as no
// later session has written the ring yet.
func (p *Partition) SendRef(tag uint32, body []byte) (ref []byte, at uint64, err error) {
	b, err := p.reserve(len(body))
	if err != nil {
		return nil, 0, err
	}
	copy(b, body)
	at = p.tx.Reserved()
	p.tx.Commit(tag)
	return b, at, nil
}

// SendFill is SendRef of a record that fill writes in place: fill gets
// room for up to max payload bytes in the peer's memory and returns how
// many it wrote there. A record of what it wrote is added to the batch;
// if it wrote nothing, none is, and ref is empty. It saves the copy of a
// source that can write into memory itself (a socket's read).
func (p *Partition) SendFill(tag uint32, max int, fill func(b []byte) int) (ref []byte, at uint64, err error) {
	b, err := p.reserve(max)
	if err != nil {
		return nil, 0, err
	}
	n := fill(b)
	if n <= 0 {
		p.tx.Cancel()
		return nil, 0, nil
	}
	p.tx.Shrink(n)
	at = p.tx.Reserved()
	p.tx.Commit(tag)
	return b[:n:n], at, nil
}

// OnOverwrite installs fn, which Send, SendRef and SendFill call (TX lock
// held) before each record they write (SendFill: for all the room it
// reserves), with the write position below which
// that record overwrites what earlier laps of the ring left: whoever
// keeps references into the ring (SendRef) copies out there what it
// still needs. Install it before the first Send.
func (p *Partition) OnOverwrite(fn func(below uint64)) { p.overwrite = fn }

// reserve reserves n payload bytes in the TX ring (TX lock held), after
// the overwrite hook has seen what the record will overwrite.
func (p *Partition) reserve(n int) ([]byte, error) {
	if p.sess.dead.Load() {
		if err := p.sess.Err(); err != nil {
			return nil, err
		}
		return nil, ErrSessionEnded // failing: the cause is being recorded
	}
	if p.overwrite != nil {
		if r, size := p.tx.Reach(n), uint64(p.tx.Size()); r > size {
			p.overwrite(r - size)
		}
	}
	b, err := p.tx.Reserve(n)
	if err != nil && errors.Is(err, ring.ErrCorrupt) {
		p.sess.fail(err)
	}
	return b, err
}

// EndTX publishes the batch, rings the peer if it sleeps and releases the
// TX lock.
func (p *Partition) EndTX() {
	wake := p.tx.EndBatch() || p.ringEnd
	p.ringEnd = false
	p.txMu.Unlock()
	if wake {
		_ = p.dev.RingPeer(p.dataBit)
	}
}

// RingOnEnd has the batch's EndTX ring DataBit even if the peer has not
// armed it (between BeginTX and EndTX): for a record the peer may be
// waiting for with its ring unarmed, as an endpoint with an Accept pending
// does between calls (transport's poller).
func (p *Partition) RingOnEnd() { p.ringEnd = true }

// ArmSpace asks the peer to ring SpaceBit when it hands back room, and
// reports whether room for n payload bytes appeared meanwhile (then do not
// sleep). After the session ends it reports false and touches nothing.
func (p *Partition) ArmSpace(n int) bool {
	p.txMu.Lock()
	defer p.txMu.Unlock()
	if p.sess.dead.Load() {
		return false // no room will come; the window may already be another session's
	}
	p.tx.ArmSpaceWake()
	free, err := p.tx.Free()
	return err != nil || free >= n+64 // a record, its padding and the next header
}

// TryLockRX takes the RX lock if it is free.
func (p *Partition) TryLockRX() bool { return p.rxMu.TryLock() }

// LockRX takes the RX lock.
func (p *Partition) LockRX() { p.rxMu.Lock() }

// UnlockRX releases the RX lock.
func (p *Partition) UnlockRX() { p.rxMu.Unlock() }

// Peek returns the next record (RX lock held). payload aliases the ring and
// is valid until Release. err is the session's end or the ring's
// corruption.
func (p *Partition) Peek() (tag uint32, payload []byte, ok bool, err error) {
	if p.sess.dead.Load() {
		return 0, nil, false, p.sess.Err()
	}
	tag, payload, ok, err = p.rx.Peek()
	if err != nil {
		p.sess.fail(err)
	}
	return tag, payload, ok, err
}

// Ahead shows fn the records after the one Peek returned, for fn to take
// some out of order (RX lock held; see ring.Consumer.Ahead). err is the
// session's end or the ring's corruption.
func (p *Partition) Ahead(limit int, fn func(tag uint32, payload []byte) (take, stop bool)) error {
	if p.sess.dead.Load() {
		return p.sess.Err()
	}
	err := p.rx.Ahead(limit, fn)
	if err != nil {
		p.sess.fail(err)
	}
	return err
}

// Release consumes the record returned by Peek (RX lock held), and the
// records taken ahead of it that follow it.
func (p *Partition) Release() {
	if p.rx.Release() {
		_ = p.dev.RingPeer(p.spaceBit)
	}
}

// ArmData asks the peer to ring DataBit on its next record (RX lock held).
// Peek again before sleeping.
func (p *Partition) ArmData() { p.rx.ArmDataWake() }
