package main

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/ntstack/ntstack/internal/prim/proc"
)

// A VM's two vCPUs are not two fixed cores: the host moves each vCPU
// from core to core, and whether the client's and the server's CPU then
// share a cache decides what a ring between them moves. On the 2-vCPU AMD
// EPYC VM (2026-11-25, 30 s, a 64 KiB-record ring copied from CPU 1 to
// CPU 0 in 20 ms turns, each after timing a cache line's round trip):
// round trips of 80-160 ns (cores sharing an L3) went with 32 GB/s,
// 300-700 ns (cores that share none) with 6.4 GB/s, and the host switched
// between them every 0.1-1 s (the slow placement held 82 % of that run).
// No figure of a two-process run on such a machine
// means anything without its placement; -slice measures it (see
// sliced).
//
// farRTT and siblingRTT divide the placements: a round trip at least
// farRTT long is far (no cache shared), one under siblingRTT is between
// hyperthreads of one core (sibling), and the rest is near (cores sharing
// an L3). On real hosts cores of one socket answer in 50-200 ns and of
// two sockets in 250 ns and more. On the AMD VM (200 round trips over a
// minute, 2026-11-25) siblings answered in 70-72 ns, rarer than the
// others, cores sharing an L3 in 81-156 ns and the far ones in 371-560
// ns; siblings move a ring at ~20 GB/s, their copies sharing the core,
// and ntb's 64 KiB stream at 16-17 GB/s against 19-24 near in the same
// runs, so counted as near they made its rows a mixture of two machines.
const (
	farRTT     = 250 * time.Nanosecond
	siblingRTT = 80 * time.Nanosecond
)

// awaitMax bounds -await's wait before a measurement; awaitEvery is how
// often it looks. The host moves the vCPUs every 0.1-1 s, but on the AMD
// VM a placement has held for most of half a minute (the far one, 82 %
// of a 30 s spell).
const (
	awaitMax   = 20 * time.Second
	awaitEvery = 50 * time.Millisecond
)

// awaitPlacement waits until probe's round trip shows placement want,
// looking every awaitEvery for at most limit. It reports whether it came.
// (-await: a sweep on a machine whose placement changes every second or
// so otherwise measures one count mostly near and the next mostly far,
// and a placement's row may get no slice at some count.)
func awaitPlacement(want string, probe func() (time.Duration, error), sleep func(time.Duration), limit time.Duration) (bool, error) {
	for waited := time.Duration(0); ; waited += awaitEvery {
		rtt, err := probe()
		if err != nil {
			return false, err
		}
		if placementOf(rtt) == want {
			return true, nil
		}
		if waited >= limit {
			return false, nil
		}
		sleep(awaitEvery)
	}
}

// await waits for -await's placement, if one was asked for (sliced's first
// step; measure gives its hang watchdog awaitMax more for it).
func (r *runner) await() error {
	if r.o.await == "" {
		return nil
	}
	probe := func() (time.Duration, error) { return coreRTT(r.clientCPU, r.serverCPU) }
	met, err := awaitPlacement(r.o.await, probe, time.Sleep, awaitMax)
	if err != nil {
		return err
	}
	if !met {
		fmt.Fprintf(r.stderr, "ntbench: no %s placement within %v; measuring in whatever comes\n", r.o.await, awaitMax)
	}
	return nil
}

// errAllMoved: the placement changed within every slice of a
// measurement, which then has no row. Not a failure of the run: with
// three placements and a host that moves the vCPUs every 0.1-1 s, a
// measurement of a few slices meets it now and then (a sweep of 1 s
// measurements, once in 84); the run goes on and says so.
var errAllMoved = errors.New("the placement changed within every slice; no row (shorter slices, or a longer -duration, leave fewer so)")

// placementOf names the placement a round trip of rtt shows.
func placementOf(rtt time.Duration) string {
	switch {
	case rtt >= farRTT:
		return "far"
	case rtt < siblingRTT:
		return "sibling"
	}
	return "near"
}

// rttBatches and rttPerBatch shape coreRTT's measurement: the median of
// rttBatches batches of rttPerBatch round trips each, so that an
// interrupt in one batch moves nothing.
const rttBatches, rttPerBatch = 15, 32

