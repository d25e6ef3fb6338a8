package transport

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/ntb/ntbtest"
)

// handshakeBit is the doorbell bit of the link's session handshake
// (package partition), which only the link's goroutine waits on.
const handshakeBit = uint64(1) << 63

// gatedDev is an ntbtest device whose doorbell waits other than the
// handshake's wait at entry while a gate is set, until it is closed or
// their ctx ends.
type gatedDev struct {
	*ntbtest.Device
	gate atomic.Pointer[chan struct{}]
}

func (d *gatedDev) WaitDoorbell(ctx context.Context, want uint64) (uint64, error) {
	if g := d.gate.Load(); g != nil && want&handshakeBit == 0 {
		select {
		case <-*g:
		case <-ctx.Done():
		}
	}
	return d.Device.WaitDoorbell(ctx, want)
}

func current(ep *Endpoint) *state {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	return ep.cur
}

// The two tests below share their set-up: b accepts one connection on
// port 7 while a goroutine of b's ended session is held in a hook and b's
// doorbell waits are held at their entry (gate), and a then dials.

// acceptOne accepts one connection on b's port 7 in the background,
// closes it and sends the result.
func acceptOne(t *testing.T, b *Endpoint) <-chan error {
	ln, err := b.Listen(7)
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.AcceptConn()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	return accepted
}

// hold is where a hook holds the goroutine it runs in: hold closes held
// and waits for free, which the test calls (and the cleanup, once more).
type hold struct {
	held, release chan struct{}
	once          sync.Once
}

func newHold(t *testing.T) *hold {
	h := &hold{held: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(h.free)
	return h
}

func (h *hold) hold() {
	close(h.held)
	<-h.release
}

func (h *hold) free() { h.once.Do(func() { close(h.release) }) }

// closeGate holds gb's doorbell waits at entry until the returned open
// is called (the cleanup calls it too).
func closeGate(t *testing.T, gb *gatedDev) (open func()) {
	gate := make(chan struct{})
	var once sync.Once
	open = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(open)
	gb.gate.Store(&gate)
	return open
}

// dialAsync dials a's port 7 in the background, with a 10 s timeout,
// closes the connection and sends the result.
func dialAsync(a *Endpoint) <-chan error {
	dialed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := a.DialContext(ctx, 7)
		if err == nil {
			c.Close()
		}
		dialed <- err
	}()
	return dialed
}

// awaitClosed fails the test unless ch closes within waitfor.Timeout.
func awaitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitfor.Timeout):
		t.Fatal(what)
	}
}

// The poller of a session that has ended, on its way out, takes the
// doorbell that the peer's OPEN on the next session rang. The next
// session's poller must still see the OPEN: it does not wait on the
// doorbells before the old one has returned. Here the old poller is held
// just after its wait until the OPEN has rung, and every doorbell wait of
// the listener's side is held at entry until the old poller has cleared
// the bit and returned; a new poller already armed and drained by then
// would sleep on, and the dial would hang until its timeout.
func TestNewSessionSeesDoorbellOldPollerTook(t *testing.T) {
	da, db := ntbtest.NewPair(1 << 20)
	t.Cleanup(func() { da.Close(); db.Close() })
	gb := &gatedDev{Device: db}
	a, b := attachPair(t, da, gb, Config{})
	accepted := acceptOne(t, b)
	newEpoch(t, a, 0)
	newEpoch(t, b, 0)
	old := current(b)
	// b is idle from here (no calls, nothing rings it): its poller sleeps
	// on the doorbell until the session ends.
	waitfor.True(t, "b's poller asleep with an Accept pending", func() bool {
		return b.accepting.Load() > 0 && b.Stats().PollerSleeps > 0
	})

	h := newHold(t)
	hook := func(st *state) {
		if st == old && st.sess.Err() != nil {
			h.hold()
		}
	}
	pollerWoke.Store(&hook)
	defer pollerWoke.Store(nil)
	open := closeGate(t, gb)

	oldA := epoch(a)
	restart(b)
	awaitClosed(t, h.held, "the ended session's poller never returned from its doorbell wait")
	newEpoch(t, b, old.sess.Epoch)
	newEpoch(t, a, oldA)
	dialed := dialAsync(a)
	dataBit := current(b).parts[0].DataBit()
	waitfor.True(t, "the OPEN rings b's doorbell", func() bool { return gb.Doorbells()&dataBit != 0 })
	h.free() // the old poller takes the bit and returns
	awaitClosed(t, old.stopped, "the ended session's poller never returned")
	open()
	require.NoError(t, <-dialed, "the dial on the new session")
	require.NoError(t, <-accepted)
}

