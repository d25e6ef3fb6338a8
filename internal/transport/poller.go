package transport

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/ntstack/ntstack/partition"
)

// drainLocked consumes everything queued in ring p (RX lock held) for the
// poller, except a DATA record left at the head for its reader; it reports
// whether it left one.
func (st *state) drainLocked(p *partition.Partition) bool {
	for {
		if _, records := st.pollLocked(p, nil, nil, true); records == 0 {
			return p != st.control && st.headWait[p.Index] != 0
		}
	}
}

// idleGrace is how long the endpoint must go without a spinning caller or
// a new Read or Write before the poller arms the doorbell for frames nobody
// waits for (an OPEN for a listener with no Accept pending, data for a
// connection not being read). A parked caller arms it at once. Arming while
// callers come and go between round trips would make every message ring a
// doorbell.
//
// A pending Accept is such a frame nobody waits for while calls come (the
// callers' polls take OPEN frames off the rings too), and arms the doorbell
// only once they stop. Counted as a parked caller, it made every endpoint
// with a listener — each of ntproxy's memory links and rack links, any
// server — ring a doorbell for nearly every record it received: a futex
// wake-up at the sender and a poller thread woken at the receiver.
const idleGrace = 2 * time.Millisecond

// announceIdle tells the device, if it listens (ntb.Idler), that this end
// sleeps with nothing to send — no loose frame, no writer queued or
// parked for credit or room — so that it may check the link less often:
// an idle pair's CPU goes mostly to the fabric's heartbeats. A sender
// waiting for room keeps them frequent, so that a peer that dies or a link
// pulled mid-transfer is seen at the device's full rate. The poller or the last worker
// to sleep calls it; Endpoint.busy ends it.
func (st *state) announceIdle() {
	ep := st.ep
	if ep.idler == nil || !st.quiet() || !ep.idle.CompareAndSwap(false, true) {
		return
	}
	ep.idler.Idle(true)
	if !st.quiet() {
		ep.busy() // a writer or a worker came between the look and the announcement
	}
}

// quiet reports whether nothing of ours waits to be sent and every worker
// (if any) sleeps.
func (st *state) quiet() bool {
	return !st.ctlPending.Load() && st.ep.writersOut.Load() == 0 && !st.sendQueued() &&
		int(st.asleep.Load()) == st.workers
}

// sendQueued reports whether a unit has writers queued.
func (st *state) sendQueued() bool {
	for _, u := range st.units {
		if u.queued.Load() > 0 {
			return true
		}
	}
	return false
}

// acceptPause is the poller's pause of up to d (or until kicked) while an
// Accept is pending and no caller runs to take an OPEN off the rings: it
// sleeps on the data doorbells too, unarmed, which a dialer rings with
// every OPEN (Conn.serveOnce), so a connection is accepted when its OPEN
// arrives rather than when the pause ends. Data records do not ring an
// unarmed ring, so calls that keep coming cost no doorbell (see idleGrace).
// It returns the device's error, if the wait failed for another reason
// than ctx or d.
func (st *state) acceptPause(ctx context.Context, d time.Duration) error {
	ep := st.ep
	var data uint64
	for _, p := range st.parts {
		data |= p.DataBit()
	}
	// A ring that rang before the clear is drained here; one that rings
	// after it ends the wait.
	ep.dev.ClearDoorbells(ep.dev.Doorbells() & data)
	for _, p := range st.parts {
		if p.TryLockRX() { // else a caller polls it and delivers
			st.drainLocked(p)
			p.UnlockRX()
		}
	}
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	go func() {
		select {
		case <-ep.kick:
			cancel()
		case <-wctx.Done():
		}
	}()
	// The wait may hold this thread's P (see the doorbell wait below):
	// let the goroutines the drain woke run first.
	runtime.Gosched()
	_, err := ep.dev.WaitDoorbell(wctx, data)
	if wctx.Err() != nil {
		return nil
	}
	return err
}

// pollerWoke, if set, runs when the poller's doorbell wait returns, before
// it takes the bits that rang: tests use it to hold there the poller of a
// session that has just ended.
var pollerWoke atomic.Pointer[func(*state)]

