package transport

import (
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/prim/ring"
	"github.com/ntstack/ntstack/partition"
)

// sendHalf is a connection's sending side: the posted write and the
// connection frames queued before more data, the peer's credit, and the
// connection's place on a unit. A Write posts its buffer and whoever
// serves the unit (unit.serve) sends from it; the bytes go out in order,
// and count as sent when they enter the ring.
//
// Credit: sent-peerRead ≤ window, the peer's receive window. The bytes
// between peerRead and sent are in the peer's ring or queue, not yet
// read; a sender that must survive a reset of the link keeps them here
// until the peer's CREDIT covers them (keep, see resume.go).
type sendHalf struct {
	window   int64
	sent     atomic.Int64
	peerRead atomic.Int64
	// movedAt is sent when this side last moved the connection to
	// another partition (-1: never); see ringRefs.overwrite.
	movedAt atomic.Int64
	prio    atomic.Uint32 // qos.Class
	wdone   atomic.Bool   // the posted write has gone out
	wantOut atomic.Bool   // a WANT to send once the serve pass has published (see unit.serve)

	smu sync.Mutex // taken by whoever serves the connection
	// smu protects the following fields.
	unit     *unit
	slot     int // the partition in unit.parts
	inSched  bool
	unplaced bool       // released: counted on no unit
	frames   []ctlFrame // connection frames to send before more data
	out      []byte     // the posted write
	outOff   int
	// Or a posted fill (ReadSocket): fill writes up to len(b) bytes into
	// a record's room in the ring and returns how many (0: none now); it
	// may fill fillLeft more and has filled filled.
	fill       func(b []byte) int
	fillLeft   int
	filled     int
	waitCredit bool
	peerFloor  int64 // the credit floor from the peer's last CREDIT (0: none, the window)
	peerPooled bool  // the peer gives credit in turns: ask (WANT) when waiting for it
	wantSent   bool  // WANT sent since the writer last waited for credit
	moving     bool  // move to moveUnit/moveSlot before sending more
	moveUnit   *unit
	moveSlot   int
	txBytes    uint64
	txMark     uint64 // txBytes at the last rebalance
	// keep retains the bytes between peerRead and sent (keep.go).
	keep       retention
	resuming   bool       // on a new session, waiting for the peer's RESUME: no DATA
	peerResume *resumeMsg // a RESUME that came before our take-over reached the connection
	resendTo   int64      // retained bytes up to here go again, from sent, before more
	after      []ctlFrame // frames to send once the retained bytes have gone again
}

// Write writes b in frames of at most the MTU, blocking while the peer's
// window or the ring is full. It returns len(b) or an error. b is read by
// whoever serves the connection's unit until Write returns.
func (c *Conn) Write(b []byte) (int, error) {
	c.ep.calls.Add(1)
	c.wlock.Lock()
	defer c.wlock.Unlock()
	c.ep.enterCall()
	defer c.ep.exitCall()
	if err := c.writeErr(); err != nil {
		return 0, err
	}
	if len(b) == 0 {
		return 0, nil
	}
	inline := c.ep.cfg.CoreModel == CoreInline
	if inline && len(b) <= smallWrite && c.sendNow(b) {
		// Take in the credit that came meanwhile, as the schedule's path
		// does before it sends (not under c.smu: a CREDIT for c takes
		// it): a writer whose credit never ran out would otherwise leave
		// its CREDITs in the control ring.
		c.st().pollRing(c.st().control, nil, nil)
		return len(b), nil
	}
	c.smu.Lock()
	c.out, c.outOff = b, 0
	c.wdone.Store(false)
	c.unit.postLocked(c)
	c.smu.Unlock()
	var self *Conn // a small write: serve it first and go (see tryServe)
	if len(b) <= smallWrite {
		self = c
	}
	if err := c.awaitWrite(self, len(b) > yieldAbove); err != nil {
		return c.retract(), err
	}
	return len(b), nil
}

