package workload

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// startFiles serves a FileServer with the test sizes on loopback.
func startFiles(t *testing.T, sizes []int, seed uint64) (*FileServer, string) {
	t.Helper()
	fs := NewFileServer(sizes, seed)
	ln := listen(t)
	done := make(chan error, 1)
	go func() { done <- fs.Serve(ln) }()
	t.Cleanup(func() {
		require.NoError(t, fs.Close())
		require.NoError(t, <-done)
	})
	return fs, "http://" + ln.Addr().String()
}

func TestHTTPFiles(t *testing.T) {
	check := checkGoroutines(t)
	const seed = 42
	fs, base := startFiles(t, []int{8 << 10, 1 << 20, 32 << 20}, seed)
	for _, tc := range []struct {
		size        int
		requests    int64
		concurrency int
	}{
		{8 << 10, 200, 4},
		{1 << 20, 16, 4},
		{32 << 20, 4, 2},
	} {
		res, err := RunHTTP(testCtx(t, 60*time.Second), HTTPConfig{
			Dial: tcpDial, BaseURL: base, Size: tc.size, Seed: seed,
			Requests: tc.requests, Concurrency: tc.concurrency,
		})
		require.NoError(t, err, "size %d", tc.size)
		require.Equal(t, uint64(tc.requests), res.Requests)
		require.Equal(t, uint64(tc.requests)*uint64(tc.size), res.Bytes)
		require.Zero(t, res.Errors)
		require.Zero(t, res.VerifyErrors)
		require.Positive(t, res.MBPerSec)
		require.LessOrEqual(t, res.Latency.P50, res.Latency.P99)
		require.LessOrEqual(t, res.Latency.P99, res.Latency.Max)
		t.Logf("%d bytes x %d: %.1f MB/s, p50 %v p99 %v", tc.size, tc.requests, res.MBPerSec, res.Latency.P50, res.Latency.P99)
	}

	// The server's own header agrees with the client's expectation.
	resp, err := http.Get(base + FileURLPath(8<<10))
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	sum := sha256.Sum256(FileContent(8<<10, seed))
	require.Equal(t, hex.EncodeToString(sum[:]), resp.Header.Get("X-Content-Sha256"))
	require.Equal(t, FileContent(8<<10, seed), body)
	http.DefaultClient.CloseIdleConnections()

	// A size not served is a 404, counted as an error.
	res, err := RunHTTP(testCtx(t, 10*time.Second), HTTPConfig{Dial: tcpDial, BaseURL: base, Size: 12345, Requests: 3, Concurrency: 1})
	require.ErrorContains(t, err, "404")
	require.Equal(t, uint64(3), res.Errors)

	// The wrong seed is a different file: every body fails verification.
	res, err = RunHTTP(testCtx(t, 10*time.Second), HTTPConfig{Dial: tcpDial, BaseURL: base, Size: 8 << 10, Seed: seed + 1, Requests: 2, Concurrency: 1})
	require.ErrorIs(t, err, ErrVerify)
	require.Equal(t, uint64(2), res.VerifyErrors)

	require.NoError(t, fs.Close())
	check()
}

func TestHTTPDuration(t *testing.T) {
	_, base := startFiles(t, []int{1 << 10}, 1)
	res, err := RunHTTP(testCtx(t, 20*time.Second), HTTPConfig{
		Dial: tcpDial, BaseURL: base + "/", Size: 1 << 10, Seed: 1, Duration: 100 * time.Millisecond, Concurrency: 3,
	})
	require.NoError(t, err)
	require.Positive(t, res.Requests)
	require.GreaterOrEqual(t, res.Elapsed, 100*time.Millisecond)

	for _, cfg := range []HTTPConfig{
		{BaseURL: base, Requests: 1, Concurrency: 0},
		{BaseURL: base, Concurrency: 1},
		{BaseURL: "ftp://x", Requests: 1, Concurrency: 1},
		{BaseURL: base, Size: -1, Requests: 1, Concurrency: 1},
	} {
		_, err := RunHTTP(t.Context(), cfg)
		require.Error(t, err)
	}
}

func TestCompareWriter(t *testing.T) {
	want := []byte("0123456789")
	for _, tc := range []struct {
		name   string
		writes []string
		at     int64
	}{
		{"equal", []string{"0123", "456789"}, -1},
		{"short", []string{"01234"}, -1}, // the length check is the caller's
		{"differs", []string{"0123", "45X789"}, 6},
		{"first byte", []string{"X"}, 0},
		{"longer", []string{"0123456789", "A"}, 10},
		{"longer in one write", []string{"0123456789AB"}, 10},
		{"first difference kept", []string{"0X2", "3Y"}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := compareWriter{want: want, at: -1}
			var n int64
			for _, w := range tc.writes {
				m, err := c.Write([]byte(w))
				require.NoError(t, err)
				require.Equal(t, len(w), m)
				n += int64(m)
			}
			require.Equal(t, tc.at, c.at)
			require.Equal(t, n, c.off)
		})
	}
}
