package transport

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/prim/spingate"
	"github.com/ntstack/ntstack/partition"
	"github.com/ntstack/ntstack/qos"
)

// A unit is the scheduling unit of the TX side: one partition, or with
// Config.QoS one partition per priority class. Connections queue on the
// unit's scheduler when they have something to send; whoever holds the
// unit's serve lock — an application goroutine in CoreInline, the unit's
// worker otherwise — sends for all of them, higher classes first,
// round-robin within a class, at most Config.Batch bytes per connection
// per round.
type unit struct {
	st    *state
	index int
	parts []*partition.Partition // by class slot, see partFor

	serveMu sync.Mutex // held by whoever serves the unit
	// wantsBuf backs a serve pass's list of writers to send WANT for, and
	// wantFrame their frames as they are encoded (guarded by serveMu, which
	// every serve pass holds): the pass's own escaped to the heap, an
	// allocation or two per WANT.
	wantsBuf  [4]*Conn
	wantFrame [wantSize]byte

	mu sync.Mutex
	// mu protects the following fields.
	sched   qos.Scheduler[*Conn]
	buckets []qos.Bucket // per partition of parts
	conns   []int        // connections placed, per partition of parts

	queued  atomic.Int32  // connections in sched
	posts   atomic.Uint32 // pushes into sched, ever
	txBytes atomic.Uint64 // DATA bytes sent, for rebalancing
	kick    chan struct{} // wakes a sleeping TX worker
}

// partFor is the slot in u.parts of class c's partition.
func (u *unit) partFor(c qos.Class) int { return int(c) * len(u.parts) / qos.NumClasses }

// post queues c for service (c.smu held), unless it is queued already.
func (u *unit) postLocked(c *Conn) {
	if c.inSched {
		return
	}
	c.inSched = true
	u.mu.Lock()
	if c.smallLocked() {
		u.sched.PushExpress(c.class(), c)
	} else {
		u.sched.Push(c.class(), c)
	}
	u.mu.Unlock()
	u.queued.Add(1)
	u.posts.Add(1)
	select {
	case u.kick <- struct{}{}:
	default:
	}
}

// smallWrite is the largest write (and record) that counts as a small
// message: one whose latency matters more than its throughput. A connection with only a
// small write (or connection frames) to send is served ahead of the bulk
// writers of its class (qos.Scheduler.PushExpress): it goes into the ring
// before their next records, not after a round of them. Per-connection
// order is untouched — a connection is queued once, with all it has.
const smallWrite = 4 << 10

// smallLocked reports whether c has only a small write or frames to send
// (c.smu held).
func (c *Conn) smallLocked() bool { return c.postedLocked() <= smallWrite && !c.moving }

// tryServe serves the unit if nobody else does. Combining has a lost-wake
// race — a connection queued just after the server's last look, whose
// poster found the lock taken — so a server looks again after unlocking
// if anything was queued during its pass by somebody else. Its own
// requeues (connections with more to send, or blocked on a full ring) do
// not count: looping on them kept the caller from polling its rings and
// from yielding for as long as the ring stayed full, so a goroutine of the
// same process waiting for a response waited for the scheduler's
// preemption.
//
// self, if not nil, is the caller's own connection with a small write
// posted: the pass ends once that write is out, so the caller returns to
// its application (to read the response) instead of first sending a round
// of its neighbours' bulk records; their own writers serve those.
func (u *unit) tryServe(self *Conn) (progress bool, wait time.Duration, contended bool) {
	for u.queued.Load() > 0 {
		seen := u.posts.Load()
		if !u.serveMu.TryLock() {
			return progress, wait, true
		}
		p, w, requeued := u.serve(self)
		if self != nil && self.wdone.Load() {
			self = nil // a second pass (below) serves everybody
		}
		u.serveMu.Unlock()
		if p {
			u.st.ep.noteProgress()
		}
		progress, wait = progress || p, w
		if u.posts.Load() == seen+uint32(requeued) {
			return progress, wait, false
		}
	}
	return progress, wait, false
}

// serveRounds and passBytes bound one pass, so a caller serving others
// returns to its own business (and a worker to its RX) regularly, and the
// records of a pass, published together at its end, wait for at most
// passBytes of copying: a small message queued behind a bulk flow leaves
// within a couple of records' time (with a yield between passes, see
// yieldAbove).
const (
	serveRounds = 64
	passBytes   = 128 << 10
)

