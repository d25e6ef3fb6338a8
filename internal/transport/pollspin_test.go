package transport

import (
	"context"
	"errors"
	"io"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ntstack/ntstack/internal/prim/ring"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/ntbtest"
	"github.com/stretchr/testify/require"
)

// waitDevice counts the doorbell waits for the rings an endpoint enters,
// and those it is in; not the link's own wait, for the session doorbell
// alone (the top bit).
type waitDevice struct {
	ntb.Device
	entered atomic.Int64
	waiting atomic.Int32
}

func (d *waitDevice) WaitDoorbell(ctx context.Context, want uint64) (uint64, error) {
	if want&^(1<<63) == 0 {
		return d.Device.WaitDoorbell(ctx, want)
	}
	d.waiting.Add(1)
	d.entered.Add(1)
	defer d.waiting.Add(-1)
	return d.Device.WaitDoorbell(ctx, want)
}

// TestPollerSleepsOnLooseFrameRing: a loose frame queued for a full data
// partition (a CLOSE or REFUSE, which go on the partition of the frame they
// answer) holds up the loose queue; the poller must sleep on that ring's
// space, not go round because the control ring has room.
func TestPollerSleepsOnLooseFrameRing(t *testing.T) {
	da, db := ntbtest.NewPair(1 << 20)
	t.Cleanup(func() { da.Close(); db.Close() })
	dev := &waitDevice{Device: da}
	a, b := attachPair(t, dev, db, Config{})
	ca, cb := connPair(t, a, b, 1)
	ast, bst := ca.st(), cb.st()
	const k = 0
	stale := uint32(len(bst.conns) - 1) // in b's table, not a live connection
	require.Nil(t, bst.lookup(stale))

	// b stops reading partition k; a fills it with frames b drops.
	bst.parts[k].LockRX()
	locked := true
	defer func() {
		if locked {
			bst.parts[k].UnlockRX()
		}
	}()
	tag := makeTag(kindClose, stale)
	filled := int64(0)
	for _, body := range [][]byte{make([]byte, 4<<10), nil} {
		for {
			err := ast.parts[k].TrySend(tag, body, nil)
			if errors.Is(err, ring.ErrFull) {
				break
			}
			require.NoError(t, err)
			filled++
		}
	}

	// The poller asleep, a loose frame comes for the full partition; then
	// a doorbell wakes the poller.
	require.Eventually(t, func() bool { return dev.waiting.Load() == 1 }, 10*time.Second, 100*time.Microsecond,
		"a's poller should sleep on the doorbell")
	before := b.Stats().StaleFrames
	ast.sendLoose(ast.parts[k], kindClose, stale, 0, nil)
	require.True(t, ast.ctlPending.Load(), "the frame should wait for room")
	entered := dev.entered.Load()
	require.NoError(t, db.RingPeer(ast.control.DataBit()))
	require.Eventually(t, func() bool { return dev.entered.Load() > entered }, 10*time.Second, 100*time.Microsecond,
		"the poller should sleep again on the full partition's space, not go round")

	// b reads again: the space doorbell the poller armed wakes it, and
	// the frame goes.
	bst.parts[k].UnlockRX()
	locked = false
	require.Eventually(t, func() bool { return !ast.ctlPending.Load() }, 10*time.Second, 100*time.Microsecond,
		"the loose frame should go once the partition has room")
	require.Eventually(t, func() bool { return b.Stats().StaleFrames == before+filled+1 }, 10*time.Second, 100*time.Microsecond,
		"b should drop the %d frames and the loose one", filled)
}

// TestPollerYieldsWhileServeIsTaken: a writer queued on a ring with room
// whose unit another goroutine is serving (here the test holds the serve
// lock, as a Close stopped in its pass does) is not the poller's to
// serve; going round without yielding, the poller would keep that
// goroutine from the only P until the scheduler preempted it, 10 ms later.
func TestPollerYieldsWhileServeIsTaken(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	a, b := endpoints(t, "ntbtest", Config{})
	ca, cb := connPair(t, a, b, 1)
	ca.smu.Lock()
	u := ca.unit
	ca.smu.Unlock()

	u.serveMu.Lock()
	locked := true
	defer func() {
		if locked {
			u.serveMu.Unlock()
		}
	}()
	require.NoError(t, ca.CloseWrite()) // FIN queued; its serve finds the lock taken
	require.Positive(t, u.queued.Load())
	// Wake the poller, should it sleep on the doorbell.
	require.NoError(t, b.dev.RingPeer(ca.st().control.DataBit()))

	// Each time this goroutine gives up the P, count the poller's rounds
	// until it has it back.
	rounds := &a.counters.pollerRounds
	start, worst := rounds.Load(), int64(0)
	for rounds.Load()-start < 200 {
		r := rounds.Load()
		runtime.Gosched()
		worst = max(worst, rounds.Load()-r)
	}
	require.Less(t, worst, int64(10), "the poller went %d rounds without yielding", worst)

	u.serveMu.Unlock()
	locked = false
	_, err := cb.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the FIN should go once the serve lock is free")
}
