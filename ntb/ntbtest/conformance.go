package ntbtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/ntb"
)

// WaitLink waits up to timeout for d's link to reach state s. A device
// that tells of link changes (ntb.LinkWatcher) is watched, one that does
// not is looked at every millisecond.
func WaitLink(t testing.TB, d ntb.Device, s ntb.LinkState, timeout time.Duration) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	w, watches := d.(ntb.LinkWatcher)
	for {
		var changed <-chan struct{}
		var poll <-chan time.Time
		if watches {
			changed = w.LinkChanged() // before the look, so no change falls between
		} else {
			poll = time.After(time.Millisecond)
		}
		if d.Link() == s {
			return
		}
		select {
		case <-changed:
		case <-poll:
		case <-deadline.C:
			if d.Link() == s { // a change and the deadline both came while this end was not running
				return
			}
			t.Fatalf("%s: link still %v after %v, want %v", d.Name(), d.Link(), timeout, s)
		}
	}
}

// LivenessTimeout bounds the suite's waits for an event: long, so that a
// loaded machine never fails them; they assert what happened, not how
// fast.
const LivenessTimeout = 30 * time.Second

// Silencer is a Device whose heartbeat a test can stop, as a hung or
// starved process's stops: its peer's link turns suspect, not down.
type Silencer interface {
	SilenceHeartbeat(on bool)
}

// WaitEvent reads d's link events until one satisfies want and returns
// it with the events before it; it fails the test after timeout, or if
// the channel closes first.
func WaitEvent(t testing.TB, d ntb.Device, timeout time.Duration, what string, want func(ntb.LinkEvent) bool) (ntb.LinkEvent, []ntb.LinkEvent) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var before []ntb.LinkEvent
	for {
		select {
		case ev, ok := <-d.LinkEvents():
			if !ok {
				t.Fatalf("%s: link events ended waiting for %s (after %+v)", d.Name(), what, before)
			}
			if want(ev) {
				return ev, before
			}
			before = append(before, ev)
		case <-deadline.C:
			t.Fatalf("%s: no %s within %v (events %+v; link %v: %s)", d.Name(), what, timeout, before, d.Link(), d.LinkReason())
		}
	}
}

// IsDown matches a down event with cause c.
func IsDown(c ntb.Cause) func(ntb.LinkEvent) bool {
	return func(ev ntb.LinkEvent) bool { return ev.State == ntb.LinkDown && ev.Cause == c }
}

// IsSuspect matches an up event whose suspicion is on.
func IsSuspect(on bool) func(ntb.LinkEvent) bool {
	return func(ev ntb.LinkEvent) bool { return ev.State == ntb.LinkUp && ev.Suspect == on }
}

