// The link monitor: heartbeats, the peer's liveness (up, suspect, down
// and why), and the doorbell vector that wakes waiters and the monitor.

package ivshmem

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/ntstack/ntstack/ntb"
)

// SilenceHeartbeat is fault injection, a hung attachment: while on, the
// device stops heartbeating, so the peer finds the link suspect after its
// heartbeat timeout (and a new attachment may take the side over) and
// takes it down after its silent timeout.
func (d *Device) SilenceHeartbeat(on bool) { d.silent.Store(on) }

// runDoorbells waits on the doorbell vector and wakes WaitDoorbell callers
// and the monitor each time it fires, until ctx ends.
func (d *Device) runDoorbells(ctx context.Context) {
	defer close(d.waitDone)
	for {
		err := d.port.Wait(ctx, devVector)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// The port broke under us; the monitor's beat still sees the
			// peer. Do not spin.
			select {
			case <-ctx.Done():
				return
			case <-time.After(d.interval):
			}
			continue
		}
		d.wakeLocal()
		d.pokeMonitor()
	}
}

// peerWatch is what the monitor knows of the current peer.
type peerWatch struct {
	gen    uint64        // the peer's generation
	beat   uint64        // its heartbeat as last seen
	silent time.Duration // how long we have watched its heartbeat stand still
	last   time.Time     // our previous check
	acked  uint64        // the generation we last accepted
}

// runMonitor beats our heart and checks the peer every interval and
// whenever the doorbell vector fires.
func (d *Device) runMonitor() {
	defer close(d.monitorDone)
	t := time.NewTicker(d.interval)
	defer t.Stop()
	var w peerWatch
	var upGen uint64
	state, suspect := ntb.LinkDown, false
	for {
		now := time.Now()
		if !d.silent.Load() {
			d.self.Store64(devSlotBeat, d.beats.Add(1))
		}
		ev := d.checkPeer(now, &w)
		if state == ntb.LinkUp && ev.State == ntb.LinkUp && w.gen != upGen {
			// The peer we knew is gone; another took its side.
			d.setLink(ntb.LinkEvent{State: ntb.LinkDown, Cause: ntb.CauseGone, Reason: "peer re-attached", Time: now})
			state = ntb.LinkDown
		}
		switch {
		case ev.State != state:
			d.setLink(ev)
			state, upGen, suspect = ev.State, w.gen, ev.Suspect
		case state == ntb.LinkUp && ev.Suspect != suspect:
			if !ev.Suspect {
				ev.Reason = "peer heard again"
			}
			d.setLink(ev)
			suspect = ev.Suspect
		}
		select {
		case <-d.stop:
			return
		case <-t.C:
		case <-d.poke:
		}
	}
}

// peerLister is a Port that knows which peers are connected (the
// host-side Client: the server announces a peer's exit when its process's
// socket closes).
type peerLister interface{ Peers() []int }

// checkPeer validates what the registers and the presence table say about
// the peer, accepts a new peer generation, and says whether the link is up
// or suspect, or why it is down.
func (d *Device) checkPeer(now time.Time, w *peerWatch) ntb.LinkEvent {
	down := func(c ntb.Cause, format string, args ...any) ntb.LinkEvent {
		return ntb.LinkEvent{State: ntb.LinkDown, Cause: c, Reason: fmt.Sprintf(format, args...), Time: now}
	}
	// Silence counts only while we watch: a round of ours that comes late
	// (the process or the VM was not running, which on a loaded host
	// stalls both ends alike) adds at most two intervals, so our own
	// stall never makes the peer look dead. A peer that really vanished
	// is still declared down after HeartbeatTimeout of on-time rounds.
	var gap time.Duration
	if !w.last.IsZero() {
		gap = min(now.Sub(w.last), 2*d.interval)
	}
	w.last = now
	if d.evicted.Load() {
		return down(ntb.CauseLocal, "side %d taken over by another attachment", d.side)
	}
	// Still ours? An attachment that judged us dead may have taken over.
	// (A read of the words we write: ivshmem memory is all local, and
	// this happens once a beat.)
	if d.remote.Load64(devRegPeerGen) != d.gen || d.remote.Load32(devRegPeerID) != uint32(d.id)+1 ||
		d.self.Load64(devSlotGen) != d.gen {
		d.evicted.Store(true)
		d.self.Store32(devSlotState, devStateIdle)
		return down(ntb.CauseLocal, "side %d taken over by another attachment", d.side)
	}
	id, ok := d.peerID()
	gen := d.local.Load64(devRegPeerGen)
	if !ok || gen == 0 {
		return down(ntb.CauseClosed, "peer detached")
	}
	s := d.slot(id)
	if s.Load64(devSlotGen) != gen || s.Load32(devSlotState) != devStateHold+uint32(1-d.side) {
		return down(ntb.CauseClosed, "peer %d detached", id)
	}
	if pl, ok := d.port.(peerLister); ok && gen == w.acked && !slices.Contains(pl.Peers(), id) {
		// Only a peer we accepted: a new one may reach our registers
		// before the server's announcement of it reaches us.
		return down(ntb.CauseGone, "peer %d gone (its process left the ivshmem server)", id)
	}
	beat := s.Load64(devSlotBeat)
	switch {
	case gen != w.gen:
		w.gen, w.beat, w.silent = gen, beat, 0
	case beat != w.beat:
		w.beat, w.silent = beat, 0
	default:
		w.silent += gap
	}
	if w.acked != gen {
		d.remote.Store64(devRegPeerAck, gen)
		w.acked = gen
		_ = d.port.Ring(id, devVector) // "accepted": the peer checks now
	}
	if d.local.Load64(devRegPeerAck) != d.gen {
		return down(ntb.CauseNone, "peer %d has not accepted us", id)
	}
	if w.silent > d.silentAfter {
		return down(ntb.CauseSilent, "peer %d heartbeat silent for %v", id, w.silent.Round(time.Millisecond))
	}
	if w.silent > d.timeout {
		return ntb.LinkEvent{State: ntb.LinkUp, Suspect: true, Time: now,
			Reason: fmt.Sprintf("peer %d heartbeat silent for %v", id, w.silent.Round(time.Millisecond))}
	}
	return ntb.LinkEvent{State: ntb.LinkUp, Reason: fmt.Sprintf("peer %d attached", id), Time: now}
}

func (d *Device) setLink(ev ntb.LinkEvent) {
	d.links.Publish(ev)
	d.wakeLocal()
}
