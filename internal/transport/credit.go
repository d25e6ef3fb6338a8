package transport

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// grants is the credit a connection hands back to the peer's writer as
// the application reads (consumed), and its share of the turns of credit
// while many connections share the rings (turns.go).
type grants struct {
	cmu       sync.Mutex       // serialises consumed: Read, and whoever delivers into its posted buffer
	creditOut int64            // read total last sent as CREDIT; guarded by cmu
	floorOut  int64            // floor last sent as CREDIT (0: none, the window); guarded by cmu
	wants     bool             // its writer asked for a turn and has none yet; guarded by cmu
	creditBuf [creditSize]byte // the CREDIT being sent, encoded (one of the call's own escapes to the heap); guarded by cmu
	turnsDone bool             // released: no more turns; guarded by cmu

	ahead      atomic.Int64 // turn credit whose bytes have not arrived (see turns.go)
	turnAt     atomic.Int64 // ep.now() of the grant of c's turn or its latest arrival since
	turnQueued bool         // in the turns line; guarded by state.turns.mu
	turnHeld   bool         // among the turns' holders; guarded by state.turns.mu
	aheadSeen  int64        // ahead at the last look for unused turns (-1: a turn since); guarded by state.turns.mu
}

// creditEvery is the fraction of the share read before credit goes back
// (a step; at least creditRun beside other connections): one 16-byte
// frame per 512 KiB a lone connection reads with the default window and
// rings. A smaller fraction sends a CREDIT for nearly every record when
// several connections stream, each CREDIT a wake-up for the writer.
const creditEvery = 8

// creditRun is the least step while other connections share the rings
// and the share holds two steps. A writer out of credit resumes with one
// step and sends it as a run of records; runs of one record interleaved
// the connections record by record in the ring, and each change of
// connection there cost the reader a goroutine switch, and a CREDIT, and
// parked a reader for every other record. A lone connection keeps an
// eighth of its share: nobody else fills the rings while its writer waits
// for a larger step, so a larger one only leaves the pipe empty longer.
const creditRun = 4 * DefaultMTU

// creditStep is the step for a share (see creditEvery and creditRun).
func (st *state) creditStep(share int64) int64 {
	step := share / creditEvery
	if st.live.Load() > 1 {
		step = max(step, min(share/2, creditRun))
	}
	return step
}

// consumed accounts n bytes read by the application, or delivered into
// its posted buffer, and hands credit back once a step (creditStep) has
// been read. The peer was granted the configured window at the handshake;
// when the connection's share of the rings is smaller (state.share), the
// credit reported lags what was read, so that at most the share and a
// step more are in flight.
//
// CREDIT also carries the floor, at most the credit the writer can count
// on once all it sent has been read. A writer waits for that much rather
// than send small records (Conn.creditFloor), so it must come: with the
// last step possibly unreported, the floor is the share when the window
// leaves room for a step more in flight, the share less a step when not;
// beside a small-message flow it is one step. A floor lower than the one
// last sent goes out at once, with no new credit if there is none.
//
// Credit that could not lift the writer to the floor (or DefaultMTU) even
// were all it sent already here is held back for a later read: the writer
// would only wake to wait again: with many connections, whose shares are
// a record or so, most CREDITs would be such. It cannot be held for good:
// once everything that arrived is read, window+grant-recvd is share+extra,
// at least the floor.
func (c *Conn) consumed(n int) {
	c.cmu.Lock()
	c.creditLocked(c.read.Add(int64(n)))
	wants := c.wants
	c.cmu.Unlock()
	if wants {
		c.st().queueTurn(c) // its reader was too far behind for a turn
	}
	if c.st().turns.nwait.Load() > 0 {
		c.st().serveTurns()
	}
}

// creditLocked hands back credit for total bytes read (cmu held), as
// consumed describes.
func (c *Conn) creditLocked(total int64) {
	window := c.st().window
	share := c.st().share()
	step := c.st().creditStep(share)
	extra := min(step, window-share)
	floor := share + extra - step
	if w := c.st().sharedBound(c, share); w > 0 {
		// Beside a small-message flow: no more than w in flight, and
		// records as small as a step, so a small message waits behind
		// little. Not in turns either (see grantTurn).
		share, step, extra = w, w/creditEvery, 0
		floor = step
	} else if c.st().turnChunkAt(share) > 0 {
		c.creditPooled(total)
		return
	}
	grant := total - (window - share - extra)
	last := c.floorOut
	if last == 0 {
		last = window // what the writer assumes before any CREDIT
	}
	if grant-c.creditOut < step && floor >= last {
		return
	}
	if floor >= last && window+grant-c.recvd.Load() < min(floor, DefaultMTU) {
		return // the writer could not send on it (see above)
	}
	c.creditOut = max(grant, c.creditOut)
	c.sendCreditLocked(floor)
}

