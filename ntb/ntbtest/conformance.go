package ntbtest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ntstack/ntstack/ntb"
)

// LinkDetectTimeout is how fast every backend must notice a peer going
// away (ntstack's promise: within 100 ms).
const LinkDetectTimeout = 100 * time.Millisecond

// WaitLink waits up to timeout for d's link to reach state s.
func WaitLink(t testing.TB, d ntb.Device, s ntb.LinkState, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for d.Link() != s {
		if time.Now().After(deadline) {
			t.Fatalf("%s: link still %v after %v, want %v", d.Name(), d.Link(), timeout, s)
		}
		time.Sleep(time.Millisecond)
	}
}

// Conformance checks that a backend behaves as ntb.Device promises. pair
// returns two fresh, connected ends; the suite closes them.
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
		WaitLink(t, a, ntb.LinkUp, time.Second)
		WaitLink(t, b, ntb.LinkUp, time.Second)
		got := make(chan uint64, 1)
		go func() {
			bits, err := b.WaitDoorbell(context.Background(), 1<<3)
			if err != nil {
				t.Error(err)
			}
			got <- bits
		}()
		time.Sleep(10 * time.Millisecond) // let it sleep, so the ring has to wake it
		if err := a.RingPeer(1<<3 | 1<<5); err != nil {
			t.Fatal(err)
		}
		select {
		case bits := <-got:
			if bits != 1<<3 {
				t.Fatalf("woke with bits %#x, want %#x", bits, 1<<3)
			}
		case <-time.After(time.Second):
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
		WaitLink(t, b, ntb.LinkUp, time.Second)
		b.SetDoorbellMask(1)
		if err := a.RingPeer(1); err != nil {
			t.Fatal(err)
		}
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
		WaitLink(t, a, ntb.LinkUp, time.Second)
		WaitLink(t, b, ntb.LinkUp, time.Second)
		woke := make(chan error, 1)
		go func() {
			_, err := b.WaitDoorbell(context.Background(), 1)
			woke <- err
		}()
		time.Sleep(10 * time.Millisecond) // let it sleep before the link changes
		start := time.Now()
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		if err := a.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		WaitLink(t, b, ntb.LinkDown, LinkDetectTimeout)
		select {
		case <-woke:
		case <-time.After(LinkDetectTimeout):
			t.Fatal("link down did not wake a doorbell waiter")
		}
		var ev ntb.LinkEvent
		for ev = range drain(b.LinkEvents()) {
		}
		if ev.State != ntb.LinkDown {
			t.Fatalf("last link event %+v, want down", ev)
		}
		t.Logf("peer close detected in %v (%s)", time.Since(start).Round(time.Millisecond), ev.Reason)
		if err := a.RingPeer(1); !errors.Is(err, ntb.ErrClosed) {
			t.Fatalf("RingPeer after Close: %v, want ErrClosed", err)
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