// awaitWrite waits until the posted write has gone out (nil) or cannot
// (the error), serving the unit meanwhile in the inline core model. self
// is the connection of a small write (see tryServe); bulk, a write of more
// than yieldAbove.
func (c *Conn) awaitWrite(self *Conn, bulk bool) error {
	inline := c.ep.cfg.CoreModel == CoreInline
	sp := spinner{ep: c.ep, c: c, short: c.sporadic.Load()}
	defer sp.stop()
	for {
		if c.wdone.Load() {
			return nil
		}
		if err := c.writeErr(); err != nil {
			return err
		}
		var wait time.Duration
		contended := false
		if inline {
			// Credits, ring space, and (for a bulk write) serving the unit.
			c.st().pollServe(nil, nil, self == nil)
			if c.wdone.Load() {
				continue
			}
			c.smu.Lock()
			u := c.unit
			c.smu.Unlock()
			var progress bool
			if progress, wait, contended = u.tryServe(self); progress {
				if bulk {
					runtime.Gosched() // let a small flow's goroutine in (see yieldAbove)
				}
				continue
			}
		}
		if sp.spin() {
			continue
		}
		// Park until the write completes (whoever serves the unit signals
		// wnotify), credit arrives, or ring space does.
		var extra <-chan struct{}
		var bucket *time.Timer // stopped once the park it is for ends
		switch {
		case wait > 0: // a token bucket
			extra, bucket = afterChan(wait)
		case inline:
			extra = c.ep.spaceWait()
			c.smu.Lock()
			u, credit := c.unit, c.waitCredit
			c.smu.Unlock()
			if !contended && !credit {
				// Blocked on ring space: arm, and look again if
				// room appeared meanwhile.
				if u.armSpace() {
					runtime.Gosched()
					continue
				}
			}
		}
		c.ep.writersOut.Add(1)
		c.ep.busy()
		c.park(&sp, c.wnotify, c.wdl, extra)
		if bucket != nil {
			bucket.Stop()
		}
		c.ep.writersOut.Add(-1)
	}
}

// afterChan returns a channel, for park, closed once d has passed, and the
// timer that closes it. Stopping the timer leaves nothing behind: no
// goroutine waits on it.
func afterChan(d time.Duration) (<-chan struct{}, *time.Timer) {
	ch := make(chan struct{})
	return ch, time.AfterFunc(d, func() { close(ch) })
}

// retract withdraws the posted write and returns how much of it went out.
func (c *Conn) retract() int {
	c.smu.Lock()
	defer c.smu.Unlock()
	n := c.outOff
	if c.out == nil {
		n = 0
		if c.wdone.Load() {
			return 0
		}
	}
	c.out, c.outOff = nil, 0
	return n
}

