package proxy

import (
	"context"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/socklike"
)

// BenchmarkOffRackTCP measures the off-rack TCP path through both
// proxies (application → ntproxy → TCP fallback leg → ntproxy →
// application, everything in this process) with the leg over TLS 1.3
// (host keys, the default) and over plain TCP (auth.insecure): a 64-byte
// round trip (p50 and p99 reported), a 64 KiB-write stream (MB/s), and
// connection setup (a Dial to the first byte back, p50).
//
//	go test -run '^$' -bench OffRackTCP -benchtime 2000x ./internal/daemon/proxy
func BenchmarkOffRackTCP(b *testing.B) {
	for _, mode := range []string{"tls", "plain"} {
		b.Run(mode, func(b *testing.B) {
			r, _ := fallbackRack(b, func(cfg *config.Config, o *Options) {
				if mode == "plain" {
					cfg.Auth = config.Auth{Insecure: true}
					for i := range cfg.Peers {
						cfg.Peers[i].Key = ""
					}
				}
			})
			srv, client := echoRack(b, r)
			sink, err := (&socklike.ListenConfig{Proxy: srv}).Listen(context.Background(), "tcp", ":81")
			if err != nil {
				b.Fatal(err)
			}
			defer sink.Close()
			go func() {
				for {
					c, err := sink.Accept()
					if err != nil {
						return
					}
					go func() { io.Copy(io.Discard, c); c.Write([]byte{1}); c.Close() }()
				}
			}()
			d := &socklike.Dialer{Proxy: client, Transports: []string{ctlapi.PathTCP}}

			b.Run("rtt64", func(b *testing.B) {
				c, err := d.Dial("tcp", "b:80")
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				msg, got := make([]byte, 64), make([]byte, 64)
				lat := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for range b.N {
					t0 := time.Now()
					if _, err := c.Write(msg); err != nil {
						b.Fatal(err)
					}
					if _, err := io.ReadFull(c, got); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t0))
				}
				b.StopTimer()
				reportQuantiles(b, lat)
			})
			b.Run("stream64k", func(b *testing.B) {
				c, err := d.Dial("tcp", "b:81")
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				buf := make([]byte, 64<<10)
				b.SetBytes(int64(len(buf)))
				b.ResetTimer()
				for range b.N {
					if _, err := c.Write(buf); err != nil {
						b.Fatal(err)
					}
				}
				// Every byte has reached the sink when its answer comes.
				if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf[:1]); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
			})
			b.Run("setup", func(b *testing.B) {
				lat := make([]time.Duration, 0, b.N)
				one := make([]byte, 1)
				b.ResetTimer()
				for range b.N {
					t0 := time.Now()
					c, err := d.Dial("tcp", "b:80")
					if err != nil {
						b.Fatal(err)
					}
					if _, err := c.Write(one); err != nil {
						b.Fatal(err)
					}
					if _, err := io.ReadFull(c, one); err != nil {
						b.Fatal(err)
					}
					lat = append(lat, time.Since(t0))
					c.Close()
				}
				b.StopTimer()
				reportQuantiles(b, lat)
			})
		})
	}
}

// reportQuantiles reports lat's p50 and p99 in µs.
func reportQuantiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))]) / 1e3 }
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
}
