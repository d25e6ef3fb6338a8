package shm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/ntbtest"
)

var linkSeq atomic.Int64

// testDir is a fresh directory under /dev/shm (tmpfs, like production).
func testDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join("/dev/shm", fmt.Sprintf("ntstack-test-%d-%d", os.Getpid(), linkSeq.Add(1)))
	require.NoError(t, os.MkdirAll(dir, 0o700))
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

func openPair(t *testing.T, o Options) (*Device, *Device) {
	t.Helper()
	a, err := Open("l", o)
	require.NoError(t, err)
	b, err := Open("l", o)
	require.NoError(t, err)
	return a, b
}

func TestConformance(t *testing.T) {
	ntbtest.Conformance(t, func(t *testing.T) (ntb.Device, ntb.Device) {
		a, b := openPair(t, Options{Dir: testDir(t), WindowSize: 64 << 10})
		return a, b
	})
}

// A memory link sleeps on futex words rather than FIFOs: the same suite.
func TestConformanceMemLink(t *testing.T) {
	ntbtest.Conformance(t, func(t *testing.T) (ntb.Device, ntb.Device) {
		a, b := openMemPair(t, Options{WindowSize: 64 << 10})
		return a, b
	})
}

// A named link whose one end sleeps in futex waits (Options.FutexWait)
// and the other on its FIFO: each rings the other where it sleeps (the
// suite rings the second end from the first).
func TestConformanceMixedWait(t *testing.T) {
	for _, futexFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("futex waiter first %v", futexFirst), func(t *testing.T) {
			ntbtest.Conformance(t, func(t *testing.T) (ntb.Device, ntb.Device) {
				o := Options{Dir: testDir(t), WindowSize: 64 << 10, FutexWait: futexFirst}
				a, err := Open("l", o)
				require.NoError(t, err)
				o.FutexWait = !futexFirst
				b, err := Open("l", o)
				require.NoError(t, err)
				require.Equal(t, !futexFirst, a.bell.reads())
				require.Equal(t, futexFirst, b.bell.reads())
				return a, b
			})
		})
	}
}

// openMemPair attaches both ends of a new memory link.
func openMemPair(t *testing.T, o Options) (*Device, *Device) {
	t.Helper()
	f, err := NewMemLink("t")
	require.NoError(t, err)
	defer f.Close() // each end holds its own descriptor
	a, err := OpenFile(f, "t", o)
	require.NoError(t, err)
	b, err := OpenFile(f, "t", o)
	require.NoError(t, err)
	return a, b
}

func TestSides(t *testing.T) {
	dir := testDir(t)
	o := Options{Dir: dir, WindowSize: 64 << 10}
	a, b := openPair(t, o)
	require.Equal(t, 0, a.Side())
	require.Equal(t, 1, b.Side())
	_, err := Open("l", o)
	require.ErrorContains(t, err, "both ends are attached")

	// A side freed by Close can be claimed again, and the survivor sees a
	// new peer come up.
	require.NoError(t, b.Close())
	ntbtest.WaitLink(t, a, ntb.LinkDown, ntbtest.LivenessTimeout)
	o.Side = Side1
	c, err := Open("l", o)
	require.NoError(t, err)
	defer c.Close()
	defer a.Close()
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	ntbtest.WaitLink(t, c, ntb.LinkUp, ntbtest.LivenessTimeout)
}

func TestLayoutMismatch(t *testing.T) {
	dir := testDir(t)
	a, err := Open("l", Options{Dir: dir, WindowSize: 64 << 10})
	require.NoError(t, err)
	defer a.Close()
	_, err = Open("l", Options{Dir: dir, WindowSize: 128 << 10})
	require.ErrorContains(t, err, "window size 65536, this end asks for 131072")

	// With nobody attached, a mismatched file is rebuilt.
	require.NoError(t, a.Close())
	b, err := Open("l", Options{Dir: dir, WindowSize: 128 << 10})
	require.NoError(t, err)
	require.Len(t, b.InboundWindow(), 128<<10)
	require.NoError(t, b.Close())

	require.NoError(t, os.WriteFile(filepath.Join(dir, "junk"), make([]byte, 100), 0o600))
	_, err = Open("bad/name", Options{Dir: dir})
	require.ErrorContains(t, err, "invalid name")
}