// serveOnce sends for c, on behalf of unit u, the frames it has queued and
// up to Config.Batch bytes of its posted write. open and full are the
// unit's partition slots with a batch open and found full in this pass,
// moved the DATA bytes the pass has sent (serveOnce adds its own). It
// reports whether it sent anything, how long a token bucket asks to wait,
// and whether c has more to send now.
func (c *Conn) serveOnce(u *unit, open, full *uint64, moved *int) (sent bool, wait time.Duration, more bool) {
	c.smu.Lock()
	defer c.smu.Unlock()
	c.inSched = false
	if c.unit != u {
		return false, 0, c.hasWorkLocked() // moved while queued
	}
	slot := c.slot
	if *full&(1<<slot) != 0 {
		return false, 0, true
	}
	p := u.parts[slot]
	begin := func() { // the pass's batch on p, opened once
		if *open&(1<<slot) == 0 {
			p.BeginTX()
			*open |= 1 << slot
		}
	}
	send := func(tag uint32, body []byte) error {
		begin()
		return c.txLocked(p, tag, body)
	}
	failed := func(err error) (bool, time.Duration, bool) {
		if errors.Is(err, ring.ErrFull) {
			c.ep.counters.ringFull.Add(1)
			*full |= 1 << slot
			return sent, 0, true
		}
		c.wake(c.wnotify) // the session is gone: the writer sees it
		return sent, 0, false
	}
	for len(c.frames) > 0 {
		f := &c.frames[0]
		if err := send(f.tag, f.body[:f.n]); err != nil {
			return failed(err)
		}
		if kind, _ := splitTag(f.tag); kind == kindOpen {
			p.RingOnEnd() // the listener's poller waits for it unarmed (acceptPause)
		}
		c.frames = c.frames[:copy(c.frames, c.frames[1:])]
		sent = true
	}
	if c.moving {
		// MOVE is our last frame on the old partition; the new one may
		// carry the next before this batch is even published: the peer
		// holds it until it has read the MOVE.
		to := c.moveUnit.parts[c.moveSlot]
		if err := send(makeTag(kindMove, c.peerID), le32(uint32(to.Index))); err != nil {
			return failed(err)
		}
		c.movedAt.Store(c.sent.Load())
		if !c.unplaced {
			c.unit.unplace(c.slot)
		}
		c.unit, c.slot, c.moving = c.moveUnit, c.moveSlot, false
		c.ep.counters.migrations.Add(1)
		if !c.unplaced {
			c.unit.mu.Lock()
			c.unit.conns[c.slot]++
			c.unit.mu.Unlock()
		}
		return true, 0, c.hasWorkLocked()
	}
	if c.resuming {
		return sent, 0, false // the peer's RESUME posts us again
	}
	if c.resendTo > c.sent.Load() || len(c.after) > 0 {
		s, err, wait := c.resendLocked(p, send, c.ep.cfg.Batch)
		sent = sent || s
		if err != nil {
			return failed(err)
		}
		if wait {
			if c.waitCredit {
				c.ep.counters.creditWaits.Add(1)
				return sent, 0, false // credit() queues us again
			}
			return sent, 0, true
		}
	}
	if c.out == nil && c.fill == nil {
		return sent, 0, false
	}
	cfg := &c.ep.cfg
	// Retained by copy, the bytes this call sends are copied (keepLocked)
	// once they are out: a bulk run is published first, so the peer reads
	// it while this end copies it, and before the writer has its buffer
	// back. By reference, sendDataLocked has retained them already.
	keepAt, keepOff := c.sent.Load(), c.outOff
	keep := func() {
		if c.ep.byRef {
			return
		}
		if n := c.outOff - keepOff; n > 0 {
			if n > smallWrite && *open&(1<<slot) != 0 {
				p.EndTX()
				*open &^= 1 << slot
			}
			c.keepLocked(keepAt, c.out[keepOff:c.outOff])
			keepAt, keepOff = keepAt+int64(n), c.outOff
		}
	}
	for budget := cfg.Batch; budget > 0 && c.postedLocked() > 0; {
		credit := c.window - (c.sent.Load() - c.peerRead.Load())
		if credit < c.creditFloor() {
			keep()
			c.ep.counters.creditWaits.Add(1)
			c.waitCredit = true // credit() queues us again
			if c.peerPooled && !c.wantSent {
				c.wantSent = true
				c.wantOut.Store(true)
			}
			return sent, 0, false
		}
		chunk := int(min(int64(c.postedLocked()), int64(cfg.MTU), credit, int64(p.MaxPayload()), int64(budget)))
		if chunk > smallPiece && cfg.MTU <= DefaultMTU && c.st().smallTraffic(p.Index) {
			// A piece, and the pass ends with it: published, and the
			// writer yields before the next (see smallPiece).
			chunk, budget = smallPiece, smallPiece
			*moved += passBytes
		}
		if w := u.take(slot, chunk); w > 0 {
			keep()
			return sent, w, true
		}
		begin()
		if c.fill != nil {
			n, err := c.fillDataLocked(p, chunk, c.fill)
			if err != nil {
				return failed(err)
			}
			c.filled += n
			c.fillLeft -= n
			c.countTx(u, n)
			*moved += n
			budget -= n
			sent = sent || n > 0
			if n < chunk {
				c.fillLeft = 0 // the source holds no more now: the write is done
			}
			continue
		}
		piece := c.out[c.outOff : c.outOff+chunk]
		if err := c.sendDataLocked(p, piece); err != nil {
			keep()
			return failed(err)
		}
		if c.ep.byRef && chunk <= keepSmall {
			c.keepLocked(c.sent.Load()-int64(chunk), piece)
		}
		c.countTx(u, chunk)
		c.outOff += chunk
		*moved += chunk
		budget -= chunk
		sent = true
	}
	keep()
	if c.postedLocked() > 0 {
		return sent, 0, true
	}
	c.out, c.outOff, c.fill = nil, 0, nil
	c.wdone.Store(true)
	c.wake(c.wnotify)
	return sent, 0, false
}

