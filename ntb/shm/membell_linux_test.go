package shm

import (
	"context"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/spingate"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/ntbtest"
)

// openBellPair attaches both ends of a new memory link whose second end
// sleeps reading a pipe that the first rings (Options.Bell), as ntproxy
// and an application do; the first sleeps by futex.
func openBellPair(t *testing.T, o Options) (*Device, *Device) {
	t.Helper()
	f, err := NewMemLink("t")
	require.NoError(t, err)
	defer f.Close()
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close() // each end holds its own duplicate
	defer w.Close()
	oa, ob := o, o
	oa.Bell, ob.Bell = Bell{Ring: w}, Bell{Read: r}
	a, err := OpenFile(f, "t", oa)
	require.NoError(t, err)
	b, err := OpenFile(f, "t", ob)
	require.NoError(t, err)
	require.False(t, a.bell.reads(), "the ringing end sleeps by futex")
	require.True(t, b.bell.reads(), "the reading end sleeps on its pipe")
	return a, b
}

// A memory link with a pipe bell: the conformance suite.
func TestConformanceMemLinkBell(t *testing.T) {
	ntbtest.Conformance(t, func(t *testing.T) (ntb.Device, ntb.Device) {
		a, b := openBellPair(t, Options{WindowSize: 64 << 10})
		return a, b
	})
}

// The reading end of a pipe bell tells the other it sleeps on it, a ring
// from the other end ends its wait, and Close leaves no descriptor open.
func TestMemLinkBellWakes(t *testing.T) {
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		require.NoError(t, err)
		return len(ents)
	}
	fds0 := fds()
	a, b := openBellPair(t, Options{WindowSize: 64 << 10})
	ntbtest.WaitLink(t, b, ntb.LinkUp, ntbtest.LivenessTimeout)
	const bit = 1 << 7
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := b.WaitDoorbell(ctx, bit); done <- err }()
	require.NoError(t, a.RingPeer(bit))
	require.NoError(t, <-done, "the ring wakes the pipe's reader")
	require.Equal(t, uint64(bit), b.Doorbells()&bit)
	require.Equal(t, uint32(1), a.local.Load32(regBells), "the reader says it sleeps on its bell")
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	require.Equal(t, fds0, fds(), "descriptors open after Close")
}

// A ring whose byte has not reached the bell's reader (a process whose
// spinner keeps the runtime's poller from looking) still ends the wait of
// a waiter asleep on the bell: the process's spin loops sweep its bells
// (spingate.Sweep), and a sweep sees the peer's doorbell sequence word
// move. The peer here rings the counters and the word but writes no byte,
// so nothing but a sweep can wake the waiter.
func TestSweepWakesBellWaiter(t *testing.T) {
	a, b := openBellPair(t, Options{WindowSize: 64 << 10})
	defer a.Close()
	defer b.Close()
	ntbtest.WaitLink(t, b, ntb.LinkUp, ntbtest.LivenessTimeout)
	const bit = 1 << 7
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := b.WaitDoorbell(ctx, bit); done <- err }()
	for b.bell.sleepers.Load() == 0 {
		runtime.Gosched() // the waiter is about to sleep
	}
	spingate.Sweep() // nothing rang: the waiter sleeps on
	select {
	case err := <-done:
		t.Fatalf("wait ended before any ring: %v", err)
	default:
	}
	a.bells.Ring(bit)
	a.bumpSeqs(bit)
	for {
		select {
		case err := <-done:
			require.NoError(t, err)
			require.NoError(t, ctx.Err(), "no sweep woke the waiter")
			require.Equal(t, uint64(bit), b.Doorbells()&bit)
			return
		default:
			spingate.Sweep()
			runtime.Gosched()
		}
	}
}
