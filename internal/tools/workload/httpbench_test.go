package workload

import (
	"context"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/ntstack/ntstack/ntb/ntbtest"
	"github.com/ntstack/ntstack/socklike"
)

// BenchmarkHTTPFile serves files with net/http over a socklike embedded
// link of 4 MiB (the engine and window of a direct-mode connection) and
// over TCP loopback, both in this process, with the rack demo's workload:
// two clients, each comparing its body with the file. Beside MB/s it reports the
// process's CPU time per MB, which a loaded machine moves much less.
//
//	go test -run '^$' -bench HTTPFile -benchtime 100x ./internal/tools/workload/
func BenchmarkHTTPFile(b *testing.B) {
	sizes := []int{8 << 10, 1 << 20, 32 << 20}
	for _, tr := range []string{"ntb", "tcp"} {
		b.Run(tr, func(b *testing.B) {
			ln, dial, addr := httpBenchListen(b, tr)
			fs := NewFileServer(sizes, 1)
			go fs.Serve(ln)
			defer fs.Close()
			for _, size := range sizes {
				b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
					b.SetBytes(int64(size))
					var ru0, ru1 syscall.Rusage
					syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
					b.ResetTimer()
					res, err := RunHTTP(context.Background(), HTTPConfig{
						Dial: dial, BaseURL: "http://" + addr, Size: size, Seed: 1,
						Requests: int64(b.N), Concurrency: 2,
					})
					b.StopTimer()
					if err != nil {
						b.Fatal(err)
					}
					syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
					cpu := time.Duration(ru1.Utime.Nano() + ru1.Stime.Nano() - ru0.Utime.Nano() - ru0.Stime.Nano())
					b.ReportMetric(cpu.Seconds()*1e3/(float64(res.Bytes)/1e6), "cpu-ms/MB")
				})
			}
		})
	}
}

// httpBenchListen returns a listener of transport tr ("ntb": an embedded
// link; "tcp": loopback), the dial function that reaches it and its
// address.
func httpBenchListen(b *testing.B, tr string) (net.Listener, DialFunc, string) {
	if tr == "tcp" {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		return ln, (&net.Dialer{}).DialContext, ln.Addr().String()
	}
	da, db := ntbtest.NewPair(4 << 20)
	a, err := socklike.Attach(da, socklike.Config{})
	if err != nil {
		b.Fatal(err)
	}
	e, err := socklike.Attach(db, socklike.Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		a.Close()
		e.Close()
		da.Close()
		db.Close()
	})
	ln, err := (&socklike.ListenConfig{Endpoint: e}).Listen(context.Background(), "ntb", ":80")
	if err != nil {
		b.Fatal(err)
	}
	return ln, (&socklike.Dialer{Endpoint: a, Timeout: 5 * time.Second}).DialContext, "peer:80"
}