// sendNow sends small write b into the ring at once, without the unit's
// schedule, if nothing can be ahead of it: no connection of the unit is
// queued (so no class, no express write and none of this connection's
// frames), the connection is not moving, no token bucket meters the
// partition, the peer's window has room for all of b and nobody holds the
// partition's TX lock. It reports whether it did; if not (a full ring
// too), the caller queues b as usual.
//
// It never waits for the TX lock while holding c.smu: a serve pass holds
// the TX lock of a batch while it takes the next connection's smu, and
// may have taken c off the schedule (a stale entry) after c's look at the
// queue.
//
// The schedule's queue, pass and hand-back cost a small write more than
// its copy, beside a bulk flow too: its unit is mostly idle, the shared
// window keeping the bulk writer waiting on credit.
func (c *Conn) sendNow(b []byte) bool {
	c.smu.Lock()
	defer c.smu.Unlock()
	u := c.unit
	if !c.nothingAheadLocked() || c.window-(c.sent.Load()-c.peerRead.Load()) < int64(len(b)) {
		return false
	}
	p := u.parts[c.slot]
	if !p.TryBeginTX() {
		return false
	}
	at := c.sent.Load()
	err := c.sendDataLocked(p, b)
	p.EndTX() // publishes it: the retention copy and the counting below are off the round trip
	if err != nil {
		return false
	}
	c.keepLocked(at, b)
	c.countTx(u, len(b))
	c.ep.noteProgress()
	return true
}

// nothingAheadLocked reports whether a record of c's may go into the ring
// now, past the unit's schedule (sendNow, fillNow): no connection of the
// unit is queued, c has no frames, move or resend to send first, and no
// token bucket meters the partition (c.smu held).
func (c *Conn) nothingAheadLocked() bool {
	return c.unit != nil && c.unit.queued.Load() == 0 && len(c.frames) == 0 && !c.moving && !c.resuming &&
		c.resendTo <= c.sent.Load() && len(c.after) == 0 && c.ep.cfg.PartitionRate == 0
}

// txLocked adds a record of c's to p's open batch and shows it to the
// taps (c.smu held).
func (c *Conn) txLocked(p *partition.Partition, tag uint32, body []byte) error {
	if err := p.Send(tag, body, nil); err != nil {
		return err
	}
	if ts := c.ep.taps.Load(); ts != nil {
		ts.emit(c.st(), TapTX, p.Index, tag, c.id, body)
	}
	return nil
}

// sendDataLocked adds b to p's open batch as a DATA record of c's (c.smu
// held). The bytes count as sent before the record is visible: the peer
// may credit them before the batch ends. By reference, a record above
// keepSmall is retained here, where it lies in the ring; otherwise the
// caller retains it (keepLocked) before b is the application's again.
func (c *Conn) sendDataLocked(p *partition.Partition, b []byte) error {
	at := c.sent.Add(int64(len(b))) - int64(len(b))
	tag := makeTag(kindData, c.peerID)
	if !c.ep.byRef || len(b) <= keepSmall {
		if err := c.txLocked(p, tag, b); err != nil {
			c.sent.Add(int64(-len(b)))
			return err
		}
		return nil
	}
	ref, pos, err := p.SendRef(tag, b)
	if err != nil {
		c.sent.Add(int64(-len(b)))
		return err
	}
	c.keep.addRef(at, ref, p, pos, c.peerRead.Load())
	c.unit.st.refs[p.Index].push(c, at+int64(len(b)), pos)
	if ts := c.ep.taps.Load(); ts != nil {
		ts.emit(c.st(), TapTX, p.Index, tag, c.id, b)
	}
	return nil
}