// runPoller keeps loose frames moving and rebalances units; in CoreInline
// it also sleeps on the doorbells while nobody else watches the rings. It
// ends with the session, acting on its end (state.finish).
func (st *state) runPoller() {
	ep := st.ep
	ctx, cancel := context.WithCancel(context.Background())
	defer context.AfterFunc(st.sess.Context(), cancel)()
	defer cancel()
	defer ep.pollers.Done()
	defer st.finish()
	defer st.waiterDone() // first: the next session's waiters need not wait for finish
	st.awaitPrev()
	timer := time.NewTimer(idleGrace)
	defer timer.Stop()
	pause := func(d time.Duration) { // d 0: until kicked
		if d > 0 {
			timer.Reset(d)
		} else {
			timer.Stop()
		}
		select {
		case <-ep.kick:
		case <-timer.C:
		case <-ctx.Done():
		}
	}
	rings := append(st.parts[:len(st.parts):len(st.parts)], st.control)
	var bits uint64
	for _, p := range rings {
		bits |= p.DataBit() | p.SpaceBit()
	}
	txBytes := make([]uint64, len(st.units))
	nextBalance := time.Now().Add(rebalanceEvery)
	var idleSince time.Time
	var calls uint64
	for ctx.Err() == nil {
		if ep.cfg.Rebalance && time.Now().After(nextBalance) {
			st.rebalance(txBytes)
			nextBalance = time.Now().Add(rebalanceEvery)
		}
		ctlDone := st.flushCtl()
		if ep.cfg.CoreModel != CoreInline {
			// The workers watch the rings; only loose frames are ours
			// (queuing one kicks us), and the units' traffic to compare.
			if ctlDone && ep.cfg.Rebalance {
				pause(rebalanceEvery)
			} else if ctlDone {
				pause(0)
			} else {
				pause(time.Millisecond)
			}
			continue
		}
		served := st.serveUnits()
		if ctlDone {
			// Somebody polls, or calls keep coming: nothing to do.
			if c := ep.calls.Load(); ep.callersRun() || (c != calls && ep.parked.Load() == 0) {
				calls, idleSince = c, time.Time{}
				if ep.accepting.Load() > 0 && !ep.callersRun() {
					if err := st.acceptPause(ctx, idleGrace); err != nil {
						st.sess.Fail(fmt.Errorf("wait for doorbell: %w", err))
						return
					}
				} else {
					pause(idleGrace)
				}
				continue
			}
			if ep.parked.Load() == 0 && ep.accepting.Load() == 0 {
				if idleSince.IsZero() {
					idleSince = time.Now()
				}
				if wait := idleGrace - time.Since(idleSince); wait > 0 {
					pause(wait)
					continue
				}
			}
		}
		locked := 0
		left := false
		for _, p := range rings {
			if p.TryLockRX() {
				p.ArmData() // then look once more before sleeping
				left = st.drainLocked(p) || left
				p.UnlockRX()
				locked++
			}
		}
		if locked < len(rings) || left {
			// A caller is polling and will deliver, or a reader is
			// about to take the record left for it (one asleep on the
			// doorbell would not take it over after headWaitMax); look
			// again soon. Not with a timer: one under a millisecond
			// sleeps a millisecond or more, and a large record's copy
			// holds the ring only for microseconds.
			runtime.Gosched()
			continue
		}
		served = st.serveUnits() || served
		room := false
		for _, u := range st.units {
			if u.queued.Load() > 0 && u.armSpace() {
				room = true
			}
		}
		if !ctlDone && st.armCtl() {
			room = true // flush at the top
		}
		if room {
			// Serve at the top. A writer queued on a ring with room
			// need not be one this loop can serve: another goroutine
			// holds the unit's serve lock (a Close or an accept serving
			// it, stopped in its pass), a token bucket holds it back, or
			// a writer of the unit waits on a full partition beside one
			// with room. Then the loop would go round without moving
			// anything, and with one P the goroutine it waits for would
			// run only when the scheduler preempted it, 10 ms later: a
			// round that sent nothing yields first.
			ep.counters.pollerRounds.Add(1)
			if !served {
				runtime.Gosched()
			}
			continue
		}
		// Goroutines this loop just woke sit on this P's run queue: let
		// them run here first, rather than on a thread the doorbell wait
		// would wake as it gives the P up (a futex wait, see
		// proc.BlockingSyscall6) or the poller's.
		runtime.Gosched()
		if ctlDone && ep.callersRun() {
			// A caller ran meanwhile and is not parked: it polls. (This
			// kept the doorbell wait from holding a one-P process's P
			// while that caller waited to run, before futex waits gave
			// their P up; it also spares a sleep and its wake-up.)
			continue
		}
		st.expireIdleTurns() // the rings are empty
		ep.counters.pollerSleeps.Add(1)
		st.announceIdle()
		_, err := ep.dev.WaitDoorbell(ctx, bits)
		ep.busy()
		if h := pollerWoke.Load(); h != nil {
			(*h)(st)
		}
		if err != nil && ctx.Err() == nil {
			st.sess.Fail(fmt.Errorf("wait for doorbell: %w", err))
			return
		}
		pending := ep.dev.Doorbells() & bits
		ep.dev.ClearDoorbells(pending)
		for _, p := range rings {
			if pending&p.SpaceBit() != 0 {
				ep.spaceArrived()
				break
			}
		}
		for _, p := range rings {
			if p.TryLockRX() {
				st.drainLocked(p)
				p.UnlockRX()
			}
		}
	}
}