// coreRTT times a cache line's round trip between CPU a, where it pins
// the calling goroutine's thread (the client's CPU), and CPU b, where a
// thread of its own echoes and is then pinned to a again. (That thread
// must not exit instead, as the copy bound's do: it may be the one that
// started a server, and the kernel sends the parent-death signal when
// the thread that forked a process ends.) Each takes the line in turn, as
// a ring's producer and consumer take its indices.
func coreRTT(a, b int) (time.Duration, error) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2)) // both threads run at once
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := proc.PinThread(a); err != nil {
		return 0, err
	}
	var line struct {
		_ [64]byte
		v atomic.Int64 // odd: the echo's turn; -1: stop
		_ [64]byte
	}
	pinned, done := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread()
		err := proc.PinThread(b)
		pinned <- err
		for err == nil {
			v := line.v.Load()
			if v < 0 {
				break
			}
			if v&1 == 1 {
				line.v.Store(v + 1)
			}
		}
		if proc.PinThread(a) == nil {
			runtime.UnlockOSThread()
		} // else the thread ends with the goroutine, pinned to b
	}()
	if err := <-pinned; err != nil {
		<-done
		return 0, err
	}
	defer func() {
		line.v.Store(-1)
		<-done // off CPU b before the measurement resumes
	}()

	// give up waits a second for the echo: a CPU given to something
	// else (a real-time thread, say) would keep it from answering.
	giveUp := time.Now().Add(time.Second)
	trip := func() error {
		v := line.v.Add(1)
		for spins := 0; line.v.Load() == v; spins++ {
			if spins&1023 == 1023 && time.Now().After(giveUp) {
				return errors.New("no echo within a second")
			}
		}
		return nil
	}
	if err := trip(); err != nil { // the echo is running
		return 0, fmt.Errorf("round trip CPU %d-%d: %w", a, b, err)
	}
	batches := make([]time.Duration, rttBatches)
	for i := range batches {
		start := time.Now()
		for range rttPerBatch {
			if err := trip(); err != nil {
				return 0, fmt.Errorf("round trip CPU %d-%d: %w", a, b, err)
			}
		}
		batches[i] = time.Since(start) / rttPerBatch
	}
	slices.Sort(batches)
	return batches[len(batches)/2], nil
}

// slice is what one slice of a measurement delivered.
type slice struct {
	samples   []sample // one per connection
	wall, cpu time.Duration
}

// placed is a measurement's slices of one placement put together.
type placed struct {
	placement string          // "" without -slice
	rtts      []time.Duration // the round trips that placed its slices
	start     time.Time       // of its first slice
	moved     int             // slices of the measurement, of any placement, that counted nowhere
	slice                     // its slices' samples, wall and CPU time added up
}

// sliced runs once for -duration, or, with -slice, once per slice until
// the slices add up to -duration, timing the round trip between the
// client's and the server's CPU before and after each: a slice whose two
// round trips differ in placement (the host moved a vCPU meanwhile) counts
// nowhere, the others towards their placement's (-count bounds each
// slice). It returns the placements in the order first seen. once runs
// the measurement for the given time.
func (r *runner) sliced(once func(time.Duration) (slice, error)) ([]placed, error) {
	if r.o.slice == 0 {
		start := time.Now()
		s, err := once(r.o.duration)
		return []placed{{start: start, slice: s}}, err
	}
	if err := r.await(); err != nil {
		return nil, err
	}
	var out []placed
	moved := 0
	for spent := time.Duration(0); spent < r.o.duration; spent += r.o.slice {
		before, err := coreRTT(r.clientCPU, r.serverCPU)
		if err != nil {
			return nil, err
		}
		start := time.Now()
		s, err := once(min(r.o.slice, r.o.duration-spent))
		if err != nil {
			return nil, err
		}
		after, err := coreRTT(r.clientCPU, r.serverCPU)
		if err != nil {
			return nil, err
		}
		where := placementOf(before)
		if placementOf(after) != where {
			moved++
			continue
		}
		i := slices.IndexFunc(out, func(p placed) bool { return p.placement == where })
		if i < 0 {
			out = append(out, placed{placement: where, start: start, slice: slice{samples: make([]sample, len(s.samples))}})
			i = len(out) - 1
		}
		p := &out[i]
		p.rtts = append(p.rtts, before, after)
		p.wall += s.wall
		p.cpu += s.cpu
		for c, smp := range s.samples {
			p.samples[c].msgs += smp.msgs
			p.samples[c].rtts = append(p.samples[c].rtts, smp.rtts...)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%w (%d of %v)", errAllMoved, moved, r.o.slice)
	}
	for i := range out {
		out[i].moved = moved
	}
	return out, nil
}