// serve runs one pass over the queued connections. It reports whether it
// sent anything, and if it did not, how long a token bucket asks to wait
// (0: blocked on ring space or nothing to do), and how many connections it
// queued on u again.
func (u *unit) serve(self *Conn) (progress bool, wait time.Duration, requeued int) {
	var open uint64                         // partitions (slots) with a batch open
	wants := u.wantsBuf[:0:len(u.wantsBuf)] // writers to send WANT for, once the batches are out
	defer func() {
		for i, p := range u.parts {
			if open&(1<<i) != 0 {
				p.EndTX()
			}
		}
		for _, c := range wants {
			c.sendWant(u.wantFrame[:0])
		}
		clear(u.wantsBuf[:]) // no connection kept alive by a stale pointer
	}()
	var full uint64 // slots found full this pass
	misses, moved := 0, 0
	for range serveRounds {
		u.mu.Lock()
		c, _, ok := u.sched.Next()
		u.mu.Unlock()
		if !ok {
			return progress, wait, requeued
		}
		u.queued.Add(-1)
		sent, w, requeue := c.serveOnce(u, &open, &full, &moved)
		if c.wantOut.Load() && c.wantOut.Swap(false) {
			wants = append(wants, c)
		}
		if c == self && !requeue && self.wdone.Load() {
			return true, 0, requeued // the caller's small write is out: let it go (see tryServe)
		}
		if sent {
			progress, misses = true, 0
		} else {
			misses++
			if w > 0 && (wait == 0 || w < wait) {
				wait = w
			}
		}
		if requeue {
			c.smu.Lock()
			if c.unit == u {
				c.inSched = false
				u.postLocked(c)
				requeued++
			} else {
				c.unit.postLocked(c) // it moved
			}
			c.smu.Unlock()
		}
		if misses > int(u.queued.Load())+1 {
			return progress, wait, requeued // everybody queued is blocked
		}
		if moved >= passBytes {
			return progress, wait, requeued // publish, and let the others in
		}
	}
	return progress, wait, requeued
}

// armSpace arms the space doorbell of every full partition of the unit and
// reports whether room appeared meanwhile.
func (u *unit) armSpace() bool {
	room := false
	for _, p := range u.parts {
		if p.ArmSpace(min(p.MaxPayload(), u.st.ep.cfg.MTU)) {
			room = true
		}
	}
	return room
}

// runWorker drives a unit: TX, RX or both, spinning for the spin budget
// when idle, then sleeping on the doorbells and the unit's kick. It ends
// with the session.
func (u *unit) runWorker(tx, rx bool, cpu int) {
	st := u.st
	defer st.ep.pollers.Done()
	defer st.waiterDone()
	st.awaitPrev()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if cpu >= 0 {
		if err := proc.PinThread(cpu); err != nil {
			st.ep.logf("unit %d worker: %v", u.index, err)
		}
	}
	ctx := st.sess.Context()
	var bits uint64
	for _, p := range u.parts {
		if rx {
			bits |= p.DataBit()
		}
		if tx {
			bits |= p.SpaceBit()
		}
	}
	if rx {
		bits |= st.sess.Control().DataBit()
	}
	budget := st.ep.cfg.SpinBudget
	idleSince := time.Now()
	pending := func() bool { return tx && u.queued.Load() > 0 || rx && st.unitPending(u) }
	recheck := workerRecheck
	// spin is what spingate granted for this idle spell (-1: not asked):
	// a worker counts among the process's spinners like any caller.
	spin := time.Duration(-1)
	leave := func() {
		if spin > 0 {
			spingate.Leave()
		}
		spin = -1
	}
	defer leave()
	for ctx.Err() == nil {
		busy := false
		if tx && u.queued.Load() > 0 {
			// serveMu: a Dial waiting for its ACCEPT serves the units
			// too (state.poll), whatever the core model.
			u.serveMu.Lock()
			progress, wait, _ := u.serve(nil)
			u.serveMu.Unlock()
			busy = progress
			if !progress && wait > 0 {
				time.Sleep(wait)
				continue
			}
		}
		if rx && st.pollUnit(u) > 0 {
			busy = true
		}
		if busy {
			idleSince, recheck = time.Time{}, workerRecheck
			continue
		}
		if idleSince.IsZero() {
			idleSince = time.Now()
		}
		if spin < 0 {
			spin = spingate.Enter(budget)
		}
		if time.Since(idleSince) < spin {
			spingate.Sweep()
			runtime.Gosched()
			continue
		}
		leave()
		// Sleep: arm, look once more, then wait for a doorbell or a kick.
		if rx {
			st.armUnit(u)
			if st.pollUnit(u) > 0 {
				continue
			}
		}
		if tx && u.queued.Load() > 0 && u.armSpace() {
			continue
		}
		st.ep.counters.pollerSleeps.Add(1)
		st.sleep(ctx, bits, u.kick, tx, pending, recheck)
		// Woken with nothing to do (a record its reader must take, queued
		// writes with no room), it sleeps again at once, and looks later.
		recheck = min(2*recheck, workerRecheckMax)
	}
}

// workerRecheck is how long a worker sleeps after work before its rings
// are looked at for it; each look that finds nothing doubles the next, up
// to workerRecheckMax. The worker models lose a wake-up now and then (seen
// as nettest's PingPong hanging in CoreShared, rarely and on a loaded
// machine; the cause is not found). The look turns such a loss into
// milliseconds after work, at most workerRecheckMax after a long idle
// spell, instead of a hang. It is a timer's, and wakes the worker only
// when it finds work: a worker that woke to look itself would re-enter its
// blocking wait each time, a thread's wake-up or more, and an idle pair
// would spend CPU on it. The default CoreInline does not use
// workers.
const (
	workerRecheck    = 10 * time.Millisecond
	workerRecheckMax = 1280 * time.Millisecond
)

