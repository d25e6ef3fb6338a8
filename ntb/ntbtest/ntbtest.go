// Package ntbtest provides an in-memory ntb.Device pair for unit tests of
// the layers above ntb, and a conformance suite every backend passes.
//
// The two ends share heap memory: what one writes through its outbound
// window appears in the other's inbound window. Doorbells, scratchpads and
// link state behave like the emulated fabric's, without files, processes or
// privileges. The pair starts with the link up. Liveness is driven by the
// test: SilenceHeartbeat makes the peer's link suspect, ExpireSilence takes
// it down as silent, Kill is a process that died, SetLink a cable pull.
package ntbtest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/internal/doorbell"
)

const (
	doorbellBits   = 64
	scratchpadRegs = 64
)

// Device is one end of an in-memory pair.
type Device struct {
	name string
	port int
	peer *Device
	in   []byte

	mu sync.Mutex
	// mu protects the following fields.
	pending uint64
	mask    uint64
	spads   [scratchpadRegs]uint32
	link    ntb.LinkState
	reason  string // why link is what it is
	cause   ntb.Cause
	suspect bool
	closed  bool

	wake   doorbell.Waiters // woken by every change WaitDoorbell cares about
	events chan ntb.LinkEvent
}

var (
	_ ntb.Device   = (*Device)(nil)
	_ ntb.Liveness = (*Device)(nil)
)

// NewPair returns two connected ends with windows of the given size each.
func NewPair(window int) (*Device, *Device) {
	a := newDevice("ntbtest/0", window)
	b := newDevice("ntbtest/1", window)
	b.port = 1
	a.peer, b.peer = b, a
	return a, b
}

func newDevice(name string, window int) *Device {
	// Backed by uint64s so the window is 8-byte aligned, as a mapping is.
	words := make([]uint64, (window+7)/8)
	return &Device{
		name:   name,
		in:     unsafeBytes(words)[:window],
		link:   ntb.LinkUp,
		events: make(chan ntb.LinkEvent, 16),
	}
}

func (d *Device) Name() string           { return d.name }
func (d *Device) Port() int              { return d.port }
func (d *Device) InboundWindow() []byte  { return d.in }
func (d *Device) OutboundWindow() []byte { return d.peer.in }
func (d *Device) DoorbellCount() int     { return doorbellBits }

// WindowShared reports true (ntb.SharedWindow): the pair's windows are
// the same slices.
func (d *Device) WindowShared() bool { return true }

// changedLocked wakes every waiter.
func (d *Device) changedLocked() { d.wake.Wake() }

func (d *Device) RingPeer(bits uint64) error {
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return ntb.ErrClosed
	}
	p := d.peer
	p.mu.Lock()
	p.pending |= bits
	p.changedLocked()
	p.mu.Unlock()
	return nil
}

func (d *Device) Doorbells() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.pending
}

func (d *Device) ClearDoorbells(bits uint64) {
	d.mu.Lock()
	d.pending &^= bits
	d.mu.Unlock()
}

func (d *Device) SetDoorbellMask(bits uint64) {
	d.mu.Lock()
	d.mask |= bits
	d.mu.Unlock()
}

func (d *Device) ClearDoorbellMask(bits uint64) {
	d.mu.Lock()
	d.mask &^= bits
	d.changedLocked()
	d.mu.Unlock()
}

func (d *Device) WaitDoorbell(ctx context.Context, want uint64) (uint64, error) {
	link := d.Link()
	return d.wake.Wait(ctx, func() (bool, uint64, error) {
		d.mu.Lock()
		defer d.mu.Unlock()
		return doorbell.Done(ctx, d.closed, d.pending&want, d.mask, d.link != link)
	})
}

func (d *Device) ScratchpadCount() int { return scratchpadRegs }

