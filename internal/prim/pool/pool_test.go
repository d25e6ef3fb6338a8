package pool

import (
	"bytes"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/spingate"
	"github.com/ntstack/ntstack/internal/prim/waitfor"
)

func TestCheckGeometry(t *testing.T) {
	require.NoError(t, CheckGeometry(32, 1<<20))
	require.Error(t, CheckGeometry(32, 3<<20), "not a power of two")
	require.Error(t, CheckGeometry(32, 2048), "below MinRing")
	require.Error(t, CheckGeometry(0, 1<<20))
	require.Error(t, CheckGeometry(MaxSlots+1, 1<<20))
	_, err := NewSlot(make([]byte, SlotSize(4096)-1), 4096)
	require.Error(t, err, "too short")
}

// A stream through the smallest ring, both ends parking often (no spin),
// arrives whole and in order: no wake-up is lost.
func TestSlotStream(t *testing.T) {
	const ring, total = MinRing, 4 << 20
	mem := make([]uint64, SlotSize(ring)/8) // 8-byte aligned
	s, err := NewSlot(unsafeBytes(mem), ring)
	require.NoError(t, err)
	want := make([]byte, total)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	go func() { // the application writes the out ring
		var head uint64
		for sent := 0; sent < total; {
			tail := s.OutTail()
			free := ring - int(head-tail)
			if free == 0 {
				s.Wait(App, func() bool { return s.OutTail() != tail }, 0, time.Time{})
				continue
			}
			k := min(free, total-sent, 1+rng.IntN(3000))
			for j := range k {
				s.Out[(head+uint64(j))&(ring-1)] = want[sent+j]
			}
			head += uint64(k)
			sent += k
			s.SetOutHead(head)
			s.Notify(Proxy)
		}
	}()
	got := make([]byte, 0, total) // the proxy reads it and frees the room
	var tail uint64
	for len(got) < total {
		head := s.OutHead()
		if head == tail {
			// A Notify for data already read may wake us early (Wait's
			// callers check again); sleeping to the deadline is a lost
			// wake-up.
			start := time.Now()
			s.Wait(Proxy, func() bool { return s.OutHead() != tail }, 0, start.Add(5*time.Second))
			if s.OutHead() == tail {
				require.Less(t, time.Since(start), 4*time.Second, "woken by the deadline alone: a lost wake-up")
			}
			continue
		}
		for ; tail < head; tail++ {
			got = append(got, s.Out[tail&(ring-1)])
		}
		s.SetOutTail(tail)
		s.Notify(App)
	}
	require.True(t, bytes.Equal(want, got))
}

// Kick wakes a parked waiter whose condition does not hold.
func TestKick(t *testing.T) {
	s, err := NewSlot(unsafeBytes(make([]uint64, SlotSize(MinRing)/8)), MinRing)
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		s.Wait(App, func() bool { return false }, 0, time.Time{})
		close(done)
	}()
	_, asleep := evOffs(App)
	waitfor.True(t, "the waiter to park", func() bool { return s.hdr.Load32(asleep) != 0 })
	s.Kick(App)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Kick did not wake the waiter")
	}
}

// A wait a BusySpin spin would not have bridged is reported as long, and
// the waiter then keeps its usual budget even while its connection is
// busy; a wait that ends while spinning is not.
func TestSporadicWaitKeepsShortSpin(t *testing.T) {
	s, err := NewSlot(unsafeBytes(make([]uint64, SlotSize(MinRing)/8)), MinRing)
	require.NoError(t, err)
	const spin = 20 * time.Microsecond
	now := time.Now().UnixNano()
	require.Equal(t, BusySpin, Spin(spin, now, false), "busy: the long budget")
	require.Equal(t, spin, Spin(spin, now, true), "busy but sporadic: the usual budget")
	require.Equal(t, spin, Spin(spin, now-int64(2*BusyWindow), false), "idle: the usual budget")

	require.False(t, s.Wait(App, func() bool { return true }, BusySpin, time.Time{}), "ready at once")
	long := make(chan bool)
	go func() { long <- s.Wait(App, func() bool { return false }, spin, time.Time{}) }()
	_, asleep := evOffs(App)
	waitfor.True(t, "the waiter to park", func() bool { return s.hdr.Load32(asleep) != 0 })
	// The thing under test: a wait that lasts longer than a BusySpin
	// spin would have bridged.
	time.Sleep(2 * BusySpin)
	s.Notify(App)
	select {
	case l := <-long:
		require.True(t, l, "slept past BusySpin")
	case <-time.After(5 * time.Second):
		t.Fatal("Notify did not wake the waiter")
	}
	require.False(t, s.Wait(App, func() bool { return false }, spin, time.Now().Add(-time.Second)), "deadline passed: no sleep")
}

