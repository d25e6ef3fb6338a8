package workload

import (
	"bytes"
	"context"
	"net"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
)

// listen returns a TCP listener on an ephemeral loopback port.
func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return ln
}

var tcpDial DialFunc = (&net.Dialer{Timeout: 5 * time.Second}).DialContext

// startKV serves a new KV on ln (a fresh loopback listener if nil) and
// closes it when the test ends, checking that Serve returned nil.
func startKV(t *testing.T, ln net.Listener) (*KV, string) {
	t.Helper()
	if ln == nil {
		ln = listen(t)
	}
	kv := NewKV()
	done := make(chan error, 1)
	go func() { done <- kv.Serve(ln) }()
	t.Cleanup(func() {
		require.NoError(t, kv.Close())
		require.NoError(t, <-done)
	})
	return kv, ln.Addr().String()
}

// newRedis returns a go-redis client for addr, configured as RunYCSB
// configures it except that it keeps the default HELLO 3 attempt, to
// prove the fallback to RESP2 works.
func newRedis(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, Dialer: tcpDial, MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { c.Close() })
	return c
}

// checkGoroutines records the goroutine count and returns a function that
// waits up to 5 s for it to come back down, failing with every stack if it
// does not. Tests that use it must not run in parallel.
func checkGoroutines(t *testing.T) func() {
	t.Helper()
	before := runtime.NumGoroutine()
	return func() {
		t.Helper()
		if !waitfor.Until(func() bool { return runtime.NumGoroutine() <= before }) {
			buf := make([]byte, 1<<20)
			buf = buf[:runtime.Stack(buf, true)]
			t.Fatalf("goroutines: %d before, %d after:\n%s", before, runtime.NumGoroutine(), buf)
		}
	}
}

// testCtx returns a context that ends with the test or after d.
func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

// corruptListener wraps a listener so that, once skip bulk-string replies
// of at least 8 bytes have been written on any of its connections, it
// flips one byte in the middle of the next one's payload, exactly once. It
// stands for a transport that damages data.
type corruptListener struct {
	net.Listener

	// mu protects the following fields.
	mu      sync.Mutex
	skip    int
	flipped bool
}

func (l *corruptListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &corruptConn{Conn: c, l: l}, nil
}

// flip reports whether the reply whose payload is n bytes is the one to
// damage.
func (l *corruptListener) flip(n int) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.flipped || n < 8:
		return false
	case l.skip > 0:
		l.skip--
		return false
	}
	l.flipped = true
	return true
}

func (l *corruptListener) didFlip() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.flipped
}

type corruptConn struct {
	net.Conn
	l *corruptListener
}

// Write damages a "$<n>\r\n<payload>\r\n" reply if the listener says so.
// The KV server writes each buffered batch of replies with one Write, and
// a GET reply starts its batch when the client waits for each reply.
func (c *corruptConn) Write(p []byte) (int, error) {
	if len(p) == 0 || p[0] != '$' {
		return c.Conn.Write(p)
	}
	i := bytes.Index(p, []byte("\r\n"))
	n, err := strconv.Atoi(string(p[1:max(i, 1)]))
	if i < 0 || err != nil || i+2+n > len(p) || !c.l.flip(n) {
		return c.Conn.Write(p)
	}
	q := bytes.Clone(p)
	q[i+2+n/2] ^= 0x20
	return c.Conn.Write(q)
}
