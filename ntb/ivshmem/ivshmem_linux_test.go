package ivshmem

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
)

const testTimeout = 5 * time.Second

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// startServer runs a server on a socket in a temporary directory and
// closes it at the end of the test.
func startServer(t *testing.T, cfg ServerConfig) *Server {
	t.Helper()
	if cfg.SocketPath == "" {
		cfg.SocketPath = filepath.Join(t.TempDir(), "ivshmem.sock")
	}
	if cfg.Size == 0 {
		cfg.Size = 1 << 20
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(context.Background()) }()
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close server: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return s
}

func dial(t *testing.T, s *Server) *Client {
	t.Helper()
	c, err := Dial(testCtx(t), s.Addr(), s.cfg.Vectors)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("close client %d: %v", c.ID(), err)
		}
	})
	return c
}

func nextEvent(t *testing.T, c *Client) PeerEvent {
	t.Helper()
	e, err := c.NextEvent(testCtx(t))
	if err != nil {
		t.Fatalf("client %d: next event: %v", c.ID(), err)
	}
	return e
}

func TestClientsShareMemoryAndGetDistinctIDs(t *testing.T) {
	for _, tc := range []struct {
		name string
		shm  func(t *testing.T) string
	}{
		{"memfd", func(*testing.T) string { return "" }},
		{"file", func(t *testing.T) string { return filepath.Join(t.TempDir(), "ivshmem") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, ServerConfig{ShmPath: tc.shm(t), Size: 64 << 10, Vectors: 2})
			cs := []*Client{dial(t, s), dial(t, s), dial(t, s)}
			for i, c := range cs {
				if c.ID() != i {
					t.Errorf("client %d got id %d", i, c.ID())
				}
				if len(c.Mem()) != 64<<10 {
					t.Errorf("client %d maps %d bytes", i, len(c.Mem()))
				}
			}
			// Client 0 hears of 1 and 2; 1 of 2; 2 knew both from the handshake.
			for _, want := range []PeerEvent{{1, true}, {2, true}} {
				if e := nextEvent(t, cs[0]); e != want {
					t.Fatalf("client 0: event %+v, want %+v", e, want)
				}
			}
			if e := nextEvent(t, cs[1]); e != (PeerEvent{2, true}) {
				t.Fatalf("client 1: event %+v", e)
			}
			for i, c := range cs {
				want := slices.DeleteFunc([]int{0, 1, 2}, func(id int) bool { return id == i })
				if got := c.Peers(); !slices.Equal(got, want) {
					t.Errorf("client %d: peers %v, want %v", i, got, want)
				}
			}
			copy(cs[0].Mem()[100:], "through client 0")
			binary.LittleEndian.PutUint64(cs[1].Mem()[64<<10-8:], 0xfeedface)
			if got := string(cs[2].Mem()[100:116]); got != "through client 0" {
				t.Errorf("client 2 reads %q", got)
			}
			if got := binary.LittleEndian.Uint64(cs[0].Mem()[64<<10-8:]); got != 0xfeedface {
				t.Errorf("client 0 reads %#x", got)
			}
		})
	}
}

