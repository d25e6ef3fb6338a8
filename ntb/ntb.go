// Package ntb is the device model of a PCIe non-transparent bridge port as
// ntstack sees it: memory windows, doorbells, scratchpads and link state.
//
// A Device is one end of one link. Its inbound window is local memory that
// the peer writes across the bridge; its outbound window is this side's
// mapping of the peer's inbound window. The rule every user of a Device
// follows is "poll local, write remote": a side only ever polls words in its
// inbound window, and only ever writes the peer's inbound window through its
// outbound mapping. Reads across the bridge are round trips on real
// hardware; nothing in ntstack issues them on a hot path.
//
// Backends:
//   - ntb/shm: the emulated fabric, shared-memory files between processes
//     (the default and what tests, the demo and the benchmarks use);
//   - ntb/ivshmem: QEMU's ivshmem-doorbell device, a real PCI device driven
//     through vfio inside guests (the VM test tier), or its host-side
//     client; windows, emulated registers and link handshake live in BAR2;
//   - ntb/intel: Intel Xeon (Skylake, Ice Lake) NTB ports through vfio,
//     tested against a simulated register file only;
//   - ntb/ntbtest: an in-memory pair for unit tests of upper layers.
//
// Concurrency: every Device method is safe for concurrent use. The window
// slices stay valid until Close; touching them afterwards faults (shm) or
// reads stale memory (ntbtest), so owners close the device last.
//
// Everything read from the inbound window was written by the peer and is
// untrusted: layers above validate every index, length and offset they
// take from it.
package ntb

import (
	"context"
	"errors"
	"time"

	"github.com/ntstack/ntstack/internal/prim/errs"
)

// ErrNotSupported reports a capability the backend or platform lacks (no
// IOMMU, no write-combining, no such doorbell). Match it with errors.Is.
var ErrNotSupported = errs.ErrNotSupported

// ErrLinkDown is returned by operations that need the peer while the link
// is down.
var ErrLinkDown = errors.New("ntb link down")

// ErrClosed is returned by operations on a closed Device.
var ErrClosed = errors.New("ntb device closed")

// LinkState is the state of the link between this port and its peer.
type LinkState int

const (
	LinkDown LinkState = iota
	LinkUp
)

func (s LinkState) String() string {
	if s == LinkUp {
		return "up"
	}
	return "down"
}

// Cause says why a link went down, so that the layers above can tell a
// peer that is gone from one that is only quiet: a connection ends with a
// reset when its peer is gone, and only pauses while its peer is silent.
type Cause int

const (
	// CauseNone: the link is up, or the backend cannot tell.
	CauseNone Cause = iota
	// CauseClosed: the peer detached in order (closed its end).
	CauseClosed
	// CauseGone: the peer's process is gone without detaching (it
	// crashed or was killed).
	CauseGone
	// CauseSilent: the peer is still attached but has been silent for
	// longer than the user timeout.
	CauseSilent
	// CauseLocal: this end took the link down (forced down, closed).
	CauseLocal
	// CauseHardware: the link itself failed (PCIe link down, device
	// removed, link memory lost).
	CauseHardware
)

func (c Cause) String() string {
	switch c {
	case CauseClosed:
		return "peer closed"
	case CauseGone:
		return "peer gone"
	case CauseSilent:
		return "peer silent"
	case CauseLocal:
		return "local"
	case CauseHardware:
		return "link failed"
	}
	return "none"
}

// LinkEvent reports a change of link state, or of its liveness.
type LinkEvent struct {
	State LinkState
	// Cause says why a link went down (CauseNone while up).
	Cause Cause
	// Suspect is set on an up link whose peer has missed heartbeats but
	// is not known to be gone: connections wait for it rather than fail,
	// and may move to another path. An event with Suspect clear on an up
	// link says the peer was heard again.
	Suspect bool
	// Reason says why the link changed, for logs ("peer attached",
	// "peer heartbeat lost for 60ms", "forced down").
	Reason string
	Time   time.Time
}