// A forced down reaches the peer through its registers at the peer's next
// look, not through its heartbeat. With an hour between beats and two
// before a quiet peer is even suspect, nothing but that look can take the
// peer's link down; the test brings the look forward (checkNow) and
// counts the peer's beats, one per look, across it.
func TestForcedDown(t *testing.T) {
	o := Options{Dir: testDir(t), WindowSize: 64 << 10, HeartbeatInterval: time.Hour, HeartbeatTimeout: 2 * time.Hour, SilentTimeout: 3 * time.Hour}
	a, b := openPair(t, o)
	defer a.Close()
	defer b.Close()
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	ntbtest.WaitLink(t, b, ntb.LinkUp, ntbtest.LivenessTimeout)

	looks := func() uint64 { return a.local.Load64(regHeartbeat) } // b's beats, as a's registers count them
	before := looks()
	a.ForceLinkDown()
	ntbtest.WaitLink(t, a, ntb.LinkDown, ntbtest.LivenessTimeout)
	b.checkNow()
	ev, evs := ntbtest.WaitEvent(t, b, ntbtest.LivenessTimeout, "hardware down", ntbtest.IsDown(ntb.CauseHardware))
	for _, e := range evs {
		require.False(t, e.Suspect, "suspect before the forced down: %+v", e)
	}
	// Our look, and at most one that was under way when the link was forced.
	require.LessOrEqual(t, looks()-before, uint64(2), "the peer saw the forced down at its next look")
	t.Logf("peer: %s", ev.Reason)

	a.ForceLinkUp()
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	b.checkNow()
	ntbtest.WaitLink(t, b, ntb.LinkUp, ntbtest.LivenessTimeout)
}

// An end sees its own fault injection at once, not at its next beat: with
// an hour between beats, only the injection itself can change the link
// (the wait's bound is a failure guard, not the measure).
func TestForcedDownSeenAtOnce(t *testing.T) {
	o := Options{Dir: testDir(t), WindowSize: 64 << 10, HeartbeatInterval: time.Hour, HeartbeatTimeout: 2 * time.Hour, SilentTimeout: 3 * time.Hour}
	a, b := openPair(t, o)
	defer a.Close()
	defer b.Close()
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	start := time.Now()
	a.ForceLinkDown()
	ntbtest.WaitLink(t, a, ntb.LinkDown, ntbtest.LivenessTimeout)
	t.Logf("forced down seen by its own end in %v", time.Since(start).Round(time.Microsecond))
	start = time.Now()
	a.ForceLinkUp()
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	t.Logf("and up again in %v", time.Since(start).Round(time.Microsecond))
}

// A silent peer (a hung process, still attached) makes the link suspect
// past the heartbeat timeout, and takes it down as silent only past the
// silent timeout; once it beats again the link is up and trusted. The
// silent timeout is seconds past the heartbeat timeout so that the peer's
// monitor looks at least once while the silence is suspect and not yet
// down, unless a loaded machine holds it off for all those seconds.
func TestHeartbeatSilence(t *testing.T) {
	o := Options{Dir: testDir(t), WindowSize: 64 << 10, HeartbeatInterval: 10 * time.Millisecond,
		HeartbeatTimeout: 50 * time.Millisecond, SilentTimeout: 3 * time.Second}
	a, b := openPair(t, o)
	defer a.Close()
	defer b.Close()
	ntbtest.WaitLink(t, b, ntb.LinkUp, ntbtest.LivenessTimeout)
	a.SilenceHeartbeat(true) // a hung process: attached, but silent
	_, before := ntbtest.WaitEvent(t, b, ntbtest.LivenessTimeout, "suspect", ntbtest.IsSuspect(true))
	for _, ev := range before {
		require.NotEqual(t, ntb.LinkDown, ev.State, "down before suspect: %+v", ev)
	}
	ev, _ := ntbtest.WaitEvent(t, b, ntbtest.LivenessTimeout, "down", func(ev ntb.LinkEvent) bool { return ev.State == ntb.LinkDown })
	require.Equal(t, ntb.CauseSilent, ev.Cause, "%+v", ev)
	require.Equal(t, ntb.CauseSilent, b.LinkCause())
	t.Logf("silent peer: %s", ev.Reason)
	a.SilenceHeartbeat(false)
	ntbtest.WaitEvent(t, b, ntbtest.LivenessTimeout, "up again", ntbtest.IsSuspect(false))
	require.False(t, b.Suspect())
}

