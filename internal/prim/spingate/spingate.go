// Package spingate bounds, process-wide, the goroutines that spin while
// they wait on the fabric (DESIGN.md invariant 11).
//
// A spinning goroutine yields with runtime.Gosched between polls, and the
// Go scheduler consults the network poller only when no goroutine is
// runnable (or from sysmon, up to 10 ms later): a spinner that keeps a P
// busy keeps that P from ever seeing a socket become ready, and spinners
// that take turns keep it so for good. So:
//
//   - In a process that also waits on sockets (Sockets was called), at
//     most GOMAXPROCS−1 goroutines spin at once, which leaves a P to block
//     in epoll. With one P nobody spins: every fabric wait parks at once
//     and is woken through the doorbell, as a socket's reader is through
//     the poller. A short spin would not do: goroutines that spin in turn
//     keep the run queue from ever emptying, so the poller is consulted
//     late all the same (docs/perf-log.md, 2026-11-28, issue 42).
//   - A process that waits only on the fabric has no process-wide bound
//     (each transport endpoint still lets at most GOMAXPROCS of its
//     goroutines spin). There is no socket to starve, and a spinner
//     serves only its own endpoint's rings: in direct mode every
//     connection has an endpoint of its own, and a process-wide bound
//     over a process holding both ends of its connections makes their
//     waits park and take doorbells, so its direct-mode workloads lose
//     their lead over TCP (docs/perf-log.md, 2026-11-28, issue 42). With
//     one P the lone spinner is what keeps an embedded round trip under a
//     microsecond: the peer must be polling when the record lands.
//
// Every spin loop of the transport engine and the shared pool asks Enter
// before it starts and calls Leave when it parks or is served, and calls
// Sweep before it yields (see OnSweep).
package spingate

import (
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

var (
	sockets  atomic.Bool
	awaiting atomic.Int32 // Await calls not yet done
	spinning atomic.Int32
	procs    atomic.Int32 // GOMAXPROCS as last read (Refresh); 0 until then
)

// Sockets declares that this process also waits on sockets; it cannot be
// undone. ntproxy calls it when a TCP fallback leg opens (the leg's data
// then waits in the runtime's poller); ntproxy's gateway process, whose
// connections are TCP, declares it as it attaches (socklike.Config.Sockets).
func Sockets() {
	sockets.Store(true)
	Refresh()
}

// Await declares, until the returned function is called, that a
// goroutine of this process waits for a wake-up through the runtime's
// poller — a link's doorbell FIFO or pipe while its session is set up
// (a direct dial): meanwhile the process is bounded as one with sockets,
// so that a spinner serving another endpoint does not keep the P the
// wake-up needs. Spins already granted run out their budget.
func Await() (done func()) {
	awaiting.Add(1)
	var once atomic.Bool
	return func() {
		if once.CompareAndSwap(false, true) {
			awaiting.Add(-1)
		}
	}
}

// HasSockets reports whether Sockets was called.
func HasSockets() bool { return sockets.Load() }

// Refresh rereads GOMAXPROCS; call it after changing it. (Enter reads a
// cached value: runtime.GOMAXPROCS takes the scheduler's lock.)
func Refresh() { procs.Store(int32(max(1, runtime.GOMAXPROCS(0)))) }

// Procs returns GOMAXPROCS as last read (Refresh).
func Procs() int {
	p := int(procs.Load())
	if p == 0 {
		Refresh()
		p = int(procs.Load())
	}
	return p
}

// Limit returns how many goroutines of the process may spin at once.
func Limit() int {
	p := Procs()
	if sockets.Load() || awaiting.Load() > 0 {
		return p - 1
	}
	return math.MaxInt32
}

// Enter asks to spin for up to want. It returns how long the caller may
// spin, want or 0: 0 means park at once (and do not call Leave);
// otherwise the caller must call Leave when it stops spinning.
func Enter(want time.Duration) time.Duration {
	if want <= 0 {
		return 0
	}
	if int(spinning.Add(1)) > Limit() {
		spinning.Add(-1)
		return 0
	}
	return want
}

// Leave ends a spin Enter granted.
func Leave() { spinning.Add(-1) }

// Spinning returns how many goroutines spin now.
func Spinning() int { return int(spinning.Load()) }

// sweepers are the functions Sweep calls (OnSweep), copied on write.
var (
	sweepMu  sync.Mutex
	sweepers atomic.Pointer[[]func()]
)

// OnSweep adds f to what Sweep calls. f must be cheap (a spinner calls it
// every few polls) and safe to call from any goroutine at any time.
//
// A waiter woken through the runtime's poller (a doorbell FIFO or pipe)
// is seen late while a goroutine of its process spins: the scheduler
// looks at the poller only when nothing is runnable. A backend whose
// waiters sleep so registers a sweeper that looks at what they wait for
// in memory and wakes them itself, as the poller would have.
func OnSweep(f func()) {
	sweepMu.Lock()
	defer sweepMu.Unlock()
	var fs []func()
	if p := sweepers.Load(); p != nil {
		fs = append(fs, *p...)
	}
	fs = append(fs, f)
	sweepers.Store(&fs)
}

// Sweep runs the sweepers (OnSweep). Every spin loop calls it before it
// yields, so that while it spins the process's other waiters are woken
// without the runtime's poller.
func Sweep() {
	if p := sweepers.Load(); p != nil {
		for _, f := range *p {
			f()
		}
	}
}
