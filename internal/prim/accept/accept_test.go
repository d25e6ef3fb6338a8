package accept

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
)

func TestNextDelay(t *testing.T) {
	var got []time.Duration
	d := time.Duration(0)
	for range 10 {
		d = NextDelay(d)
		got = append(got, d)
	}
	ms := time.Millisecond
	require.Equal(t, []time.Duration{5 * ms, 10 * ms, 20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 640 * ms, time.Second, time.Second}, got)
}

func TestTemporary(t *testing.T) {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED} {
		err := &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", e)}
		require.True(t, Temporary(err), "%v", err)
	}
	require.False(t, Temporary(net.ErrClosed))
	require.False(t, Temporary(errors.New("something else")))
}

// fakeListener fails Accept with the queued errors, then hands out the
// queued connections, then blocks until closed.
type fakeListener struct {
	mu    sync.Mutex
	errs  []error
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
	calls int
}

func newFake(errs ...error) *fakeListener {
	return &fakeListener{errs: errs, conns: make(chan net.Conn, 16), done: make(chan struct{})}
}

func (f *fakeListener) Accept() (net.Conn, error) {
	f.mu.Lock()
	f.calls++
	if len(f.errs) > 0 {
		err := f.errs[0]
		f.errs = f.errs[1:]
		f.mu.Unlock()
		return nil, err
	}
	f.mu.Unlock()
	select {
	case c := <-f.conns:
		return c, nil
	case <-f.done:
		return nil, &net.OpError{Op: "accept", Net: "fake", Err: net.ErrClosed}
	}
}

func (f *fakeListener) Close() error   { f.once.Do(func() { close(f.done) }); return nil }
func (f *fakeListener) Addr() net.Addr { return &net.TCPAddr{} }

// pipeConn is one end of a net.Pipe with a chosen remote address.
type pipeConn struct {
	net.Conn
	remote net.Addr
}

func (c pipeConn) RemoteAddr() net.Addr { return c.remote }

func connFrom(t *testing.T, ip string) (net.Conn, net.Conn) {
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	return pipeConn{a, &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}}, b
}

func emfile() error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
}

// A listener out of descriptors keeps accepting once they are back: every
// error is retried, logged, and the connection after them comes through.
func TestListenerRetriesTemporaryErrors(t *testing.T) {
	f := newFake(emfile(), emfile(), &net.OpError{Op: "accept", Err: os.NewSyscallError("accept4", syscall.ENOBUFS)}, errors.New("odd"))
	var mu sync.Mutex
	var logs []string
	ln := Wrap(f, Options{What: "test", PerSource: 4, Logf: func(format string, args ...any) {
		mu.Lock()
		logs = append(logs, fmt.Sprintf(format, args...))
		mu.Unlock()
	}})
	defer ln.Close()
	c, _ := connFrom(t, "192.0.2.1")
	f.conns <- c
	got, err := ln.Accept()
	require.NoError(t, err)
	require.Equal(t, "192.0.2.1", got.(*Conn).Source)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, logs, 5, "%q", logs) // three errors, a later one, the recovery
	require.Contains(t, logs[0], "too many open files")
	require.Contains(t, logs[3], "unexpected")
	require.Contains(t, logs[4], "accepting again after 4")
}

// Close ends an Accept that is waiting out a backoff.
func TestListenerCloseDuringBackoff(t *testing.T) {
	errs := make([]error, 100)
	for i := range errs {
		errs[i] = emfile()
	}
	f := newFake(errs...)
	ln := Wrap(f, Options{What: "test", PerSource: 1})
	res := make(chan error, 1)
	go func() {
		_, err := ln.Accept()
		res <- err
	}()
	waitfor.True(t, "Accept in its backoff", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.calls >= 2
	})
	ln.Close()
	err := <-res
	require.ErrorIs(t, err, net.ErrClosed)
}