// An idle end beats half as often (as long as the peer's timeout spans
// five of its intervals), and its peer keeps the link up.
func TestIdleBeatsSlower(t *testing.T) {
	require.Equal(t, 100*time.Millisecond, idleInterval(50*time.Millisecond, 500*time.Millisecond))
	require.Equal(t, 50*time.Millisecond, idleInterval(50*time.Millisecond, 250*time.Millisecond), "a timeout of five intervals leaves no room")
	require.Equal(t, 60*time.Millisecond, idleInterval(50*time.Millisecond, 300*time.Millisecond))

	o := Options{Dir: testDir(t), WindowSize: 64 << 10, HeartbeatInterval: 20 * time.Millisecond, HeartbeatTimeout: 2 * time.Second}
	a, b := openPair(t, o)
	defer a.Close()
	defer b.Close()
	ntbtest.WaitLink(t, b, ntb.LinkUp, ntbtest.LivenessTimeout)
	beat := func() uint64 { return b.local.Load64(regHeartbeat) } // a's beats, as b's registers count them
	beats := func() uint64 {
		start := beat()
		time.Sleep(500 * time.Millisecond) // the span measured: the beats that fall in it are the result
		return beat() - start
	}
	busy := beats()
	a.Idle(true)
	// The beat already set keeps the busy interval; the idle ones follow it.
	first := beat()
	waitfor.True(t, "a's first beat after Idle", func() bool { return beat() != first })
	idle := beats()
	a.Idle(false)
	t.Logf("beats in 500 ms: %d busy, %d idle", busy, idle)
	// Timers late by δ on a loaded machine make the ratio (20+δ)/(40+δ):
	// under 0.8 while δ stays under 60 ms.
	require.Less(t, float64(idle), 0.8*float64(busy), "an idle end beats every 40 ms, a busy one every 20 ms")
	require.Positive(t, idle)
	require.Equal(t, ntb.LinkUp, b.Link(), "the peer of an idle end keeps the link up")
}

func TestCorruptInbound(t *testing.T) {
	a, b := openPair(t, Options{Dir: testDir(t), WindowSize: 64 << 10})
	defer a.Close()
	defer b.Close()
	b.CorruptInbound(100, 8, 1)
	require.NotEqual(t, make([]byte, 8), a.OutboundWindow()[100:108])
}

// A memory link is shared by descriptor, not by name: two Devices attached
// through descriptors of one open file still claim different sides and pass
// doorbells and window bytes.
func TestMemLink(t *testing.T) {
	f, err := NewMemLink("t")
	require.NoError(t, err)
	defer f.Close()
	o := Options{WindowSize: 64 << 10, HeartbeatInterval: 5 * time.Millisecond}
	a, err := OpenFile(f, "t", o)
	require.NoError(t, err)
	defer a.Close()
	b, err := OpenFile(f, "t", o)
	require.NoError(t, err)
	defer b.Close()
	require.NotEqual(t, a.Side(), b.Side())
	_, err = OpenFile(f, "t", o)
	require.Error(t, err, "a third end must be refused")

	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	ntbtest.WaitLink(t, b, ntb.LinkUp, ntbtest.LivenessTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), waitfor.Timeout)
	defer cancel()
	copy(a.OutboundWindow(), "hello")
	require.Equal(t, "hello", string(b.InboundWindow()[:5]))
	require.NoError(t, a.RingPeer(1))
	got, err := b.WaitDoorbell(ctx, 1)
	require.NoError(t, err)
	require.Equal(t, uint64(1), got&1)
}

// On a link opened by name, a WaitDoorbell call whose context ends wakes
// alone: the other callers of the process sleep on (each wake-up of a
// worker-model process's waiters had cost it 10 ms of the runtime's
// sysmon polling when they slept in futex waits, which a cancellation
// woke all together; memory links still do).
func TestCancelWakesOneWaiter(t *testing.T) {
	a, b := openPair(t, Options{Dir: testDir(t), WindowSize: 64 << 10, HeartbeatTimeout: 10 * time.Second})
	defer a.Close()
	defer b.Close()
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	const bit, others, cancels = 1 << 3, 3, 20
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range others {
		wg.Go(func() { _, _ = a.WaitDoorbell(ctx, bit) })
	}
	const sleeper = "(*Device).waitBell" // where a link opened by name sleeps
	waitfor.BlockedN(t, sleeper, others)
	before := a.wakeup.Load()
	for range cancels {
		cctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _, _ = a.WaitDoorbell(cctx, bit); close(done) }()
		waitfor.BlockedN(t, sleeper, others+1)
		cancel()
		<-done
	}
	// One wake-up per cancelled call; a broadcast would add the others'.
	woke := a.wakeup.Load() - before
	require.Less(t, woke, uint64(cancels+cancels/2), "sleeps ended for %d cancelled calls", cancels)
	stop()
	wg.Wait()
}

