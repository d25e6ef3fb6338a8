package main

import (
	"time"

	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/partition"
)

// copy is no transport but the bound the memory system puts on every
// single-copy one: what the receiving end of a stream must do at the
// least, copy each byte out of the ring into the application's buffer,
// with nothing else — no sender, no framing, no flow control, no
// scheduling. One goroutine of the client process, pinned like the
// client, copies -readbuf bytes at a time out of a ring the size of the
// ntb transport's (a partition of the default window) into -conns read
// buffers of -readbuf bytes in turn, as the server's readers would, for
// -duration. It measures stream only and is left out of the default
// transports.
//
// The ring is written once, before measuring: its lines come from the
// shared cache, as an ntb receiver's do (the sender's CPU wrote them). The
// read buffers are what it shows: while -conns of them fit in the CPU's
// cache together the copy runs at cache speed; past that every copy also
// evicts and refetches them, and no transport that copies into them can
// be faster.
func init() {
	register(transport{name: "copy", local: copyBound})
}

// copyBound measures the bound for one message size: the messages of size
// bytes that the copies would have delivered, split over -conns samples.
func copyBound(o *options, size int) ([]sample, error) {
	l, err := partition.NewLayout(shm.DefaultWindowSize, o.partitions)
	if err != nil {
		return nil, err
	}
	ring := make([]byte, l.RingSize)
	for i := range ring {
		ring[i] = byte(i)
	}
	bufs := make([][]byte, o.conns)
	for i := range bufs {
		bufs[i] = make([]byte, min(o.readBuf, len(ring)))
	}
	off, k := 0, 0
	step := func() int {
		b := bufs[k%len(bufs)]
		if off+len(b) > len(ring) {
			off = 0
		}
		copy(b, ring[off:])
		off += len(b)
		k++
		return len(b)
	}
	for range 2 * len(bufs) { // warm-up: fault the buffers in
		step()
	}
	var total int64
	deadline := time.Now().Add(o.duration)
	for time.Now().Before(deadline) {
		for range 64 {
			total += int64(step())
		}
	}
	samples := make([]sample, o.conns)
	msgs := int(total / int64(size))
	for i := range samples {
		samples[i].msgs = msgs / o.conns
	}
	samples[0].msgs += msgs % o.conns
	return samples, nil
}