// countTx counts n bytes of DATA c sent through unit u, for rebalancing
// (c.smu held).
func (c *Conn) countTx(u *unit, n int) {
	c.txBytes += uint64(n)
	u.txBytes.Add(uint64(n))
}

// postedLocked is how much more the posted write may send (c.smu held).
func (c *Conn) postedLocked() int {
	if c.fill != nil {
		return c.fillLeft
	}
	return len(c.out) - c.outOff
}

func (c *Conn) hasWorkLocked() bool {
	return len(c.frames) > 0 || c.moving || c.out != nil || c.fill != nil || c.resendTo > c.sent.Load() || len(c.after) > 0
}

// queueFrame queues a connection frame (FIN, CLOSE, OPEN) behind what the
// connection has sent (an ACCEPT is queued by state.accept before the
// listener hands the connection out). CLOSE withdraws a write in progress:
// nothing may follow it.
func (c *Conn) queueFrame(kind uint32, body []byte) {
	f := ctlFrame{n: len(body)}
	if kind == kindOpen {
		f.tag = makeTag(kind, c.id) // peerID is not known yet, and ACCEPT may be writing it
	} else {
		f.tag = makeTag(kind, c.peerID)
	}
	copy(f.body[:], body)
	c.smu.Lock()
	if kind == kindClose {
		c.out, c.outOff, c.fill = nil, 0, nil
	}
	if c.resuming || c.resendTo > c.sent.Load() || len(c.after) > 0 {
		c.after = append(c.after, f) // behind the bytes that go again (resume.go)
	} else {
		c.frames = append(c.frames, f)
	}
	c.unit.postLocked(c)
	c.smu.Unlock()
	if c.ep.cfg.CoreModel == CoreInline {
		c.st().serveUnits() // full rings: the poller serves on ring space
	}
}

// place puts a new connection on a unit (before any frame of it is sent).
func (c *Conn) placeLocked() error {
	u, slot, err := c.st().place(c.class())
	if err != nil {
		return err
	}
	c.smu.Lock()
	c.unit, c.slot = u, slot
	c.smu.Unlock()
	return nil
}

func (c *Conn) slotNow() int {
	c.smu.Lock()
	defer c.smu.Unlock()
	if c.moving {
		return c.moveSlot
	}
	return c.slot
}

// Partition is the data partition the connection currently sends on.
func (c *Conn) Partition() int {
	c.smu.Lock()
	defer c.smu.Unlock()
	return c.unit.parts[c.slot].Index
}

// Migrate moves the connection's sending side to unit i (a partition, or
// with Config.QoS a unit of 8), in order and losing nothing. The move
// happens before the connection's next frame; Migrate does not wait.
func (c *Conn) Migrate(i int) error {
	if i < 0 || i >= len(c.st().units) {
		return fmt.Errorf("migrate connection %d: unit %d outside 0..%d", c.id, i, len(c.st().units)-1)
	}
	u := c.st().units[i]
	c.moveTo(u, u.partFor(c.class()))
	return nil
}

func (c *Conn) moveTo(u *unit, slot int) {
	c.smu.Lock()
	if c.unit == u && c.slot == slot {
		c.moving = false
	} else {
		c.moving, c.moveUnit, c.moveSlot = true, u, slot
		c.unit.postLocked(c)
	}
	c.smu.Unlock()
	if c.ep.cfg.CoreModel == CoreInline {
		c.st().serveUnits()
	}
}

func (c *Conn) writeErr() error {
	f := c.flags.Load()
	switch {
	case f&fClosed != 0:
		return c.opErr("write", net.ErrClosed)
	case c.wdl.Passed():
		return c.opErr("write", os.ErrDeadlineExceeded)
	case f&fWriteShut != 0:
		return c.opErr("write", syscall.EPIPE)
	case f&fFailed != 0:
		return c.opErr("write", c.failure())
	case f&fPeerGone != 0:
		return c.opErr("write", syscall.EPIPE)
	}
	return nil
}
