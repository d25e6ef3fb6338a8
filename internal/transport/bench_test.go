package transport

import (
	"fmt"
	"io"
	"testing"
)

// Benchmarks over the emulated fabric inside one process (two goroutines).
// The project's figures come from cmd/ntbench, across processes; these are
// for profiling the data path.

func BenchmarkPingPong64(b *testing.B) {
	a, s := endpoints(b, "shm", Config{Logf: func(string, ...any) {}})
	c1, c2 := connPair(b, a, s, 1)
	go func() {
		buf := make([]byte, 64)
		for {
			if _, err := io.ReadFull(c2, buf); err != nil {
				return
			}
			if _, err := c2.Write(buf); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64)
	b.ResetTimer()
	for range b.N {
		if _, err := c1.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c1, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	c1.Close()
	c2.Close()
}

func BenchmarkStream64K(b *testing.B) {
	a, s := endpoints(b, "shm", Config{Logf: func(string, ...any) {}})
	c1, c2 := connPair(b, a, s, 1)
	done := make(chan int64)
	go func() {
		n, _ := io.Copy(io.Discard, c2)
		done <- n
	}()
	buf := make([]byte, 64<<10)
	b.SetBytes(int64(len(buf)))
	b.ResetTimer()
	for range b.N {
		if _, err := c1.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	c1.CloseWrite()
	if n := <-done; n != int64(b.N*len(buf)) {
		b.Fatalf("read %d bytes, wrote %d", n, b.N*len(buf))
	}
	b.StopTimer()
	c1.Close()
	c2.Close()
}

// BenchmarkKeep is the retention a DATA record costs its sender
// (keep.go), with a window's worth in flight: "copy" the copy a sender
// behind a bridge makes, "ref" what a sender on shared memory keeps (a copy for small records).
func BenchmarkKeep(b *testing.B) {
	for _, size := range []int{64, 64 << 10} {
		b.Run(fmt.Sprint("copy/", size), func(b *testing.B) {
			var r retention
			buf := make([]byte, size)
			var sent int64
			b.SetBytes(int64(size))
			for range b.N {
				r.add(sent, buf, max(0, sent-DefaultWindow/2))
				sent += int64(size)
			}
		})
		b.Run(fmt.Sprint("ref/", size), func(b *testing.B) {
			var r retention
			var q ringRefs
			c := &Conn{}
			buf := make([]byte, size)
			var sent int64
			b.SetBytes(int64(size))
			for range b.N {
				c.peerRead.Store(max(0, sent-DefaultWindow/2))
				if size <= keepSmall {
					r.addSmall(sent, buf, c.peerRead.Load())
					sent += int64(size)
					continue
				}
				q.overwrite(nil, uint64(max(0, sent-2*DefaultWindow)))
				r.addRef(sent, buf, nil, uint64(sent), c.peerRead.Load())
				sent += int64(size)
				q.push(c, sent, uint64(sent-int64(size)))
			}
		})
	}
}