func TestRingWakesWait(t *testing.T) {
	s := startServer(t, ServerConfig{Vectors: 3})
	a, b := dial(t, s), dial(t, s)
	woke := make(chan error, 1)
	go func() { woke <- a.Wait(testCtx(t), 2) }()
	waitfor.Blocked(t, "ivshmem.(*Client).Wait")
	select {
	case err := <-woke:
		t.Fatalf("Wait returned before any ring: %v", err)
	default:
	}
	if err := b.Ring(a.ID(), 2); err != nil {
		t.Fatal(err)
	}
	if err := <-woke; err != nil {
		t.Fatal(err)
	}
	// A ring before Wait is kept; several rings are consumed by one Wait.
	for range 3 {
		if err := a.Ring(b.ID(), 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Wait(testCtx(t), 0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := b.Wait(ctx, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with nothing pending: %v, want the context's error", err)
	}
	// Vector 1 of b was not rung by the rings of vector 0 or 2.
	ctx, cancel = context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if err := b.Wait(ctx, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on an unrung vector: %v", err)
	}
	if err := a.Ring(a.ID(), 1); err != nil {
		t.Fatal(err)
	}
	if err := a.Wait(testCtx(t), 1); err != nil {
		t.Fatalf("self ring: %v", err)
	}
	if err := a.Ring(9, 0); !errors.Is(err, ErrNoPeer) {
		t.Errorf("ring unknown peer: %v", err)
	}
	if err := a.Ring(b.ID(), 3); err == nil {
		t.Error("ring vector 3 of 3 succeeded")
	}
}

func TestDisconnectIsAnnounced(t *testing.T) {
	s := startServer(t, ServerConfig{})
	a, b := dial(t, s), dial(t, s)
	c, err := Dial(testCtx(t), s.Addr(), 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []PeerEvent{{1, true}, {2, true}} {
		if e := nextEvent(t, a); e != want {
			t.Fatalf("a: %+v, want %+v", e, want)
		}
	}
	if e := nextEvent(t, b); e != (PeerEvent{2, true}) {
		t.Fatalf("b: %+v", e)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for _, x := range []*Client{a, b} {
		if e := nextEvent(t, x); e != (PeerEvent{2, false}) {
			t.Fatalf("client %d: %+v, want peer 2 down", x.ID(), e)
		}
		if err := x.Ring(2, 0); !errors.Is(err, ErrNoPeer) {
			t.Errorf("ring departed peer: %v", err)
		}
	}
	if err := c.Ring(0, 0); !errors.Is(err, net.ErrClosed) {
		t.Errorf("ring on a closed client: %v", err)
	}
	if err := c.Wait(testCtx(t), 0); !errors.Is(err, net.ErrClosed) {
		t.Errorf("wait on a closed client: %v", err)
	}

	// A client that talks breaks the protocol and is dropped; the lowest
	// free id (2) is reused.
	conn, err := net.Dial("unix", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if e := nextEvent(t, a); e != (PeerEvent{2, true}) {
		t.Fatalf("a: %+v, want peer 2 up", e)
	}
	if _, err := conn.Write([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	if e := nextEvent(t, a); e != (PeerEvent{2, false}) {
		t.Fatalf("a: %+v, want peer 2 down", e)
	}
}

func fdCount(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

func TestCloseReleasesEverything(t *testing.T) {
	run := func() {
		sock := filepath.Join(t.TempDir(), "s")
		s, err := NewServer(ServerConfig{SocketPath: sock, Size: 4096, Vectors: 2})
		if err != nil {
			t.Fatal(err)
		}
		served := make(chan error, 1)
		go func() { served <- s.Serve(context.Background()) }()
		a, err := Dial(testCtx(t), sock, 2)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Dial(testCtx(t), sock, 2)
		if err != nil {
			t.Fatal(err)
		}
		if err := errors.Join(s.Close(), s.Close(), <-served); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("socket after Close: %v", err)
		}
		// The server is gone; the clients keep their doorbells and memory.
		for _, c := range []*Client{a, b} {
			for {
				_, err := c.NextEvent(testCtx(t))
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Fatalf("client %d: %v, want io.EOF", c.ID(), err)
				}
			}
		}
		if err := a.Ring(b.ID(), 1); err != nil {
			t.Fatal(err)
		}
		if err := b.Wait(testCtx(t), 1); err != nil {
			t.Fatal(err)
		}
		a.Mem()[0] = 42
		if b.Mem()[0] != 42 {
			t.Error("memory not shared after the server closed")
		}
		if err := errors.Join(a.Close(), b.Close(), a.Close()); err != nil {
			t.Fatal(err)
		}
		if _, err := a.NextEvent(testCtx(t)); !errors.Is(err, io.EOF) {
			t.Errorf("NextEvent after Close: %v, want the earlier io.EOF", err)
		}
	}
	run() // warm up: the netpoller's epoll fd and the like
	fds, goroutines := fdCount(t), runtime.NumGoroutine()
	run()
	if n := fdCount(t); n != fds {
		t.Errorf("%d fds open after Close, %d before", n, fds)
	}
	waitfor.Until(func() bool { return runtime.NumGoroutine() <= goroutines })
	if n := runtime.NumGoroutine(); n > goroutines {
		t.Errorf("%d goroutines after Close, %d before", n, goroutines)
	}
}

func TestServeStopsOnContext(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s")
	s, err := NewServer(ServerConfig{SocketPath: sock, Size: 4096})
	if err != nil {
		t.Fatal(err)
	}
	early, cancelEarly := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancelEarly()
	if _, err := Dial(early, sock, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial before Serve: %v, want to wait for Serve", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	cancel()
	if err := <-served; !errors.Is(err, context.Canceled) {
		t.Fatalf("Serve: %v", err)
	}
	if err := s.Serve(t.Context()); err == nil {
		t.Error("second Serve succeeded")
	}
	if _, err := os.Stat(sock); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after cancel: %v", err)
	}
}

func TestNewServerRejectsBadConfig(t *testing.T) {
	dir := t.TempDir()
	for _, cfg := range []ServerConfig{
		{SocketPath: "", Size: 4096},
		{SocketPath: filepath.Join(dir, "a"), Size: 0},
		{SocketPath: filepath.Join(dir, "b"), Size: 4096, Vectors: MaxVectors + 1},
		{SocketPath: filepath.Join(dir, "c"), Size: 4096, ShmPath: filepath.Join(dir, "no", "such", "dir")},
	} {
		if s, err := NewServer(cfg); err == nil {
			_ = s.Close()
			t.Errorf("NewServer(%+v) succeeded", cfg)
		}
	}
	s := startServer(t, ServerConfig{})
	if _, err := NewServer(ServerConfig{SocketPath: s.Addr(), Size: 4096}); err == nil {
		t.Error("second server on one socket succeeded")
	}
}

// fakeServer accepts one client and sends it msgs; fds says how many fds
// go with each message (an eventfd each).
type fakeMsg struct {
	v   int64
	fds int
}

// It returns the socket path and a function that waits until the fake has
// hung up and released its fds.
func fakeServer(t *testing.T, msgs []fakeMsg, short bool) (string, func()) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "fake")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	stop := func() { _ = ln.Close(); <-done }
	t.Cleanup(stop)
	go func() {
		defer close(done)
		conn, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		defer conn.Close()
		shm, err := unix.MemfdCreate("fake", unix.MFD_CLOEXEC)
		if err != nil {
			t.Error(err)
			return
		}
		defer unix.Close(shm)
		_ = unix.Ftruncate(shm, 4096)
		for _, m := range msgs {
			var fds []int
			for range m.fds {
				fd := shm
				if m.v != -1 {
					if fd, err = unix.Eventfd(0, unix.EFD_CLOEXEC); err != nil {
						t.Error(err)
						return
					}
					defer unix.Close(fd)
				}
				fds = append(fds, fd)
			}
			var oob []byte
			if len(fds) > 0 {
				oob = unix.UnixRights(fds...)
			}
			b := binary.LittleEndian.AppendUint64(nil, uint64(m.v))
			if _, _, err := conn.WriteMsgUnix(b, oob, nil); err != nil {
				return
			}
		}
		if short {
			_, _ = conn.Write([]byte{1, 2, 3})
			return
		}
		var b [1]byte
		_, _ = conn.Read(b[:]) // hold the connection until the client leaves
	}()
	return sock, stop
}

func TestDialRejectsMalformedServer(t *testing.T) {
	ok := []fakeMsg{{0, 0}, {0, 0}, {-1, 1}}
	for _, tc := range []struct {
		name  string
		msgs  []fakeMsg
		short bool
		want  error
	}{
		{"version 1", []fakeMsg{{1, 0}}, false, ErrProtocol},
		{"negative id", []fakeMsg{{0, 0}, {-3, 0}}, false, ErrProtocol},
		{"id with fd", []fakeMsg{{0, 0}, {0, 1}}, false, ErrProtocol},
		{"shm without fd", []fakeMsg{{0, 0}, {0, 0}, {-1, 0}}, false, ErrProtocol},
		{"two fds on one message", append(ok, fakeMsg{0, 2}), false, ErrProtocol},
		{"many fds on one message", append(ok, fakeMsg{0, 9}), false, ErrProtocol},
		{"peer without fd", append(ok, fakeMsg{1, 0}), false, ErrProtocol},
		{"too few peer vectors", append(ok, fakeMsg{1, 1}, fakeMsg{0, 1}, fakeMsg{0, 1}), false, ErrProtocol},
		{"server hangs up", ok, false, io.EOF},
		{"half a message", ok, true, io.ErrUnexpectedEOF},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := fdCount(t)
			sock, stop := fakeServer(t, tc.msgs, tc.short)
			if tc.want == io.EOF {
				// The fake holds the connection open: bound the wait.
				ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
				defer cancel()
				if _, err := Dial(ctx, sock, 2); !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("Dial: %v, want the context's error", err)
				}
				return
			}
			c, err := Dial(testCtx(t), sock, 2)
			if !errors.Is(err, tc.want) {
				if c != nil {
					_ = c.Close()
				}
				t.Fatalf("Dial: %v, want %v", err, tc.want)
			}
			stop()
			if n := fdCount(t); n != before {
				t.Errorf("%d fds open after a failed Dial, %d before", n, before)
			}
		})
	}
}
