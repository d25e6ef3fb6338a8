package main

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ntstack/ntstack/internal/prim/credit"
	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/partition"
)

// copy is no transport but the bound the memory system puts on a ring
// transport with ntb's receive shares: its two copies and nothing else. A
// writer thread copies the -conns connections' streams, from the pattern
// stream's writers send, into a ring the size of the ntb transport's (a
// partition of the default window), in -mtu records, each connection in
// turn sending its receive share as ntb divides the rings (half of them
// over the connections, at most half a ring and the -recvwindow), or,
// beyond three connections, its turn of credit as ntb gives them (a quarter
// of the rings; both take them from internal/prim/credit). Every connection
// streams, so -idle is not modelled, nor is -qos. A reader thread copies
// each record into its connection's read buffer of -readbuf bytes, filling
// it from start to end and again, as the server's readers do. They run on
// the two CPUs -pin gives the processes (the reader on the client's, the
// calling thread's); one index store hands a record over, and the writer
// keeps at most the shares together unread (or the turns' pool, three
// quarters of the ring), as ntb's credit does. There is no framing, no flow
// control per connection and no scheduling. It measures stream only, for
// -duration, and is left out of the default transports.
//
// The order of records matters as much as their number: a run of one
// connection's records finds its read buffer still in the reader's cache,
// records of connections in turn each fetch theirs again once all the
// buffers together outgrow it. Runs of a whole share or turn are the
// longest ntb's flow control allows, so no schedule of ntb's can beat it. (With one
// record per turn ntb beat the bound: 14.0 against 12.2 GB/s at 8
// connections of 256 KiB reads.)
//
// What it shows on the 2-vCPU VM (64 KiB messages, 2 MiB L2 per vCPU,
// 2026-11-24 17:04-17:15): ~22-23 GB/s at every count with 16 and 32 KiB
// reads; with 256 KiB reads 18.5 at 4 connections, 15.6 at 8 (1 MiB
// shares, 2 MiB of buffers) and 18.7-19.0 from 16 on (1 MiB turns), where
// records of each connection in turns of one record each had read ~12
// (4 MiB of buffers and more). And how much is in flight
// matters: one connection moved 15.4, 17.0 and 23.2 GB/s with shares of 1,
// 2 and 4 MiB — the reader is fastest when the writer's lines have left
// the writer's L2 before it reads them.
func init() {
	register(transport{name: "copy", local: copyBound})
}

// copyBound measures the bound for one message size on cpus (client,
// server; -1: not pinned), returning the messages of size bytes the copies
// delivered, split over -conns samples.
func copyBound(o *options, size int, cpus [2]int) ([]sample, error) {
	l, err := partition.NewLayout(shm.DefaultWindowSize, o.partitions)
	if err != nil {
		return nil, err
	}
	rec := min(o.mtu, l.RingSize/2)
	slots := int64(l.RingSize / rec)
	ring := make([]byte, int(slots)*rec)
	bufs := make([][]byte, o.conns)
	for i := range bufs {
		bufs[i] = make([]byte, o.readBuf)
	}
	filled := make([]int, o.conns) // where each buffer's next copy goes
	pat := newPattern(size)
	// Each connection's run is its receive share, or beyond
	// credit.TurnSlots connections its turn, as ntb divides the rings
	// (the transport engine's state.share and turns), with the shares' half of the
	// rings in flight or the turns' pool.
	window := min(o.recvWindow, max(l.RingSize/2, credit.MinShare))
	rings := int64(l.RingSize * o.partitions)
	share := credit.Share(rings, int64(window), int64(o.conns))
	most := slots / 2
	if turn := credit.Turn(rings, int64(window), share, int64(min(64<<10, o.mtu))); turn > 0 {
		share = turn
		most = slots * credit.Pool(rings) / rings
	}
	run := max(1, share/int64(rec))
	// In flight: the shares or turns together, up to most.
	lag := min(most, run*int64(o.conns))

	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2)) // one thread per copy
	var head, tail atomic.Int64                     // records written, read; a wait for either yields the CPU (-pin same)
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Go(func() { // the writer
		// Locked to the end: its thread, pinned to the server's CPU, then
		// exits rather than run the client's goroutines there.
		runtime.LockOSThread()
		if cpus[1] >= 0 {
			proc.PinThread(cpus[1])
		}
		sent := make([]int64, o.conns) // each connection's stream offset
		for h := int64(0); !stop.Load(); h++ {
			for h-tail.Load() >= lag {
				if stop.Load() {
					return
				}
				proc.Yield()
			}
			c := int(h / run % int64(o.conns))
			dst := ring[int(h%slots)*rec:][:rec]
			for len(dst) > 0 {
				n := copy(dst, pat.at(sent[c], min(len(dst), size-int(sent[c]%int64(size)))))
				dst, sent[c] = dst[n:], sent[c]+int64(n)
			}
			head.Store(h + 1)
		}
	})

	runtime.LockOSThread() // the reader
	defer runtime.UnlockOSThread()
	if cpus[0] >= 0 {
		proc.PinThread(cpus[0])
	}
	var t, total int64
	read := func() {
		for head.Load() == t {
			proc.Yield()
		}
		// As io.ReadFull fills the buffer, record after record.
		c := int(t / run % int64(o.conns))
		for src := ring[int(t%slots)*rec:][:rec]; len(src) > 0; {
			n := copy(bufs[c][filled[c]:], src)
			filled[c] = (filled[c] + n) % len(bufs[c])
			src = src[n:]
		}
		t++
		tail.Store(t)
	}
	for range 2 * slots { // warm-up: fault the ring and the buffers in
		read()
	}
	deadline := time.Now().Add(o.duration)
	for time.Now().Before(deadline) {
		for range 16 {
			read()
			total += int64(rec)
		}
	}
	stop.Store(true)
	wg.Wait()

	samples := make([]sample, o.conns)
	msgs := int(total / int64(size))
	for i := range samples {
		samples[i].msgs = msgs / o.conns
	}
	samples[0].msgs += msgs % o.conns
	return samples, nil
}
