package transport

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

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
