package transport

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ntstack/ntstack/internal/prim/credit"
)

// Credit in turns.
//
// With few connections each gets an even share of half the inbound rings
// (state.share). With many, even shares are small: at 64 connections over
// an 8 MiB ring a share is one 64 KiB record, so every record costs its
// writer a park and a wake, its reader a goroutine switch, and a CREDIT;
// and the records of all connections interleave in the ring, so the reader
// touches every connection's buffer in turn. Instead, beyond
// credit.TurnSlots streaming connections (those that hold a share, see
// state.share), the receiver hands out three quarters of the rings in
// turns (credit.Pool): a writer that runs out of credit says so (WANT),
// and waits in line for a chunk of a quarter of the rings
// (credit.TurnSize, where the size and the pool are measured), which it
// sends as one run of records.
// Every connection keeps a baseline of minShare, beyond the turns, so a
// small message never waits in line (the writer asks only when a record
// it would send does not fit the baseline, see creditPooled).
//
// Turn credit is accounted from its grant to the arrival of the bytes it
// let the writer send (Conn.ahead): that is what can sit in the rings.
// (Arriving bytes count against a turn whatever credit they were sent on,
// so a writer that also sends on its baseline or its first window retires
// its turn early: the pool then undercounts by at most that much.)
// Bytes that arrived are no longer in the rings, read or not, so a reader
// that stops holds up only its own writer: its queue is bounded by the
// window as always. A WANT says how much the writer has sent, so the
// credit it could not use goes back at once rather than on arrival.
//
// A writer whose application stops writing before its turn is used up
// sends nothing more: its credit cannot be recalled, but it is written off
// the pool once a poll finds the rings empty while the line waits and
// nothing of the turn has arrived for turnIdle (expireIdleTurns), or once
// the line has waited turnExpiry for room and the writer's turn credit has
// not moved meanwhile. Should the writer send on it later, the rings hold
// that much more than the pool for a while.

// turnExpiry is how long a turn may sit unused while others wait, and how
// often the line is looked at while the pool is full: long enough that a
// turn still in use is not written off, short enough that the line does
// not stand still behind an unused one (docs/perf-log.md has the sweep).
const turnExpiry = 500 * time.Microsecond

// turnIdle is how long a turn may show no sign of life (its grant, an
// arrival) while the rings are empty and others wait, before it is written
// off. With the rings empty none of it is on its way, so the write-off
// need not wait for turnExpiry's two looks, whose timer fires after a
// millisecond or more (as any Go timer under a millisecond does). When
// many streams pause together, each with part of a turn unused, the rings
// would otherwise stand empty that long at every pause. A
// writer woken slower than this loses its turn from the pool's count, not
// its credit: the rings may then hold up to a turn more than the pool.
const turnIdle = 50 * time.Microsecond

// floorPooled, set in a CREDIT's floor, tells the writer its credit comes
// in turns: it sends WANT when it waits for credit.
const floorPooled = 1 << 31

// turns is a session's queue of writers waiting for a turn.
type turns struct {
	used  atomic.Int64 // turn credit granted whose bytes have not arrived
	nwait atomic.Int32 // len(wait)

	mu sync.Mutex
	// mu protects the following fields.
	wait      []*Conn      // writers that asked, oldest first
	holders   []*Conn      // writers granted turns (some may have used them up)
	checkedAt int64        // ep.now() of the last look for unused turns
	timer     *time.Timer  // looks again while the line waits (nobody else may)
	armed     atomic.Bool  // timer set; written under mu
	idleAt    atomic.Int64 // ep.now() of the last expireIdleTurns look
}

// turnChunk is the credit of one turn, or 0 while credit is not given in
// turns (credit.Turn).
func (st *state) turnChunk() int64 { return st.turnChunkAt(st.share()) }

// turnChunkAt is turnChunk, share being st.share() now.
func (st *state) turnChunkAt(share int64) int64 {
	return credit.Turn(st.rxRings, st.window, share, min(DefaultMTU, int64(st.ep.cfg.MTU)))
}

// turnSize is the credit of a turn while credit goes in turns.
func (st *state) turnSize() int64 {
	return credit.TurnSize(st.rxRings, st.window)
}