// newTestSlots returns n slots of the smallest rings that poll with p.
func newTestSlots(t *testing.T, p *Poller, n int) []*Slot {
	slots := make([]*Slot, n)
	for i := range slots {
		s, err := NewSlot(unsafeBytes(make([]uint64, SlotSize(MinRing)/8)), MinRing)
		require.NoError(t, err)
		s.Poll(p)
		slots[i] = s
	}
	return slots
}

// waiting is how many waits p spins for.
func (p *Poller) waiting() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.waits)
}

// One poller spins for the waits of several slots at once, up to
// GOMAXPROCS of them polling, none asleep, and hands each back as its own
// slot moves, in any order (a polling wait's first: it hands the polling
// on to a parked one); with none left nobody polls (idle costs nothing).
func TestPollerServesEveryWait(t *testing.T) {
	spingate.Refresh() // -cpu may have changed GOMAXPROCS
	p := NewPoller()
	p.solo.Store(1) // a lone wait's own spin is taken: every wait here goes through the poller
	slots := newTestSlots(t, p, 3)
	done := make(chan int, len(slots))
	for i, s := range slots {
		go func() {
			s.Wait(App, func() bool { return s.InHead() != 0 }, time.Hour, time.Time{})
			done <- i
		}()
		waitfor.True(t, "the wait with the poller", func() bool { return p.waiting() == i+1 })
	}
	p.mu.Lock()
	polling := p.polling
	p.mu.Unlock()
	require.Equal(t, min(3, runtime.GOMAXPROCS(0)), polling, "as many waits poll as there are Ps")
	_, sleep := evOffs(App)
	for _, i := range []int{0, 2, 1} { // 0 polls, then hands the polling on
		slots[i].SetInHead(1)
		require.Equal(t, i, <-done)
		for _, s := range slots {
			require.Zero(t, s.hdr.Load32(sleep), "no wait slept")
		}
	}
	waitfor.True(t, "the poller stopped", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.polling == 0
	})
	require.Zero(t, p.waiting())
}

// A kick ends a wait the poller spins for, as it ends a spin of its own.
func TestPollerWaitEndsAtKick(t *testing.T) {
	p := NewPoller()
	p.solo.Store(1) // through the poller, not a lone spin
	s := newTestSlots(t, p, 1)[0]
	done := make(chan bool)
	go func() { done <- s.Wait(App, func() bool { return false }, time.Hour, time.Time{}) }()
	waitfor.True(t, "the wait with the poller", func() bool { return p.waiting() == 1 })
	s.Kick(App)
	require.False(t, <-done, "served while spinning: not a long wait")
}

// A wait whose spin runs out with the poller sleeps on its slot, while
// the poller goes on spinning for another; a Notify wakes it.
func TestPollerSpinRunsOut(t *testing.T) {
	p := NewPoller()
	p.solo.Store(1) // through the poller, not a lone spin
	slots := newTestSlots(t, p, 2)
	done := make(chan int, 2)
	spins := []time.Duration{time.Hour, time.Nanosecond}
	for i, s := range slots {
		go func() {
			s.Wait(App, func() bool { return s.InHead() != 0 }, spins[i], time.Time{})
			done <- i
		}()
	}
	_, sleep := evOffs(App)
	waitfor.True(t, "the short spin asleep", func() bool { return slots[1].hdr.Load32(sleep) == 1 })
	waitfor.True(t, "the long spin still with the poller", func() bool { return p.waiting() == 1 })
	slots[1].SetInHead(1)
	slots[1].Notify(App)
	require.Equal(t, 1, <-done)
	slots[0].SetInHead(1)
	require.Equal(t, 0, <-done)
	require.Zero(t, slots[0].hdr.Load32(sleep), "the long spin never slept")
}

// A wait that comes while no other wait of its poller spins spins on its
// own slot, without registering; a second wait meanwhile goes through the
// poller, and a wait after the lone one ended spins alone again.
func TestPollerLoneWaitSpinsAlone(t *testing.T) {
	p := NewPoller()
	slots := newTestSlots(t, p, 2)
	done := make(chan int, 2)
	wait := func(i int) {
		s := slots[i]
		s.Wait(App, func() bool { return s.InHead() != 0 }, time.Hour, time.Time{})
		done <- i
	}
	go wait(0)
	waitfor.True(t, "the lone wait spinning", func() bool { return p.solo.Load() == 1 })
	require.Zero(t, p.waiting(), "the lone wait is not registered")
	go wait(1)
	waitfor.True(t, "the second wait with the poller", func() bool { return p.waiting() == 1 })
	slots[0].SetInHead(1)
	require.Equal(t, 0, <-done)
	require.Zero(t, p.solo.Load(), "the lone spin ended")
	slots[1].SetInHead(1)
	require.Equal(t, 1, <-done)
	require.Zero(t, p.waiting())
	slots[0].SetInHead(0)
	go wait(0)
	waitfor.True(t, "alone again", func() bool { return p.solo.Load() == 1 })
	require.Zero(t, p.waiting())
	slots[0].SetInHead(1)
	require.Equal(t, 0, <-done)
}
