// The link monitor: heartbeats, liveness (up, suspect, down and why) and
// the fault injection that drives it in tests.

package shm

import (
	"fmt"
	"math/rand/v2"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ntstack/ntstack/internal/prim/shmem"
	"github.com/ntstack/ntstack/ntb"
)

// ForceLinkDown is fault injection, a cable pull: both ends report the
// link down (the peer within one heartbeat interval) until ForceLinkUp,
// this end with ntb.CauseLocal, the peer with ntb.CauseHardware.
func (d *Device) ForceLinkDown() {
	d.forceDown.Store(true)
	if d.guard.Enter() {
		d.remote.Store32(regPeerDown, 1)
		d.guard.Exit()
	}
	d.checkNow()
}

// ForceLinkUp ends ForceLinkDown.
func (d *Device) ForceLinkUp() {
	d.forceDown.Store(false)
	if d.guard.Enter() {
		d.remote.Store32(regPeerDown, 0)
		d.guard.Exit()
	}
	d.checkNow()
}

// checkNow has the monitor look at the link at once rather than at its
// next beat: this end's own fault injection is seen the moment it is made
// (the peer sees it at its next beat).
func (d *Device) checkNow() {
	select {
	case d.now <- struct{}{}:
	default:
	}
}

// SilenceHeartbeat is fault injection, a hung process: while on, the device
// stops heartbeating; the peer finds the link suspect after its heartbeat
// timeout and takes it down after its silent timeout.
func (d *Device) SilenceHeartbeat(on bool) { d.silent.Store(on) }

// peerAttached asks the kernel whether a process holds the peer's side
// lock. The kernel drops it the moment that process exits, however it
// exits, so a dead peer is seen at the next heartbeat without waiting for
// its heartbeat to time out.
func (d *Device) peerAttached() bool {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Start: int64(lockSide + 1 - d.side), Len: 1}
	if err := unix.FcntlFlock(d.file.Fd(), unix.F_OFD_GETLK, &lk); err != nil {
		return true // cannot tell: the heartbeat decides
	}
	return lk.Type != unix.F_UNLCK
}

// CorruptInbound is fault injection: it overwrites n bytes of the inbound
// window at off with pseudo-random bytes from seed, as a faulty or hostile
// peer might.
func (d *Device) CorruptInbound(off, n int, seed uint64) {
	if !d.guard.Enter() {
		return
	}
	defer d.guard.Exit()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := off; i < off+n && i < len(d.in); i++ {
		d.in[i] = byte(rng.Uint32())
	}
}

// runMonitor beats our heart in the peer's registers and watches the
// peer's in ours (see watch.observe).
func (d *Device) runMonitor() {
	defer close(d.done)
	t := time.NewTimer(d.interval)
	defer t.Stop()
	beats := d.remote.Load64(regHeartbeat)
	w := watch{lastBeat: d.local.Load64(regHeartbeat), state: ntb.LinkDown}
	for {
		now := time.Now()
		d.checkPaths()
		// The generation is read before the lock is asked: if nobody
		// holds the peer's side then, the generation read is a gone
		// process's (a new one claims the lock before it stamps).
		before := d.local.Load64(regGeneration)
		attached, met := d.peerAttached(), ""
		if !attached {
			var moved bool
			if met, moved = d.meetPeer(); moved {
				// Other memory, other counters: start over as at attach.
				beats, w = d.remote.Load64(regHeartbeat), watch{lastBeat: d.local.Load64(regHeartbeat), state: w.state, suspect: w.suspect, upGen: w.upGen}
				before = d.local.Load64(regGeneration)
				attached = d.peerAttached()
			}
		}
		if !d.silent.Load() {
			beats++
			d.remote.Store64(regHeartbeat, beats)
		}
		w.observe(d.local, before, d.forceDown.Load(), attached, met, now, d.timeout, d.silentAfter, d.setLink)
		d.seenGen.Store(w.seen)
		if !d.sleep(t, now) {
			return
		}
	}
}

// watch is runMonitor's reading of the peer's registers from one beat to
// the next.
type watch struct {
	lastBeat uint64    // the peer's heartbeat count last seen
	lastMove time.Time // when it last moved, or the generation changed
	seen     uint64    // the peer's generation last seen
	staleGen uint64    // a generation a process that is gone left behind
	upGen    uint64    // the peer's generation when the link last came up
	state    ntb.LinkState
	suspect  bool
}