// want acts on c's WANT: its writer waits for credit. Turn credit it
// could not use goes back to the pool, and c joins the line. A WANT sent
// before the writer had our last CREDIT is stale: the writer asks again if
// that CREDIT did not let it go on.
func (st *state) want(c *Conn, m wantMsg) error {
	c.cmu.Lock()
	if out := c.creditOut; c.turnsDone || int64(m.consumed) != out {
		c.cmu.Unlock()
		if int64(m.consumed) > out {
			return fmt.Errorf("connection %d: want after credit %d, beyond the %d sent", c.id, m.consumed, out)
		}
		return nil
	}
	sent := int64(m.consumed) + int64(m.inflight)
	if sent > c.st().window+c.creditOut {
		c.cmu.Unlock()
		return fmt.Errorf("connection %d: want after %d bytes sent, beyond the window", c.id, sent)
	}
	c.retireAhead(sent - c.recvd.Load())
	c.wants = true
	c.cmu.Unlock()
	st.queueTurn(c)
	st.serveTurns()
	return nil
}

// retireAhead returns c's turn credit beyond keep (bytes on their way) to
// the pool.
func (c *Conn) retireAhead(keep int64) {
	keep = max(keep, 0)
	for {
		a := c.ahead.Load()
		if a <= keep {
			return
		}
		if c.ahead.CompareAndSwap(a, keep) {
			c.st().turns.used.Add(keep - a)
			return
		}
	}
}

// arrived retires n bytes of c's turn credit that arrived at now (RX path).
func (c *Conn) arrived(n, now int64) {
	for {
		a := c.ahead.Load()
		if a == 0 {
			return
		}
		c.turnAt.Store(now)
		r := min(a, n)
		if c.ahead.CompareAndSwap(a, a-r) {
			c.st().turns.used.Add(-r)
			return
		}
	}
}

func (st *state) queueTurn(c *Conn) {
	t := &st.turns
	t.mu.Lock()
	if !c.turnQueued {
		c.turnQueued = true
		t.wait = append(t.wait, c)
		t.nwait.Add(1)
	}
	t.mu.Unlock()
}

// serveTurns grants turns to the writers in line while the pool has room
// for a chunk (or, credit not being in turns now, to all of them).
func (st *state) serveTurns() {
	t := &st.turns
	budget := credit.Pool(st.rxRings)
	for t.nwait.Load() > 0 {
		if t.armed.Load() && t.used.Load()+st.turnSize() > budget {
			// No room, and the timer looks again. Every poll comes
			// here while writers wait in line, and turnChunk's look
			// at the share is not free with many connections.
			// (Should credit have left turns meanwhile,
			// the line waits for the timer, at most turnExpiry.)
			return
		}
		chunk := st.turnChunk()
		t.mu.Lock()
		if len(t.wait) == 0 {
			t.mu.Unlock()
			return
		}
		if chunk > 0 && t.used.Load()+chunk > budget {
			if !t.armed.Load() {
				// Every caller may be parked, the rings idle.
				t.armed.Store(true)
				if t.timer == nil {
					t.timer = time.AfterFunc(turnExpiry, st.turnTimer)
				} else {
					t.timer.Reset(turnExpiry)
				}
			}
			t.mu.Unlock()
			return
		}
		c := t.wait[0]
		t.wait[0] = nil
		t.wait = t.wait[1:]
		t.nwait.Add(-1)
		c.turnQueued = false
		t.used.Add(chunk) // reserved; grantTurn gives back what it does not grant
		if chunk > 0 {
			// A new turn: what the last look saw of c is no longer
			// its (an earlier turn's ahead may equal this one's).
			c.aheadSeen = -1
			if !c.turnHeld {
				c.turnHeld = true
				t.holders = append(t.holders, c)
			}
		}
		t.mu.Unlock()
		c.grantTurn(chunk)
	}
}

// expireIdleTurns writes off the turns that showed no sign of life for
// turnIdle, a poll having found every ring empty while the line waits for
// room (see turnIdle). It looks at most every turnIdle/4.
func (st *state) expireIdleTurns() {
	t := &st.turns
	if t.nwait.Load() == 0 || !t.armed.Load() {
		return
	}
	now := st.ep.now()
	if last := t.idleAt.Load(); now-last < int64(turnIdle/4) || !t.idleAt.CompareAndSwap(last, now) {
		return
	}
	t.mu.Lock()
	st.writeOffLocked(func(c *Conn, _ int64) bool { return now-c.turnAt.Load() > int64(turnIdle) })
	t.mu.Unlock()
	st.serveTurns()
}

func (st *state) turnTimer() {
	st.turns.mu.Lock()
	st.turns.armed.Store(false)
	st.expireTurnsLocked()
	st.turns.mu.Unlock()
	st.serveTurns()
}