func (d *Device) Scratchpad(i int) (uint32, error) {
	if i < 0 || i >= scratchpadRegs {
		return 0, fmt.Errorf("scratchpad %d of %d: out of range", i, scratchpadRegs)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.spads[i], nil
}

func (d *Device) SetPeerScratchpad(i int, v uint32) error {
	if i < 0 || i >= scratchpadRegs {
		return fmt.Errorf("scratchpad %d of %d: out of range", i, scratchpadRegs)
	}
	p := d.peer
	p.mu.Lock()
	p.spads[i] = v
	p.mu.Unlock()
	return nil
}

func (d *Device) Link() ntb.LinkState {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.link
}

func (d *Device) LinkReason() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.reason
}

func (d *Device) LinkEvents() <-chan ntb.LinkEvent { return d.events }

// Suspect reports an up link whose peer is silenced (see ntb.Liveness).
func (d *Device) Suspect() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.suspect
}

// LinkCause says why the link is down (see ntb.Liveness).
func (d *Device) LinkCause() ntb.Cause {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.cause
}

// SetLink changes the link state on both ends, as a cable pull or a
// retrain would: down with ntb.CauseHardware.
func (d *Device) SetLink(s ntb.LinkState, reason string) {
	d.setLink(ntb.LinkEvent{State: s, Cause: ntb.CauseHardware, Reason: reason})
	d.peer.setLink(ntb.LinkEvent{State: s, Cause: ntb.CauseHardware, Reason: reason})
}

// SilenceHeartbeat makes this end a hung process: while on, the peer's
// link is suspect (an event with Suspect set), and an event with it clear
// says the peer heard from us again. A link ExpireSilence took down comes
// back up when the silence ends.
func (d *Device) SilenceHeartbeat(on bool) {
	if on {
		if d.peer.Link() == ntb.LinkUp {
			d.peer.setLink(ntb.LinkEvent{State: ntb.LinkUp, Suspect: true, Reason: "peer heartbeat silent"})
		}
		return
	}
	p := d.peer
	p.mu.Lock()
	silenced := p.suspect || p.link == ntb.LinkDown && p.cause == ntb.CauseSilent
	p.mu.Unlock()
	if silenced {
		p.setLink(ntb.LinkEvent{State: ntb.LinkUp, Reason: "peer heard again"})
	}
}

// ExpireSilence is the peer's silent timeout running out while this end
// is silenced: the peer takes its link down with ntb.CauseSilent.
func (d *Device) ExpireSilence() {
	d.peer.setLink(ntb.LinkEvent{State: ntb.LinkDown, Cause: ntb.CauseSilent, Reason: "peer heartbeat silent past the timeout"})
}

// Kill is this end's process dying: it closes without detaching, and the
// peer sees the link down with ntb.CauseGone.
func (d *Device) Kill() { d.close(ntb.CauseGone, "peer process gone") }

// setLink applies ev if it changes the state or, on an up link, the
// suspicion.
func (d *Device) setLink(ev ntb.LinkEvent) {
	if ev.State == ntb.LinkUp {
		ev.Cause = ntb.CauseNone
	} else {
		ev.Suspect = false
	}
	ev.Time = time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || d.link == ev.State && d.suspect == ev.Suspect {
		return
	}
	d.link, d.reason, d.cause, d.suspect = ev.State, ev.Reason, ev.Cause, ev.Suspect
	d.changedLocked()
	select {
	case d.events <- ev:
	default: // full: drop the oldest, keep the newest
		<-d.events
		d.events <- ev
	}
}

// Close takes the link down on both ends: this one with ntb.CauseLocal,
// the peer with ntb.CauseClosed.
func (d *Device) Close() error {
	d.close(ntb.CauseClosed, "peer detached")
	return nil
}

func (d *Device) close(peerCause ntb.Cause, why string) {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return
	}
	d.mu.Unlock()
	d.setLink(ntb.LinkEvent{State: ntb.LinkDown, Cause: ntb.CauseLocal, Reason: "closed"})
	d.peer.setLink(ntb.LinkEvent{State: ntb.LinkDown, Cause: peerCause, Reason: why})
	d.mu.Lock()
	d.closed = true
	d.changedLocked()
	close(d.events)
	d.mu.Unlock()
}