// Conformance checks that a backend behaves as ntb.Device promises. pair
// returns two fresh, connected ends; the suite closes them. A backend that
// implements ntb.Liveness is held to its contract too: causes on close,
// and, where its ends are Silencers, a silent peer is suspect, not down.
func Conformance(t *testing.T, pair func(t *testing.T) (a, b ntb.Device)) {
	t.Run("Windows", func(t *testing.T) {
		a, b := pair(t)
		defer a.Close()
		defer b.Close()
		if len(a.OutboundWindow()) != len(b.InboundWindow()) || len(b.OutboundWindow()) != len(a.InboundWindow()) {
			t.Fatalf("window sizes: a out %d, b in %d, b out %d, a in %d",
				len(a.OutboundWindow()), len(b.InboundWindow()), len(b.OutboundWindow()), len(a.InboundWindow()))
		}
		out, in := a.OutboundWindow(), b.InboundWindow()
		for _, off := range []int{0, len(out) / 2, len(out) - 1} {
			out[off] = byte(off + 1)
			if in[off] != byte(off+1) {
				t.Fatalf("byte %d written through a's outbound window not seen in b's inbound", off)
			}
		}
	})

	t.Run("Doorbell", func(t *testing.T) {
		a, b := pair(t)
		defer a.Close()
		defer b.Close()
		WaitLink(t, a, ntb.LinkUp, LivenessTimeout)
		WaitLink(t, b, ntb.LinkUp, LivenessTimeout)
		got := make(chan uint64, 1)
		go func() {
			bits, err := b.WaitDoorbell(context.Background(), 1<<3)
			if err != nil {
				t.Error(err)
			}
			got <- bits
		}()
		waitfor.Blocked(t, "WaitDoorbell") // asleep, so the ring has to wake it
		if err := a.RingPeer(1<<3 | 1<<5); err != nil {
			t.Fatal(err)
		}
		select {
		case bits := <-got:
			if bits != 1<<3 {
				t.Fatalf("woke with bits %#x, want %#x", bits, 1<<3)
			}
		case <-time.After(LivenessTimeout):
			t.Fatal("ring did not wake the waiter")
		}
		if p := b.Doorbells(); p != 1<<3|1<<5 {
			t.Fatalf("pending %#x, want %#x", p, 1<<3|1<<5)
		}
		b.ClearDoorbells(1 << 3)
		if p := b.Doorbells(); p != 1<<5 {
			t.Fatalf("pending after clear %#x, want %#x", p, 1<<5)
		}
		b.ClearDoorbells(1 << 5)
		if p := b.Doorbells(); p != 0 {
			t.Fatalf("pending after clear %#x", p)
		}
	})

	t.Run("Mask", func(t *testing.T) {
		a, b := pair(t)
		defer a.Close()
		defer b.Close()
		WaitLink(t, b, ntb.LinkUp, LivenessTimeout)
		b.SetDoorbellMask(1)
		if err := a.RingPeer(1); err != nil {
			t.Fatal(err)
		}
		// A while to watch for a wrong wake-up: a slow machine can only
		// make a masked wake-up go unseen, never fail a correct backend.
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		if _, err := b.WaitDoorbell(ctx, 1); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("masked bit woke the waiter (err %v)", err)
		}
		if b.Doorbells()&1 == 0 {
			t.Fatal("masked bit is not pending")
		}
		b.ClearDoorbellMask(1)
		if bits, err := b.WaitDoorbell(context.Background(), 1); err != nil || bits != 1 {
			t.Fatalf("after unmask: bits %#x, err %v", bits, err)
		}
	})

	t.Run("Scratchpads", func(t *testing.T) {
		a, b := pair(t)
		defer a.Close()
		defer b.Close()
		if a.ScratchpadCount() < 8 {
			t.Fatalf("%d scratchpads, want at least 8", a.ScratchpadCount())
		}
		if err := a.SetPeerScratchpad(2, 0xdeadbeef); err != nil {
			t.Fatal(err)
		}
		if v, err := b.Scratchpad(2); err != nil || v != 0xdeadbeef {
			t.Fatalf("scratchpad 2 = %#x, %v", v, err)
		}
		if _, err := b.Scratchpad(b.ScratchpadCount()); err == nil {
			t.Fatal("out-of-range scratchpad read succeeded")
		}
	})

	t.Run("PeerCloseTakesLinkDown", func(t *testing.T) {
		a, b := pair(t)
		defer b.Close()
		WaitLink(t, a, ntb.LinkUp, LivenessTimeout)
		WaitLink(t, b, ntb.LinkUp, LivenessTimeout)
		woke := make(chan error, 1)
		go func() {
			_, err := b.WaitDoorbell(context.Background(), 1)
			woke <- err
		}()
		waitfor.Blocked(t, "WaitDoorbell") // asleep before the link changes
		start := time.Now()
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if err := a.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		// The close itself tells the peer, so the down comes at once; the
		// waits' bound is a failure guard, and what shows it was the
		// close and not a silence outlasting its timeout is the cause.
		WaitLink(t, b, ntb.LinkDown, LivenessTimeout)
		select {
		case <-woke:
		case <-time.After(LivenessTimeout):
			t.Fatal("link down did not wake a doorbell waiter")
		}
		var ev ntb.LinkEvent
		for ev = range drain(b.LinkEvents()) {
		}
		if ev.State != ntb.LinkDown {
			t.Fatalf("last link event %+v, want down", ev)
		}
		if l, ok := b.(ntb.Liveness); ok && (ev.Cause != ntb.CauseClosed || l.LinkCause() != ntb.CauseClosed) {
			t.Fatalf("peer's close: last event %+v, LinkCause %v; want %v", ev, l.LinkCause(), ntb.CauseClosed)
		}
		t.Logf("peer close detected in %v (%s)", time.Since(start).Round(time.Millisecond), ev.Reason)
		if err := a.RingPeer(1); !errors.Is(err, ntb.ErrClosed) {
			t.Fatalf("RingPeer after Close: %v, want ErrClosed", err)
		}
	})

	conformLiveness(t, pair)
}

