package doorbell

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ntstack/ntstack/internal/prim/shmem"
	"github.com/ntstack/ntstack/ntb"
)

func TestDone(t *testing.T) {
	live, ended := context.Background(), canceled()
	for _, tc := range []struct {
		name                 string
		ctx                  context.Context
		closed, linkChanged  bool
		pending, mask, wantP uint64
		done                 bool
		err                  error
	}{
		{name: "nothing pending", ctx: live},
		{name: "pending, masked", ctx: live, pending: 1, mask: 1, wantP: 1},
		{name: "pending, one unmasked", ctx: live, pending: 3, mask: 1, wantP: 3, done: true},
		{name: "link changed", ctx: live, linkChanged: true, done: true},
		{name: "masked, link changed", ctx: live, pending: 1, mask: 1, linkChanged: true, wantP: 1, done: true},
		{name: "ctx ended", ctx: ended, pending: 1, mask: 1, wantP: 1, done: true, err: context.Canceled},
		{name: "closed wins", ctx: ended, closed: true, pending: 1, done: true, err: ntb.ErrClosed},
	} {
		done, p, err := Done(tc.ctx, tc.closed, tc.pending, tc.mask, tc.linkChanged)
		if done != tc.done || p != tc.wantP || !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
			t.Errorf("%s: Done = %v, %#x, %v; want %v, %#x, %v", tc.name, done, p, err, tc.done, tc.wantP, tc.err)
		}
	}
}

func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

func TestMaskUpdate(t *testing.T) {
	var m Mask
	var mirrored uint64
	m.Update(0b1110, 0b0100, func(mask uint64) { mirrored = mask })
	if m.Load() != 0b1010 || mirrored != 0b1010 {
		t.Fatalf("mask %#b, mirrored %#b; want 0b1010", m.Load(), mirrored)
	}
	m.Update(0, 0b1000, nil)
	if m.Load() != 0b0010 {
		t.Fatalf("mask %#b; want 0b10", m.Load())
	}
}

// A Wake that comes after Wait's look, while it sleeps, ends the sleep: the
// state the waiter waits for is published before the Wake, as a backend's
// ring is.
func TestWaitersWake(t *testing.T) {
	var w Waiters
	var pending atomic.Uint64
	looked := make(chan struct{}, 100)
	got := make(chan uint64, 1)
	go func() {
		p, err := w.Wait(context.Background(), func() (bool, uint64, error) {
			looked <- struct{}{}
			return Done(context.Background(), false, pending.Load(), 0, false)
		})
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	<-looked // the first look found nothing: the waiter sleeps, or is about to
	pending.Store(4)
	w.Wake()
	select {
	case p := <-got:
		if p != 4 {
			t.Fatalf("Wait returned %#x, want 0x4", p)
		}
	case <-time.After(time.Minute):
		t.Fatal("Wait did not return after Wake")
	}
}

func TestWaitersContext(t *testing.T) {
	var w Waiters
	ctx, cancel := context.WithCancel(context.Background())
	looked := make(chan struct{}, 100)
	errc := make(chan error, 1)
	go func() {
		_, err := w.Wait(ctx, func() (bool, uint64, error) {
			looked <- struct{}{}
			return Done(ctx, false, 0, 0, false)
		})
		errc <- err
	}()
	<-looked
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait: %v, want context.Canceled", err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Wait did not return after its context ended")
	}
	w.Wake() // no waiter: nothing to close, no panic
}

// Two ends' Counters over one pair of register blocks: a ring is pending
// at the peer until it clears it, concurrent rings are all counted, and
// an end attached anew does not see rings meant for the one before.
func TestCounters(t *testing.T) {
	regsA, regsB := shmem.Mem(make([]byte, 4*shmem.DoorbellBits)), shmem.Mem(make([]byte, 4*shmem.DoorbellBits))
	var a, b Counters
	a.Attach(regsA, regsB, 0)
	b.Attach(regsB, regsA, 0)
	a.Ring(1<<3 | 1<<60)
	if got := b.Pending(); got != 1<<3|1<<60 {
		t.Fatalf("pending %#x after a ring of bits 3 and 60", got)
	}
	b.Clear(1 << 3)
	if got := b.Pending(); got != 1<<60 {
		t.Fatalf("pending %#x after clearing bit 3", got)
	}
	b.Clear(1 << 60)
	done := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for range 1000 {
				a.Ring(1 << 7)
			}
		}()
	}
	for range 4 {
		<-done
	}
	if got := regsB.Load32(4 * 7); got != 4000 {
		t.Fatalf("bit 7's counter %d after 4000 rings", got)
	}
	a.Ring(1 << 9)
	var b2 Counters
	b2.Attach(regsB, regsA, 0)
	if got := b2.Pending(); got != 0 {
		t.Fatalf("a new attachment sees %#x pending", got)
	}
}