// expireTurnsLocked writes off the turns whose credit has not moved since
// the last look, turnExpiry or more ago (t.mu held), and drops the holders
// whose turns are used up.
func (st *state) expireTurnsLocked() {
	t := &st.turns
	now := st.ep.now()
	if now-t.checkedAt < int64(turnExpiry) {
		return
	}
	t.checkedAt = now
	st.writeOffLocked(func(c *Conn, a int64) bool {
		if a == c.aheadSeen {
			return true
		}
		c.aheadSeen = a
		return false
	})
}

// writeOffLocked writes off the turns out for which idle (given the
// holder and its turn credit out) says so, and drops the holders whose
// turns are used up (t.mu held).
func (st *state) writeOffLocked(idle func(c *Conn, ahead int64) bool) {
	t := &st.turns
	kept := t.holders[:0]
	for _, c := range t.holders {
		a := c.ahead.Load()
		if a > 0 && idle(c, a) {
			c.retireAhead(0)
			st.ep.counters.turnsExpired.Add(1)
			a = 0
		}
		if a == 0 {
			c.turnHeld = false
			continue
		}
		kept = append(kept, c)
	}
	clear(t.holders[len(kept):])
	t.holders = kept
}

// grantTurn gives c's writer a turn of chunk bytes of credit (0: credit is
// not in turns now; its share, as consumed would, as also beside a
// small-message flow), chunk being reserved in the pool. A reader too far
// behind to allow a record more (its queue near the window) gets none: it
// asks again when it reads (see settleWantLocked).
func (c *Conn) grantTurn(chunk int64) {
	c.cmu.Lock()
	defer c.cmu.Unlock()
	t := &c.st().turns
	if c.turnsDone || !c.wants {
		t.used.Add(-chunk)
		return
	}
	read := c.read.Load()
	if chunk == 0 || c.st().sharedBound(c, c.st().share()) > 0 {
		// Not in turns now, or the shared window bounds c beside a
		// small-message flow: the credit creditLocked gives.
		t.used.Add(-chunk)
		out, floor := c.creditOut, c.floorOut
		c.creditLocked(read)
		c.settleWantLocked(read, out, floor)
		return
	}
	d := min(chunk, read-c.creditOut) // the allowance stays within the window
	if d < min(chunk, DefaultMTU) {
		t.used.Add(-chunk)
		c.settleWantLocked(read, c.creditOut, c.floorOut)
		return
	}
	c.wants = false
	c.ahead.Add(d)
	t.used.Add(d - chunk)
	c.creditOut += d
	c.ep.counters.turns.Add(1)
	c.turnAt.Store(c.ep.now())
	c.sendCreditLocked(min(DefaultMTU, c.st().window) | floorPooled)
}

// settleWantLocked ends c's WANT where the rules gave no turn (cmu held;
// out and floor are creditOut and floorOut from before they looked): if
// they sent a CREDIT, that answers it (should it not let the writer go on,
// the writer asks again); if not and c's reader has read all that
// arrived, no Read will come to send one, so it sends a CREDIT for all
// that was read, and the writer may fill the window again. Otherwise the
// WANT stands, and the reader's next read asks for a turn again
// (consumed), until one of the two holds.
//
// The WANT must stand while its reader is behind: ended there, the reader
// may read the rest under turns' rule, which holds back less than half its
// baseline (creditPooled), and park with all read and some credit unsent,
// while its writer, short of a record's credit, waits for an answer to the
// WANT it sent — a hang (TestNoLossUnderPressure catches it).
func (c *Conn) settleWantLocked(read, out, floor int64) {
	switch {
	case c.creditOut != out || c.floorOut != floor:
	case read == c.recvd.Load():
		c.creditOut = max(c.creditOut, read)
		c.sendCreditLocked(c.floorOut)
	default:
		return
	}
	c.wants = false
}

// sendWant tells the peer c's writer waits for credit, encoding the frame
// in buf (empty, at least wantSize long, the caller's to reuse once it
// returns). Not from a serve pass, whose TX locks a full control ring's
// queue (state.flushCtl) may need.
func (c *Conn) sendWant(buf []byte) {
	v := c.peerRead.Load()
	m := wantMsg{consumed: uint64(v), gen: c.peerGen, inflight: uint32(c.sent.Load() - v)}
	c.st().sendLoose(c.st().control, kindWant, c.peerID, c.id, m.encode(buf))
}