// creditPooled is creditLocked while credit goes in turns (see turns.go):
// the baseline of minShare in flight, and a floor of a whole record, with
// floorPooled set, so that a bulk writer asks for a turn rather than send
// on the baseline.
func (c *Conn) creditPooled(total int64) {
	window := c.st().window
	base := min(minShare, window)
	floor := min(DefaultMTU, window) | floorPooled
	grant := total - (window - base)
	if grant-c.creditOut < base/2 && c.floorOut == floor {
		return
	}
	c.creditOut = max(grant, c.creditOut)
	c.sendCreditLocked(floor)
}

// sendCreditLocked sends CREDIT for c.creditOut with floor (cmu held).
func (c *Conn) sendCreditLocked(floor int64) {
	c.floorOut = floor
	c.mu.Lock()
	live := c.state == connEstablished && !c.closeSent
	c.mu.Unlock()
	if live {
		m := creditMsg{consumed: uint64(c.creditOut), gen: c.peerGen, floor: uint32(floor)}
		c.st().sendLoose(c.st().control, kindCredit, c.peerID, c.id, m.encode(c.creditBuf[:0]))
		c.ep.counters.credits.Add(1)
	}
}

func (c *Conn) credit(m creditMsg) error {
	v := m.consumed
	if int64(v) < c.peerRead.Load() || int64(v) > c.sent.Load() {
		return fmt.Errorf("connection %d: credit %d outside [%d, %d]", c.id, v, c.peerRead.Load(), c.sent.Load())
	}
	c.peerRead.Store(int64(v))
	c.smu.Lock()
	defer c.smu.Unlock()
	c.peerFloor = int64(m.floor &^ floorPooled)
	pooled := m.floor&floorPooled != 0
	c.peerPooled = pooled
	// Any CREDIT answers a WANT sent before it, or crossed it (the
	// receiver then ignores the WANT): the writer's next wait asks again.
	c.wantSent = false
	// Only a write waiting for credit needs it; waking the writer on
	// every CREDIT would leave a stale signal for its next park.
	if !c.waitCredit {
		return nil
	}
	if c.window-(c.sent.Load()-int64(v)) < c.creditFloor() {
		if pooled {
			// Credit goes in turns, and the writer waits without
			// having asked since this CREDIT (the receiver ignores a
			// WANT that crossed it): a serve pass waits again, and
			// asks. The writer runs it: our caller may be a small
			// write or a Read that got its data, which serve nobody
			// (in CoreInline no worker watches the unit's kick).
			c.waitCredit, c.wantSent = false, false
			c.unit.postLocked(c)
			c.wake(c.wnotify)
		}
		return nil
	}
	c.waitCredit, c.wantSent = false, false
	c.unit.postLocked(c)
	c.wake(c.wnotify)
	return nil
}

// creditFloor is the least credit c sends a DATA record on (smu held):
// the rest of the posted write, one MTU, the peer's floor (see consumed)
// or DefaultMTU, whichever is least. Sending on less cuts records ever
// smaller — a record read in parts comes back as credit in parts — and
// each small record costs a credit round trip and a park on either side
// (the "silly window" TCP avoids the same way). Records of DefaultMTU are
// large enough; waiting for more starves a lone connection's pipe when its
// MTU is the window (segmentation off).
func (c *Conn) creditFloor() int64 { return c.creditFloorFor(c.postedLocked()) }

// creditFloorFor is creditFloor for a write of n bytes (c.smu held).
func (c *Conn) creditFloorFor(n int) int64 {
	floor := c.peerFloor
	if floor == 0 || floor > c.window {
		floor = c.window // none yet, or more than the window could ever free
	}
	f := max(1, min(int64(n), int64(c.ep.cfg.MTU), floor, DefaultMTU))
	if f > smallPiece && c.ep.cfg.MTU <= DefaultMTU && c.unit != nil && c.st().smallTraffic(c.unit.parts[c.slot].Index) {
		f = smallPiece // it sends pieces (see serveOnce)
	}
	return f
}