// Liveness is a Device that tells a quiet peer from a gone one: Suspect
// reports an up link whose peer has missed heartbeats, LinkCause why the
// link is down (CauseNone while up).
type Liveness interface {
	Suspect() bool
	LinkCause() Cause
}

// Device is one port of an NTB link.
type Device interface {
	// Name identifies the device in logs and errors.
	Name() string
	// Port is this end's index on the link, 0 or 1 (Linux's
	// ntb_port_number). The two ends of a link differ; upper layers use
	// it to break symmetry.
	Port() int

	// InboundWindow is local memory the peer writes through its outbound
	// window. Its contents are untrusted.
	InboundWindow() []byte
	// OutboundWindow is this side's mapping of the peer's inbound window.
	// It has the same size as the peer's inbound window. Writes are posted;
	// never read from it on a hot path.
	OutboundWindow() []byte

	// DoorbellCount is the number of doorbell bits (bit i < DoorbellCount).
	DoorbellCount() int
	// RingPeer sets doorbell bits on the peer. Cheap if the peer is not
	// sleeping; a wake-up otherwise.
	RingPeer(bits uint64) error
	// Doorbells returns the pending local doorbell bits, masked ones
	// included.
	Doorbells() uint64
	// ClearDoorbells acknowledges pending local bits.
	ClearDoorbells(bits uint64)
	// SetDoorbellMask masks bits: a masked bit stays pending but does not
	// wake WaitDoorbell. Unmask with ClearDoorbellMask.
	SetDoorbellMask(bits uint64)
	ClearDoorbellMask(bits uint64)
	// WaitDoorbell blocks until an unmasked bit in want is pending, the
	// link changes state, ctx ends or the device closes, and returns the
	// pending bits of want (possibly zero on a link change). It does not
	// clear them. Callers re-check their condition after every return.
	// A link change is noticed from the moment of the call: a caller that
	// looked at Link before calling must look again after, or bound the
	// wait with ctx, or it can sleep through a change that fell between.
	WaitDoorbell(ctx context.Context, want uint64) (uint64, error)

	// ScratchpadCount is the number of 32-bit scratchpad registers.
	ScratchpadCount() int
	// Scratchpad reads local scratchpad i (written by the peer).
	Scratchpad(i int) (uint32, error)
	// SetPeerScratchpad writes the peer's scratchpad i.
	SetPeerScratchpad(i int, v uint32) error

	// Link is the current link state.
	Link() LinkState
	// LinkReason says why the link entered its current state, for logs
	// and errors ("peer heartbeat silent for 300ms").
	LinkReason() string
	// LinkEvents delivers link state changes. The channel is buffered and
	// closed on Close; a slow reader misses intermediate events but always
	// sees the latest state through Link.
	LinkEvents() <-chan LinkEvent

	// Close detaches from the link (the peer sees it go down) and unmaps
	// the windows. It is idempotent.
	Close() error
}

// Idler is a Device whose liveness checks may run less often while its
// user has nothing to move: the user calls Idle(true) before it sleeps on
// the doorbell with nothing in flight on its side, and Idle(false) once it
// woke (calls nest, counted).
type Idler interface {
	Idle(on bool)
}

// SharedWindow is a Device whose outbound window is the very memory of the
// peer's inbound window, as on the emulated fabric: a write to it lands
// there whatever the link's state, and what this end wrote stays until
// this end overwrites it. WindowShared reports whether that holds. A
// sender may then keep what it sent by reference and read it back after
// a session ends; behind a bridge, whose posted writes may be lost with a
// failing link, it keeps a copy instead.
type SharedWindow interface {
	WindowShared() bool
}

// LinkWatcher is a Device that can tell a waiter of the next link change:
// LinkChanged returns a channel closed by the first change after the
// call. Taken before a look at Link, it closes WaitDoorbell's window (a
// change between the look and the call), so a caller needs no periodic
// re-check.
type LinkWatcher interface {
	LinkChanged() <-chan struct{}
}
