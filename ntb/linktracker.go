package ntb

import (
	"sync"
	"sync/atomic"
	"time"
)

// LinkTracker is the link bookkeeping every backend needs: the current
// state, a count of changes (so a waiter can tell one happened since it
// looked, see WaitDoorbell) and the LinkEvents channel, on which the newest
// event always gets through. Create it with NewLinkTracker; Set and Link
// are safe for concurrent use, Close must follow the last Set.
type LinkTracker struct {
	state   atomic.Int32
	cause   atomic.Int32
	suspect atomic.Bool
	seq     atomic.Uint64
	why     atomic.Pointer[string]
	events  chan LinkEvent

	mu      sync.Mutex
	changed chan struct{} // closed by the next Set (see Changed); nil: nobody asked
}

// linkEventBuffer is the events a slow reader may fall behind by before
// the oldest are dropped.
const linkEventBuffer = 16

// NewLinkTracker returns a tracker in state LinkDown.
func NewLinkTracker() *LinkTracker {
	return &LinkTracker{events: make(chan LinkEvent, linkEventBuffer)}
}

// Link is the current state.
func (t *LinkTracker) Link() LinkState { return LinkState(t.state.Load()) }

// Reason is why the link entered its current state ("" before the first
// Set).
func (t *LinkTracker) Reason() string {
	if p := t.why.Load(); p != nil {
		return *p
	}
	return ""
}

// Cause is why the link is down (CauseNone while up).
func (t *LinkTracker) Cause() Cause { return Cause(t.cause.Load()) }

// Suspect reports an up link whose peer has missed heartbeats.
func (t *LinkTracker) Suspect() bool { return t.suspect.Load() }

// Events is the channel a backend returns from LinkEvents.
func (t *LinkTracker) Events() <-chan LinkEvent { return t.events }

// Seq counts the changes so far.
func (t *LinkTracker) Seq() uint64 { return t.seq.Load() }

// Changed returns a channel closed by the next Set or Close (a backend's
// LinkChanged, see LinkWatcher).
func (t *LinkTracker) Changed() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.changed == nil {
		t.changed = make(chan struct{})
	}
	return t.changed
}

// signal closes the channel Changed handed out.
func (t *LinkTracker) signal() {
	t.mu.Lock()
	if t.changed != nil {
		close(t.changed)
		t.changed = nil
	}
	t.mu.Unlock()
}

// Set records a change of state without a cause (Publish's shorthand).
func (t *LinkTracker) Set(s LinkState, why string, at time.Time) {
	t.Publish(LinkEvent{State: s, Reason: why, Time: at})
}

// Publish records a change — of state, or of an up link's suspicion —
// and publishes it; if the channel is full the oldest event is dropped.
// An up link has no cause and a down one is never suspect: Publish
// clears what does not apply.
func (t *LinkTracker) Publish(ev LinkEvent) {
	if ev.State == LinkUp {
		ev.Cause = CauseNone
	} else {
		ev.Suspect = false
	}
	t.cause.Store(int32(ev.Cause))
	t.suspect.Store(ev.Suspect)
	t.state.Store(int32(ev.State))
	t.why.Store(&ev.Reason)
	t.seq.Add(1)
	t.signal()
	select {
	case t.events <- ev:
	default: // full: drop the oldest, keep the newest
		select {
		case <-t.events:
		default:
		}
		select {
		case t.events <- ev:
		default:
		}
	}
}

// ForceDown marks the link down without an event (a closing device): this
// end took it down.
func (t *LinkTracker) ForceDown() {
	t.cause.Store(int32(CauseLocal))
	t.suspect.Store(false)
	t.state.Store(int32(LinkDown))
}

// CloseLocal is Close for a device that this end closed: an up link goes
// down first, with CauseLocal, as the last event. Call it once the device
// reports itself closed, so that waiters woken by the change find it so.
func (t *LinkTracker) CloseLocal(at time.Time) {
	if t.Link() == LinkUp {
		t.Publish(LinkEvent{State: LinkDown, Cause: CauseLocal, Reason: "closed", Time: at})
	}
	t.ForceDown()
	t.Close()
}

// Close closes the events channel and wakes Changed's waiters.
func (t *LinkTracker) Close() {
	t.signal()
	close(t.events)
}
