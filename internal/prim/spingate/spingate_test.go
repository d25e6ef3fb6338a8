package spingate

import (
	"runtime"
	"testing"
	"time"
)

// reset restores the package state a test changed.
func reset(t *testing.T) {
	t.Helper()
	prevSockets, prevProcs := sockets.Load(), runtime.GOMAXPROCS(0)
	t.Cleanup(func() {
		sockets.Store(prevSockets)
		runtime.GOMAXPROCS(prevProcs)
		Refresh()
	})
}

func TestFabricOnlyUnbounded(t *testing.T) {
	reset(t)
	sockets.Store(false)
	runtime.GOMAXPROCS(1)
	Refresh()
	for i := range 3 {
		if got := Enter(50 * time.Microsecond); got != 50*time.Microsecond {
			t.Fatalf("spinner %d of a fabric-only process granted %v, want its full budget", i, got)
		}
	}
	for range 3 {
		Leave()
	}
	if Spinning() != 0 {
		t.Fatalf("%d spinning after Leave", Spinning())
	}
}

func TestSocketsOnePNobodySpins(t *testing.T) {
	reset(t)
	runtime.GOMAXPROCS(1)
	Sockets()
	if got := Enter(500 * time.Microsecond); got != 0 {
		t.Fatalf("spinner of a one-P process with sockets granted %v: the poller would starve", got)
	}
	if Spinning() != 0 {
		t.Fatalf("%d spinning after a refusal", Spinning())
	}
}

func TestSocketsLeaveAPFree(t *testing.T) {
	reset(t)
	runtime.GOMAXPROCS(3)
	Sockets()
	for i := range 2 {
		if got := Enter(time.Millisecond); got != time.Millisecond {
			t.Fatalf("spinner %d of 2 granted %v", i, got)
		}
	}
	if got := Enter(time.Millisecond); got != 0 {
		t.Fatalf("third spinner with GOMAXPROCS 3 and sockets granted %v: no P left for the poller", got)
	}
	Leave()
	Leave()
	if got := Enter(0); got != 0 {
		t.Fatalf("no budget granted %v", got)
	}
}

// While a goroutine awaits a wake-up through the poller, a one-P process
// spins no more; once done, it spins as before.
func TestAwaitBoundsUntilDone(t *testing.T) {
	reset(t)
	sockets.Store(false)
	runtime.GOMAXPROCS(1)
	Refresh()
	done := Await()
	if got := Enter(50 * time.Microsecond); got != 0 {
		t.Fatalf("spinner of a one-P process awaiting the poller granted %v", got)
	}
	done()
	done() // idempotent
	if got := Enter(50 * time.Microsecond); got != 50*time.Microsecond {
		t.Fatalf("spinner after the await granted %v, want its full budget", got)
	}
	Leave()
}