// As TestNewSessionSeesDoorbellOldPollerTook, for the worker models: there
// the workers, not the poller, wait on the doorbells and clear the bits
// they find, so the worker of a session that has ended is the one that
// may take the bit of the peer's OPEN on the next session. Here the old
// session's RX worker is held just after its wait until the OPEN has rung
// and it has cleared the bit; the new session's workers are each blocked,
// before the OPEN is sent, either waiting for the old one (awaitPrev) or
// having armed and drained their rings, at the entry of their doorbell
// wait, where the gate holds them until the old worker has returned. A
// new worker that had drained already would sleep through the OPEN: the
// workers' looks at their rings (workerRecheck), which would turn that
// into a late dial, are off, so it hangs until the dial's timeout.
//
// The dialer is CoreInline so that the only goroutines in runWorker are
// the listener's.
func TestNewSessionSeesDoorbellOldWorkerTook(t *testing.T) {
	for _, m := range coreModels[1:] {
		t.Run(m.String(), func(t *testing.T) {
			workerNoLook.Store(true)
			defer workerNoLook.Store(false)
			da, db := ntbtest.NewPair(1 << 20)
			t.Cleanup(func() { da.Close(); db.Close() })
			gb := &gatedDev{Device: db}
			a, err := Attach(da, Config{Logf: t.Logf})
			require.NoError(t, err)
			t.Cleanup(func() { a.Close() })
			b, err := Attach(gb, Config{CoreModel: m, Logf: t.Logf})
			require.NoError(t, err)
			t.Cleanup(func() { b.Close() })
			accepted := acceptOne(t, b)
			newEpoch(t, a, 0)
			newEpoch(t, b, 0)
			old := current(b)
			dataBit := old.parts[0].DataBit()
			// b is idle from here (no calls, nothing rings it): its
			// workers sleep on the doorbells until the session ends.
			waitfor.True(t, "b's workers asleep with an Accept pending", func() bool {
				return b.accepting.Load() > 0 && int(old.asleep.Load()) == old.workers
			})

			h := newHold(t)
			hook := func(st *state, bits uint64) {
				if st == old && st.sess.Err() != nil && bits&dataBit != 0 {
					h.hold()
				}
			}
			workerWoke.Store(&hook)
			defer workerWoke.Store(nil)
			open := closeGate(t, gb)

			oldA := epoch(a)
			restart(b)
			awaitClosed(t, h.held, "the ended session's RX worker never returned from its doorbell wait")
			// The old poller, and in CoreSplit the old TX worker, return
			// at the session's end: only the held worker is left.
			waitfor.True(t, "the ended session's other waiters returned", func() bool { return old.waiters.Load() == 1 })
			newEpoch(t, b, old.sess.Epoch)
			newEpoch(t, a, oldA)
			waitfor.BlockedN(t, "(*unit).runWorker", 1+current(b).workers)
			dialed := dialAsync(a)
			waitfor.True(t, "the OPEN rings b's doorbell", func() bool { return gb.Doorbells()&dataBit != 0 })
			h.free() // the old worker takes the bit and returns
			awaitClosed(t, old.stopped, "the ended session's RX worker never returned")
			open()
			require.NoError(t, <-dialed, "the dial on the new session")
			require.NoError(t, <-accepted)
		})
	}
}
