package rdma

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
)

// pipeMaker returns two connected Conns of one provider, closed at the
// test's end.
type pipeMaker func(t *testing.T) (Conn, Conn)

func memPipe(size int) pipeMaker {
	return func(t *testing.T) (Conn, Conn) {
		a, b, _, _ := ringPipe(t, size)
		return a, b
	}
}

func tcpPipe(t *testing.T) (Conn, Conn) {
	t.Helper()
	a, b, stop, err := providerPipe(NewTCP(Config{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return a.(Conn), b.(Conn)
}

// providerPipe listens on loopback, dials and accepts: nettest's
// MakePipe for any provider.
func providerPipe(p Provider) (c1, c2 net.Conn, stop func(), err error) {
	ln, err := p.Listen("127.0.0.1:0")
	if err != nil {
		return nil, nil, nil, err
	}
	defer ln.Close()
	type result struct {
		c   net.Conn
		err error
	}
	accepted := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		accepted <- result{c, err}
	}()
	c1, err = p.Dial(context.Background(), ln.Addr().String())
	if err != nil {
		return nil, nil, nil, err
	}
	r := <-accepted
	if r.err != nil {
		c1.Close()
		return nil, nil, nil, r.err
	}
	return c1, r.c, func() { c1.Close(); r.c.Close() }, nil
}

// checkGoroutines fails the test if goroutines started during it are
// still running a few seconds after its cleanups.
// blockingRead and blockingWrite make the call under test a frame of its
// own, which waitfor.Blocked finds once the call waits.
//
//go:noinline
func blockingRead(c net.Conn, p []byte) (int, error) { return c.Read(p) }

//go:noinline
func blockingWrite(c net.Conn, p []byte) (int, error) { return c.Write(p) }

func checkGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		if !waitfor.Until(func() bool { return runtime.NumGoroutine() <= before }) {
			n := runtime.NumGoroutine()
			buf := make([]byte, 1<<16)
			t.Errorf("%d goroutines leaked:\n%s", n-before, buf[:runtime.Stack(buf, true)])
		}
	})
}

var pipes = []struct {
	name string
	make pipeMaker
}{
	{"tcp", tcpPipe},
	{"ring", memPipe(DefaultRingSize)},
	{"ring-4KiB", memPipe(MinRingSize)},
}

// TestNettest runs golang.org/x/net/nettest's conformance suite on the
// TCP provider and on the verbs provider's ring protocol over in-memory
// links (the real verbs provider runs it in make vmtest's guest).
func TestNettest(t *testing.T) {
	t.Run("tcp", func(t *testing.T) {
		checkGoroutines(t)
		nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) { return providerPipe(NewTCP(Config{})) })
	})
	for _, size := range []int{DefaultRingSize, MinRingSize} {
		t.Run("ring-"+byteSize(size), func(t *testing.T) {
			checkGoroutines(t)
			nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
				a, b := newMemLinks(size)
				sa, sb := net.Pipe()
				ca := newRingConn(a, sa, "mem", 2*time.Second)
				cb := newRingConn(b, sb, "mem", 2*time.Second)
				return ca, cb, func() { ca.Close(); cb.Close() }, nil
			})
		})
	}
}

func byteSize(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() && errors.Is(err, os.ErrDeadlineExceeded)
}

// TestSemantics: what the proxy relies on, identical for both providers.
func TestSemantics(t *testing.T) {
	for _, p := range pipes {
		t.Run(p.name, func(t *testing.T) { testSemantics(t, p.make) })
	}
}

func testSemantics(t *testing.T, makePipe pipeMaker) {
	t.Run("ReadDeadline", func(t *testing.T) {
		checkGoroutines(t)
		a, _ := makePipe(t)
		errc := make(chan error, 1)
		go func() { _, err := blockingRead(a, make([]byte, 10)); errc <- err }()
		waitfor.Blocked(t, "rdma.blockingRead") // the deadline must end a Read already waiting
		a.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		if err := <-errc; !isTimeout(err) {
			t.Fatalf("blocked Read after its deadline: %v, want a timeout matching os.ErrDeadlineExceeded", err)
		}
		a.SetReadDeadline(time.Now().Add(-time.Second))
		if _, err := a.Read(make([]byte, 10)); !isTimeout(err) {
			t.Fatalf("Read past the deadline: %v", err)
		}
	})
	t.Run("WriteDeadline", func(t *testing.T) {
		checkGoroutines(t)
		a, _ := makePipe(t)
		a.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
		big := make([]byte, 64<<20) // more than any ring or socket buffer
		n, err := a.Write(big)
		if !isTimeout(err) || n == len(big) {
			t.Fatalf("Write to a peer that does not read: %d, %v; want a timeout", n, err)
		}
	})
	t.Run("CloseUnblocks", func(t *testing.T) {
		checkGoroutines(t)
		a, _ := makePipe(t)
		b, _ := makePipe(t)
		rerr, werr := make(chan error, 1), make(chan error, 1)
		go func() { _, err := blockingRead(a, make([]byte, 10)); rerr <- err }()
		go func() { _, err := blockingWrite(b, make([]byte, 64<<20)); werr <- err }()
		// Close must end calls already waiting: a Read with nothing to
		// read, a Write with the peer's window full.
		waitfor.Blocked(t, "rdma.blockingRead")
		waitfor.Blocked(t, "rdma.blockingWrite")
		a.Close()
		b.Close()
		for _, err := range []error{<-rerr, <-werr} {
			if !errors.Is(err, net.ErrClosed) {
				t.Errorf("blocked call after Close: %v, want net.ErrClosed", err)
			}
		}
		if _, err := a.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Write after Close: %v", err)
		}
	})
	t.Run("CloseWrite", func(t *testing.T) {
		checkGoroutines(t)
		a, b := makePipe(t)
		if _, err := a.Write([]byte("last words")); err != nil {
			t.Fatal(err)
		}
		if err := a.CloseWrite(); err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(b)
		if err != nil || string(got) != "last words" {
			t.Fatalf("peer read %q, %v; want the data, then io.EOF", got, err)
		}
		if _, err := a.Write([]byte("more")); !errors.Is(err, syscall.EPIPE) {
			t.Errorf("Write after CloseWrite: %v, want EPIPE", err)
		}
		// The other direction still works.
		if _, err := b.Write([]byte("reply")); err != nil {
			t.Fatal(err)
		}
		b.Close()
		got, err = io.ReadAll(a)
		if err != nil || string(got) != "reply" {
			t.Fatalf("read %q, %v after the peer's close", got, err)
		}
	})
	t.Run("CloseDeliversEverything", func(t *testing.T) {
		checkGoroutines(t)
		a, b := makePipe(t)
		want := bytes.Repeat([]byte("0123456789abcdef"), 20000)
		done := make(chan error, 1)
		go func() {
			_, err := a.Write(want)
			done <- errors.Join(err, a.Close())
		}()
		got, err := io.ReadAll(b)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err != nil || !bytes.Equal(got, want) {
			t.Fatalf("read %d bytes (%v), want %d then io.EOF", len(got), err, len(want))
		}
	})
}
