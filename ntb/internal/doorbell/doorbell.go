// Package doorbell is what the ntb backends share about doorbells: the
// mask, the wake-up of WaitDoorbell callers, WaitDoorbell's check and
// loop, and the emulated bits of the backends that keep them in shared
// memory (Counters). A backend with hardware bits (an interrupt status
// register) keeps its own, and each keeps its own way of waking the peer.
//
// Concurrency: Mask, Waiters and Counters are safe for concurrent use; the
// zero values of Mask and Waiters are ready (nothing masked, no waiter).
package doorbell

import (
	"context"
	"sync"

	"github.com/ntstack/ntstack/internal/prim/shmem"
	"github.com/ntstack/ntstack/ntb"
)

// Mask is a device's doorbell mask: a pending bit that is masked does not
// end WaitDoorbell.
type Mask struct {
	mu sync.Mutex
	// mu protects bits.
	bits uint64
}

// Load returns the mask.
func (m *Mask) Load() uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bits
}

// Update sets the bits of set, then clears those of clear, and calls
// apply (if not nil) with the new mask before another Update can run, so
// that a register mirroring the mask sees the updates in their order.
func (m *Mask) Update(set, clear uint64, apply func(mask uint64)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.bits = (m.bits | set) &^ clear
	if apply != nil {
		apply(m.bits)
	}
}

// Waiters wakes a device's WaitDoorbell callers: each takes the channel
// that the next Wake closes before it looks at the device, so a ring, an
// unmask, a link change or Close that comes after the look ends its sleep.
type Waiters struct {
	mu sync.Mutex
	// mu protects wake.
	wake chan struct{} // closed and replaced by Wake; nil until needed
}

// next returns the channel the next Wake closes.
func (w *Waiters) next() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.wake == nil {
		w.wake = make(chan struct{})
	}
	return w.wake
}

// Wake wakes every caller of Wait so that it looks again.
func (w *Waiters) Wake() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.wake != nil {
		close(w.wake)
		w.wake = nil
	}
}

// Wait is WaitDoorbell's loop: it calls look, and sleeps until Wake or
// the end of ctx while look says the wait is not over. look is typically
// a closure over Done.
func (w *Waiters) Wait(ctx context.Context, look func() (done bool, pending uint64, err error)) (uint64, error) {
	for {
		wake := w.next()
		if done, p, err := look(); done {
			return p, err
		}
		select {
		case <-wake:
		case <-ctx.Done():
		}
	}
}

// Done is WaitDoorbell's look before each sleep. Given the device's state
// — closed, the pending bits of the ones waited for, the mask, whether the
// link changed since the wait began — it says whether the wait is over
// and what WaitDoorbell returns: ntb.ErrClosed once closed; the pending
// bits once one of them is unmasked or the link changed; the pending bits
// and ctx's error once ctx ends.
func Done(ctx context.Context, closed bool, pending, mask uint64, linkChanged bool) (done bool, p uint64, err error) {
	switch {
	case closed:
		return true, 0, ntb.ErrClosed
	case pending&^mask != 0, linkChanged:
		return true, pending, nil
	case ctx.Err() != nil:
		return true, pending, ctx.Err()
	}
	return false, pending, nil
}

// Counters are the doorbell bits of a backend that emulates them in
// shared memory (shmem.Doorbells), behind the lock their owner would
// otherwise keep. Attach before any other call; the zero value holds none.
type Counters struct {
	mu sync.Mutex
	// mu protects c.
	c *shmem.Doorbells
}

// Attach (re)attaches to the counters at base of the local and remote
// register blocks, resuming both where they stand (see
// shmem.NewDoorbells): rings meant for an earlier attachment do not look
// pending.
func (c *Counters) Attach(local, remote shmem.Mem, base int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.c = shmem.NewDoorbells(local, remote, base)
}

// Ring raises bits on the peer.
func (c *Counters) Ring(bits uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.c.Ring(bits)
}

// Pending returns the bits raised on us since their last Clear.
func (c *Counters) Pending() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.c.Pending()
}

// Clear acknowledges bits.
func (c *Counters) Clear(bits uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.c.Clear(bits)
}