// workerWoke, if set, runs when a worker's doorbell wait returns, before
// it takes the bits that rang (bits: those it waited on); and while
// workerNoLook is set, a sleeping worker does not look at its rings (see
// workerRecheck), so only a doorbell, a kick or the session's end wakes
// it. Tests use them to hold there a worker of a session that has just
// ended, and to see a lost wake-up as a hang rather than a late look.
var (
	workerWoke   atomic.Pointer[func(st *state, bits uint64)]
	workerNoLook atomic.Bool
)

// sleep waits for a doorbell in bits, or (kickable) a kick, or ctx, or a
// look at the rings that finds pending true, the first after recheck (see
// workerRecheck).
func (st *state) sleep(ctx context.Context, bits uint64, kick chan struct{}, kickable bool, pending func() bool, recheck time.Duration) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		var kicked <-chan struct{}
		if kickable {
			kicked = kick
		}
		look := time.NewTimer(recheck)
		defer look.Stop()
		looks := look.C
		if workerNoLook.Load() {
			looks = nil
		}
		for {
			select {
			case <-kicked:
				cancel()
				return
			case <-wctx.Done():
				return
			case <-looks:
				if pending() {
					cancel()
					return
				}
				recheck = min(2*recheck, workerRecheckMax)
				look.Reset(recheck)
			}
		}
	}()
	if int(st.asleep.Add(1)) == st.workers {
		st.announceIdle()
	}
	_, _ = st.ep.dev.WaitDoorbell(wctx, bits)
	st.asleep.Add(-1)
	st.ep.busy()
	if h := workerWoke.Load(); h != nil {
		(*h)(st, bits)
	}
	rang := st.ep.dev.Doorbells() & bits
	st.ep.dev.ClearDoorbells(rang)
	for _, p := range st.sess.Partitions() {
		if rang&p.SpaceBit() != 0 {
			st.ep.spaceArrived()
			break
		}
	}
}

// place picks the unit and partition slot for a new connection of class c
// and counts it there.
func (st *state) place(c qos.Class) (*unit, int, error) {
	cfg := &st.ep.cfg
	n := len(st.units)
	start := int(st.nextUnit.Add(1)-1) % n
	if cfg.Placement == LeastLoaded {
		best := -1
		for i, u := range st.units {
			u.mu.Lock()
			load := u.conns[u.partFor(c)]
			u.mu.Unlock()
			if best < 0 || load < best {
				best, start = load, i
			}
		}
	}
	for k := range n {
		u := st.units[(start+k)%n]
		slot := u.partFor(c)
		u.mu.Lock()
		if cfg.PartitionConns == 0 || u.conns[slot] < cfg.PartitionConns {
			u.conns[slot]++
			u.mu.Unlock()
			return u, slot, nil
		}
		u.mu.Unlock()
	}
	return nil, 0, fmt.Errorf("%d partitions for class %d hold %d connections each: %w", n, c, cfg.PartitionConns, ErrPartitionFull)
}

// unplace undoes place.
func (u *unit) unplace(slot int) {
	u.mu.Lock()
	u.conns[slot]--
	u.mu.Unlock()
}

// rebalanceEvery is how often the poller compares the units' traffic.
const rebalanceEvery = 100 * time.Millisecond

// rebalance moves one connection from the busiest unit to the idlest when
// their traffic over the last period differs by more than half, choosing
// the connection whose move best evens them out.
func (st *state) rebalance(last []uint64) {
	if len(st.units) < 2 {
		return
	}
	delta := make([]uint64, len(st.units))
	hi, lo := 0, 0
	for i, u := range st.units {
		v := u.txBytes.Load()
		delta[i], last[i] = v-last[i], v
		if delta[i] > delta[hi] {
			hi = i
		}
		if delta[i] < delta[lo] {
			lo = i
		}
	}
	if delta[hi] < 1<<20 || delta[hi]-delta[lo] < delta[hi]/2 {
		return
	}
	target := (delta[hi] - delta[lo]) / 2
	var best *Conn
	var bestDiff uint64
	for i := range st.conns {
		c := st.conns[i].Load()
		if c == nil {
			continue
		}
		c.smu.Lock()
		u, moved := c.unit, c.txBytes-c.txMark
		c.txMark = c.txBytes
		c.smu.Unlock()
		if u != st.units[hi] || moved == 0 || moved >= delta[hi] {
			continue // moving the unit's only talker just moves the skew
		}
		diff := max(moved, target) - min(moved, target)
		if best == nil || diff < bestDiff {
			best, bestDiff = c, diff
		}
	}
	if best != nil {
		st.ep.logf("rebalance: connection %d from unit %d to %d", best.id, hi, lo)
		best.moveTo(st.units[lo], st.units[lo].partFor(best.class()))
	}
}

// take asks partition slot's token bucket for n bytes.
func (u *unit) take(slot, n int) time.Duration {
	if u.st.ep.cfg.PartitionRate == 0 {
		return 0
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.buckets[slot].Take(n, time.Now())
}