// A link opened by name wakes its sleepers through FIFOs beside the link
// file: a ring wakes a new peer on the side a closed one held; Close leaks
// no descriptor and no reader goroutine, and Remove deletes the FIFOs
// with the link; files in a FIFO's place are neither read nor rung.
func TestBellFIFO(t *testing.T) {
	dir := testDir(t)
	fds := func() int {
		ents, err := os.ReadDir("/proc/self/fd")
		require.NoError(t, err)
		return len(ents)
	}
	fds0, goroutines0 := fds(), runtime.NumGoroutine()
	o := Options{Dir: dir, WindowSize: 64 << 10}
	a, b := openPair(t, o)
	for side := range 2 {
		fi, err := os.Stat(bellPath(filepath.Join(dir, "l"), side))
		require.NoError(t, err)
		require.Equal(t, os.ModeNamedPipe, fi.Mode().Type())
	}
	const bit = 1 << 5
	waitRing := func(d *Device) {
		t.Helper()
		done := make(chan error, 1)
		ctx, cancel := context.WithTimeout(context.Background(), waitfor.Timeout)
		defer cancel()
		go func() { _, err := d.WaitDoorbell(ctx, bit); done <- err }()
		waitfor.Blocked(t, "(*Device).waitBell") // asleep on its FIFO, not still looking
		require.NoError(t, b.RingPeer(bit))
		require.NoError(t, <-done, "the ring woke the waiter")
		d.ClearDoorbells(bit)
	}
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	waitRing(a)
	require.NoError(t, a.Close())
	// How fast b sees it is Conformance's to assert; this test is about
	// the FIFOs, and its Close comes right after the link came up.
	ntbtest.WaitLink(t, b, ntb.LinkDown, ntbtest.LivenessTimeout)
	o.Side = Side0
	a2, err := Open("l", o)
	require.NoError(t, err)
	ntbtest.WaitLink(t, a2, ntb.LinkUp, ntbtest.LivenessTimeout)
	waitRing(a2)
	require.NoError(t, a2.Close())
	require.NoError(t, b.Close())
	require.Equal(t, fds0, fds(), "descriptors open after Close")
	waitfor.True(t, "the FIFO readers to end after Close", func() bool { return runtime.NumGoroutine() <= goroutines0 })

	require.NoError(t, Remove(dir, "l"))
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	require.Empty(t, entries, "Remove leaves nothing of the link")

	// A file in the FIFO's place is refused, not read as one.
	require.NoError(t, os.WriteFile(bellPath(filepath.Join(dir, "m"), 0), nil, 0o600))
	o.Side = Side0
	_, err = Open("m", o)
	require.ErrorContains(t, err, "not a FIFO")
	// And a file in the peer's FIFO's place is not rung (its growth a
	// byte a ring), so the ringer falls back to the futex word.
	peer := bellPath(filepath.Join(dir, "m"), 1)
	require.NoError(t, os.WriteFile(peer, nil, 0o600))
	bl := &bell{peerPath: peer, peerFd: -1}
	require.False(t, bl.ring(), "rang a regular file")
	fi, err := os.Stat(peer)
	require.NoError(t, err)
	require.Zero(t, fi.Size())
	require.NoError(t, bl.close())
}

// A sleeper waits only for the half of the bits it wants: a waiter for
// an upper bit (a session bit) sleeps through every ring of a lower bit
// (the data path's), and the upper bit's ring wakes it — on the futex
// words of a link that waits by futex, and on the channels of a pipe bell.
func TestUpperBitSleepsThroughLowerRings(t *testing.T) {
	t.Run("futex", func(t *testing.T) {
		a, b := openPair(t, Options{Dir: testDir(t), WindowSize: 64 << 10, FutexWait: true})
		upperSleepsThroughLower(t, a, b, "futexWait")
	})
	t.Run("bell", func(t *testing.T) {
		ringer, sleeper := openBellPair(t, Options{WindowSize: 64 << 10})
		upperSleepsThroughLower(t, sleeper, ringer, "(*Device).waitBell")
	})
}

// upperSleepsThroughLower checks that a's waiter for bit 63 sleeps
// through b's rings of bit 3; sleeper is where a's waiters sleep.
func upperSleepsThroughLower(t *testing.T, a, b *Device, sleeper string) {
	defer a.Close()
	defer b.Close()
	ntbtest.WaitLink(t, a, ntb.LinkUp, 5*time.Second)
	ntbtest.WaitLink(t, b, ntb.LinkUp, 5*time.Second)
	const low, high, rings = 1 << 3, 1 << 63, 20
	ctx, cancel := context.WithTimeout(context.Background(), waitfor.Timeout)
	defer cancel()
	upper := make(chan error, 1)
	go func() {
		_, err := a.WaitDoorbell(ctx, high)
		upper <- err
	}()
	waitfor.BlockedN(t, sleeper, 1)
	before := a.wakeup.Load()
	for range rings {
		done := make(chan error, 1)
		go func() {
			_, err := a.WaitDoorbell(ctx, low)
			done <- err
		}()
		waitfor.BlockedN(t, sleeper, 2)
		require.NoError(t, b.RingPeer(low))
		require.NoError(t, <-done)
		a.ClearDoorbells(low)
	}
	require.NoError(t, b.RingPeer(high))
	require.NoError(t, <-upper)
	// One sleep ended per low ring (the low waiter's) and one for the
	// high ring; a wake-up shared by all bits would add the upper
	// waiter's per low ring.
	woke := a.wakeup.Load() - before
	require.LessOrEqual(t, woke, uint64(rings+1+rings/4), "sleeps ended for %d low rings and one high", rings)
}
