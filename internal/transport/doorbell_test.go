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
	ln, err := b.Listen(7)
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan error, 1)
	go func() {
		c, err := ln.AcceptConn()
		if err == nil {
			c.Close()
		}
		accepted <- err
	}()
	newEpoch(t, a, 0)
	newEpoch(t, b, 0)
	old := current(b)
	// b is idle from here (no calls, nothing rings it): its poller sleeps
	// on the doorbell until the session ends.
	require.Eventually(t, func() bool { return b.accepting.Load() > 0 && b.Stats().PollerSleeps > 0 },
		30*time.Second, time.Millisecond, "b's poller asleep with an Accept pending")

	held, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	defer free()
	hook := func(st *state) {
		if st == old && st.sess.Err() != nil {
			close(held)
			<-release
		}
	}
	pollerWoke.Store(&hook)
	defer pollerWoke.Store(nil)
	gate := make(chan struct{})
	var gateOnce sync.Once
	open := func() { gateOnce.Do(func() { close(gate) }) }
	defer open()
	gb.gate.Store(&gate)

	oldA := epoch(a)
	restart(b)
	select {
	case <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the ended session's poller never returned from its doorbell wait")
	}
	newEpoch(t, b, old.sess.Epoch)
	newEpoch(t, a, oldA)
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
	dataBit := current(b).parts[0].DataBit()
	require.Eventually(t, func() bool { return gb.Doorbells()&dataBit != 0 },
		30*time.Second, time.Millisecond, "the OPEN rings b's doorbell")
	free() // the old poller takes the bit and returns
	select {
	case <-old.stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("the ended session's poller never returned")
	}
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
			ln, err := b.Listen(7)
			require.NoError(t, err)
			defer ln.Close()
			accepted := make(chan error, 1)
			go func() {
				c, err := ln.AcceptConn()
				if err == nil {
					c.Close()
				}
				accepted <- err
			}()
			newEpoch(t, a, 0)
			newEpoch(t, b, 0)
			old := current(b)
			dataBit := old.parts[0].DataBit()
			// b is idle from here (no calls, nothing rings it): its
			// workers sleep on the doorbells until the session ends.
			waitfor.True(t, "b's workers asleep with an Accept pending", func() bool {
				return b.accepting.Load() > 0 && int(old.asleep.Load()) == old.workers
			})

			held, release := make(chan struct{}), make(chan struct{})
			var releaseOnce sync.Once
			free := func() { releaseOnce.Do(func() { close(release) }) }
			defer free()
			hook := func(st *state, bits uint64) {
				if st == old && st.sess.Err() != nil && bits&dataBit != 0 {
					close(held)
					<-release
				}
			}
			workerWoke.Store(&hook)
			defer workerWoke.Store(nil)
			gate := make(chan struct{})
			var gateOnce sync.Once
			open := func() { gateOnce.Do(func() { close(gate) }) }
			defer open()
			gb.gate.Store(&gate)

			oldA := epoch(a)
			restart(b)
			select {
			case <-held:
			case <-time.After(waitfor.Timeout):
				t.Fatal("the ended session's RX worker never returned from its doorbell wait")
			}
			// The old poller, and in CoreSplit the old TX worker, return
			// at the session's end: only the held worker is left.
			waitfor.True(t, "the ended session's other waiters returned", func() bool { return old.waiters.Load() == 1 })
			newEpoch(t, b, old.sess.Epoch)
			newEpoch(t, a, oldA)
			waitfor.BlockedN(t, "(*unit).runWorker", 1+current(b).workers)
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
			waitfor.True(t, "the OPEN rings b's doorbell", func() bool { return gb.Doorbells()&dataBit != 0 })
			free() // the old worker takes the bit and returns
			select {
			case <-old.stopped:
			case <-time.After(waitfor.Timeout):
				t.Fatal("the ended session's RX worker never returned")
			}
			open()
			require.NoError(t, <-dialed, "the dial on the new session")
			require.NoError(t, <-accepted)
		})
	}
}
