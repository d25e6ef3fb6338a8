package gateway

import (
	"io"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
)

// BenchmarkRoundTrip is one TCP client's 64 B round trip through the
// gateways of two hosts (both in this process) to an echo server, in each
// gateway mode; it reports the median and the 99th percentile.
func BenchmarkRoundTrip(b *testing.B) {
	for _, mode := range []string{config.GatewayTrunk, config.GatewayDirect} {
		b.Run(mode, func(b *testing.B) {
			a, _ := newRack(b, mode, echoServer(b))
			c, err := net.Dial("tcp", a.gw.Stats()[0].Listen)
			require.NoError(b, err)
			defer c.Close()
			msg, got := make([]byte, 64), make([]byte, 64)
			lat := make([]time.Duration, 0, b.N)
			for b.Loop() {
				start := time.Now()
				_, err := c.Write(msg)
				require.NoError(b, err)
				_, err = io.ReadFull(c, got)
				require.NoError(b, err)
				lat = append(lat, time.Since(start))
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
		})
	}
}
