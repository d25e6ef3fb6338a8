package main

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ntstack/ntstack/internal/proc"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/partition"
)

// copy is no transport but the bound the memory system puts on every ring
// transport: its two copies and nothing else. A writer thread copies the
// -conns connections' streams, from the pattern stream's writers send,
// into a ring the size of the ntb transport's (a partition of the default
// window), one -mtu record per connection in turn; a reader thread copies
// each record into its connection's read buffer of -readbuf bytes, a
// buffer at a time, as the server's readers do. They run on the two CPUs
// -pin gives the processes (the reader on the client's, the calling
// thread's). One index store hands a record over; the writer keeps at most
// half the ring unread, as ntb's receive shares do. There is no framing,
// no flow control per connection and no scheduling, so a ring transport
// reading into those buffers reaches it at best. It measures stream only,
// for -duration, and is left out of the default transports.
//
// What it shows (the 2-vCPU VM, 64 KiB messages): ~18 GB/s while the
// read buffers of all connections fit in the reader's 2 MiB L2 together,
// ~15.5 at 8-64 connections of 32 KiB reads (1-2 MiB of buffers) and ~12
// at 32-64 connections of 256 KiB reads (8-16 MiB): the reader's copy then
// refetches its buffers from memory.
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
		bufs[i] = make([]byte, min(o.readBuf, rec))
	}
	pat := newPattern(size)

	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(2)) // one thread per copy
	var head, tail atomic.Int64                     // records written, read
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
			for h-tail.Load() >= slots/2 {
				if stop.Load() {
					return
				}
				waitTurn()
			}
			c := int(h % int64(o.conns))
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
			waitTurn()
		}
		src := ring[int(t%slots)*rec:][:rec]
		buf := bufs[t%int64(o.conns)]
		for len(src) > 0 {
			n := copy(buf, src)
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

// waitTurn is a copy thread's wait for the other: it lets the other run
// should they share a CPU (-pin same).
func waitTurn() { proc.Yield() }