// conformLiveness is the part of Conformance for ntb.Liveness.
func conformLiveness(t *testing.T, pair func(t *testing.T) (a, b ntb.Device)) {
	t.Run("CloseCauses", func(t *testing.T) {
		a, b := pair(t)
		defer b.Close()
		la, okA := a.(ntb.Liveness)
		lb, okB := b.(ntb.Liveness)
		if !okA || !okB {
			a.Close()
			t.Skipf("%T does not implement ntb.Liveness", a)
		}
		WaitLink(t, a, ntb.LinkUp, LivenessTimeout)
		WaitLink(t, b, ntb.LinkUp, LivenessTimeout)
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		ev, _ := WaitEvent(t, b, LivenessTimeout, "down (peer closed)", func(ev ntb.LinkEvent) bool { return ev.State == ntb.LinkDown })
		if ev.Cause != ntb.CauseClosed || lb.LinkCause() != ntb.CauseClosed {
			t.Fatalf("peer's orderly close: event %+v, LinkCause %v; want %v", ev, lb.LinkCause(), ntb.CauseClosed)
		}
		var last ntb.LinkEvent
		for last = range drain(a.LinkEvents()) {
		}
		if last.State != ntb.LinkDown || last.Cause != ntb.CauseLocal || la.LinkCause() != ntb.CauseLocal {
			t.Fatalf("closing end: last event %+v, LinkCause %v; want down, %v", last, la.LinkCause(), ntb.CauseLocal)
		}
	})

	t.Run("SilentPeerIsSuspectNotDown", func(t *testing.T) {
		a, b := pair(t)
		defer a.Close()
		defer b.Close()
		s, okA := a.(Silencer)
		lb, okB := b.(ntb.Liveness)
		if !okA || !okB {
			t.Skipf("%T cannot be silenced or %T does not implement ntb.Liveness", a, b)
		}
		WaitLink(t, a, ntb.LinkUp, LivenessTimeout)
		WaitLink(t, b, ntb.LinkUp, LivenessTimeout)
		s.SilenceHeartbeat(true)
		_, before := WaitEvent(t, b, LivenessTimeout, "suspect", IsSuspect(true))
		for _, ev := range before {
			if ev.State == ntb.LinkDown {
				t.Fatalf("silent peer took the link down: %+v", ev)
			}
		}
		if b.Link() != ntb.LinkUp || !lb.Suspect() {
			t.Fatalf("after a suspect event: link %v, suspect %v", b.Link(), lb.Suspect())
		}
		s.SilenceHeartbeat(false)
		_, before = WaitEvent(t, b, LivenessTimeout, "peer heard again", IsSuspect(false))
		for _, ev := range before {
			if ev.State == ntb.LinkDown {
				t.Fatalf("silent peer took the link down: %+v", ev)
			}
		}
		if b.Link() != ntb.LinkUp || lb.Suspect() || lb.LinkCause() != ntb.CauseNone {
			t.Fatalf("peer heard again: link %v, suspect %v, cause %v", b.Link(), lb.Suspect(), lb.LinkCause())
		}
	})
}

// drain returns the events already queued on ch.
func drain(ch <-chan ntb.LinkEvent) <-chan ntb.LinkEvent {
	out := make(chan ntb.LinkEvent, cap(ch))
	for {
		select {
		case ev, ok := <-ch:
			if !ok {
				close(out)
				return out
			}
			out <- ev
		default:
			close(out)
			return out
		}
	}
}