// observe reads the peer-written registers in ours (regs) at now and
// reports each change they imply to set: of link state (none, one, or a
// re-attached peer's down before its up), or of an up link's suspicion.
// before is the peer's generation as read before attached was asked
// (whether the peer's process holds its side); forced is our own fault
// injection, and met how this end met the peer's memory when the peer was
// not attached (for the reason).
//
// The link is up while the peer's process holds its side, its generation
// is not 0 and not one a gone process left, neither end forces the link
// down, and its heartbeat (or generation) moved within silentAfter; it is
// suspect while that was longer than suspectAfter ago. A peer is up from
// the look that finds it attached, without waiting for its heartbeat to
// move: the lock says a process holds its side, and a generation read
// while nobody held it is never taken for a live one.
func (w *watch) observe(regs shmem.Mem, before uint64, forced, attached bool, met string, now time.Time, suspectAfter, silentAfter time.Duration, set func(ntb.LinkEvent)) {
	if !attached {
		w.staleGen = before
	}
	// Read again: a peer that closed in order between the two looks left
	// generation 0 behind.
	gen, beat := regs.Load64(regGeneration), regs.Load64(regHeartbeat)
	if gen != w.seen {
		w.seen, w.lastMove = gen, now
	}
	if beat != w.lastBeat {
		w.lastBeat, w.lastMove = beat, now
	}
	ev := ntb.LinkEvent{State: ntb.LinkUp, Reason: "peer attached", Time: now}
	down := func(c ntb.Cause, why string) { ev.State, ev.Cause, ev.Reason = ntb.LinkDown, c, why }
	quiet := now.Sub(w.lastMove)
	switch {
	case forced:
		down(ntb.CauseLocal, "forced down")
	case gen == 0:
		down(ntb.CauseClosed, "peer detached")
	case !attached && met != "":
		down(ntb.CauseGone, "peer process gone; "+met)
	case !attached || gen == w.staleGen:
		down(ntb.CauseGone, "peer process gone")
	case regs.Load32(regPeerDown) != 0:
		down(ntb.CauseHardware, "peer forced the link down")
	case quiet > silentAfter:
		down(ntb.CauseSilent, fmt.Sprintf("peer heartbeat silent for %v", quiet.Round(time.Millisecond)))
	case quiet > suspectAfter:
		ev.Suspect, ev.Reason = true, fmt.Sprintf("peer heartbeat silent for %v", quiet.Round(time.Millisecond))
	}
	if w.state == ntb.LinkUp && ev.State == ntb.LinkUp && gen != w.upGen {
		// The peer we knew is gone; another took its side.
		set(ntb.LinkEvent{State: ntb.LinkDown, Cause: ntb.CauseGone, Reason: "peer re-attached", Time: now})
		w.state, w.suspect = ntb.LinkDown, false
	}
	switch {
	case ev.State != w.state:
		set(ev)
		w.state, w.upGen, w.suspect = ev.State, gen, ev.Suspect
	case w.state == ntb.LinkUp && ev.Suspect != w.suspect:
		if !ev.Suspect {
			ev.Reason = "peer heard again"
		}
		set(ev)
		w.suspect = ev.Suspect
	}
}

// sleep waits for the next beat after the one at last, one interval on,
// or the idle one while the user is idle (and the interval again from the
// moment it stops being), or for checkNow. It reports false once the
// device closes.
func (d *Device) sleep(t *time.Timer, last time.Time) bool {
	for {
		every := d.interval
		if d.idlers.Load() > 0 {
			every = d.idle
		}
		t.Reset(time.Until(last.Add(every)))
		select {
		case <-d.stop:
			return false
		case <-d.busy:
		case <-d.now:
			return true
		case <-t.C:
			return true
		}
	}
}

// Idle is ntb.Idler: while its user is idle the device beats every
// idleInterval, from its next beat; once it is not, one interval after
// its last.
func (d *Device) Idle(on bool) {
	if on {
		d.idlers.Add(1)
		return
	}
	d.idlers.Add(-1)
	select {
	case d.busy <- struct{}{}: // the next beat may be due sooner
	default:
	}
}

// idleInterval is the heartbeat interval of an end whose user is idle
// (Idle): it has nothing to move, so nothing is lost while a dead peer
// goes unnoticed a little longer. Twice the interval, as long as the
// peer's timeout spans five of them: the peer sees a beat move once per
// its own beat, so between two sightings up to two of our intervals and
// two of its pass, and a loaded machine fires timers tens of milliseconds
// late. Every beat costs the process a timer wake-up — three threads (the
// runtime's timer and scheduler threads, and sysmon), ~100-150 µs of CPU
// in all on the 2-vCPU VMs — which was most of what an idle pair spent.
func idleInterval(interval, timeout time.Duration) time.Duration {
	return max(interval, min(2*interval, timeout/5))
}

func (d *Device) setLink(ev ntb.LinkEvent) {
	d.links.Publish(ev)
	d.wakeLocal()
}