// A source with its bound pending loses its further connections at once;
// another source still gets in, and a slot comes back when a pending
// connection is identified or closed.
func TestListenerBoundsPendingPerSource(t *testing.T) {
	f := newFake()
	ln := Wrap(f, Options{What: "test", PerSource: 2})
	defer ln.Close()
	accept := func() *Conn {
		t.Helper()
		c, err := ln.Accept()
		require.NoError(t, err)
		return c.(*Conn)
	}
	a1, _ := connFrom(t, "192.0.2.1")
	a2, _ := connFrom(t, "192.0.2.1")
	a3, a3peer := connFrom(t, "192.0.2.1")
	b1, _ := connFrom(t, "192.0.2.2")
	f.conns <- a1
	f.conns <- a2
	f.conns <- a3
	f.conns <- b1
	c1, c2 := accept(), accept()
	// a3 is refused: closed at once, which its peer sees.
	c3 := accept()
	require.Equal(t, "192.0.2.2", c3.Source)
	_, err := a3peer.Read(make([]byte, 1))
	require.Error(t, err)
	require.Equal(t, 2, ln.lim.Pending("192.0.2.1"))

	c1.Identified()
	c1.Identified() // idempotent
	require.Equal(t, 1, ln.lim.Pending("192.0.2.1"))
	c2.Close()
	c2.Close()
	require.Equal(t, 0, ln.lim.Pending("192.0.2.1"))
	a4, _ := connFrom(t, "192.0.2.1")
	f.conns <- a4
	require.Equal(t, "192.0.2.1", accept().Source)
	c3.Close()
}

func TestListenerExempt(t *testing.T) {
	f := newFake()
	ln := Wrap(f, Options{What: "test", PerSource: 1, Exempt: func(s string) bool { return s == "192.0.2.9" }})
	defer ln.Close()
	for range 3 {
		c, _ := connFrom(t, "192.0.2.9")
		f.conns <- c
		got, err := ln.Accept()
		require.NoError(t, err)
		require.Equal(t, "192.0.2.9", got.(*Conn).Source)
	}
	require.Equal(t, 0, ln.lim.Pending("192.0.2.9"))
}

func TestRemoteIP(t *testing.T) {
	c, _ := connFrom(t, "::ffff:192.0.2.7")
	ip, err := RemoteIP(c)
	require.NoError(t, err)
	require.Equal(t, "192.0.2.7", ip)
	c6, _ := connFrom(t, "2001:db8::1")
	ip, err = RemoteIP(c6)
	require.NoError(t, err)
	require.Equal(t, "2001:db8::1", ip)
}

// Retry ends its loop on a closed listener without waiting.
func TestRetryEndsOnClosed(t *testing.T) {
	var r Retry
	require.False(t, r.Pause(nil, &net.OpError{Op: "accept", Err: net.ErrClosed}))
	done := make(chan struct{})
	close(done)
	require.False(t, r.Pause(done, emfile()))
}

// Without a bound a Listener only retries: every connection comes
// through, with no source asked for.
func TestListenerUnbounded(t *testing.T) {
	f := newFake(emfile())
	ln := Wrap(f, Options{What: "test", Source: func(net.Conn) (string, error) { return "", errors.New("not asked") }})
	defer ln.Close()
	for range 3 {
		c, _ := connFrom(t, "192.0.2.1")
		f.conns <- c
		_, err := ln.Accept()
		require.NoError(t, err)
	}
}

// Next retries a failing accept until it succeeds, and stops at once on
// a closed listener.
func TestNext(t *testing.T) {
	var r Retry
	calls := 0
	c, ok := Next(&r, nil, func() (int, error) {
		calls++
		if calls < 3 {
			return 0, syscall.EMFILE
		}
		return 42, nil
	})
	if !ok || c != 42 || calls != 3 || r.failed != 0 {
		t.Fatalf("Next = %d, %v after %d calls (failed %d)", c, ok, calls, r.failed)
	}
	if _, ok := Next(&r, nil, func() (int, error) { return 0, net.ErrClosed }); ok {
		t.Fatal("Next went on past a closed listener")
	}
}
