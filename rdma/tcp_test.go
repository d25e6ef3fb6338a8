package rdma

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
)

// TestTCPWriteCutShort: a Write cut short by its deadline inside a record
// leaves the stream framed; the caller resumes with the rest and the peer
// reads exactly the bytes written.
func TestTCPWriteCutShort(t *testing.T) {
	checkGoroutines(t)
	a, b := tcpPipe(t)
	// Small socket buffers, so a few MiB are enough to block.
	a.(*tcpConn).tcp.(*net.TCPConn).SetWriteBuffer(64 << 10)
	b.(*tcpConn).tcp.(*net.TCPConn).SetReadBuffer(64 << 10)
	want := make([]byte, 4<<20)
	rand.NewChaCha8([32]byte{3}).Read(want)
	a.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	n, err := a.Write(want)
	if !isTimeout(err) {
		t.Fatalf("Write: %d, %v; want a timeout", n, err)
	}
	if n%MaxRecordPayload == 0 {
		t.Logf("cut at a record boundary (%d); the test proves less", n)
	}
	got := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(b)
		got <- b
	}()
	a.SetWriteDeadline(time.Time{})
	if _, err := a.Write(want[n:]); err != nil {
		t.Fatal(err)
	}
	a.CloseWrite()
	if g := <-got; !bytes.Equal(g, want) {
		t.Fatalf("peer read %d bytes, not the %d written", len(g), len(want))
	}
}

// TestTCPHandshakeMismatch: a TCP dial to a server that is not an rdma
// listener, or to a verbs listener, fails clearly.
func TestTCPHandshakeMismatch(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		h := hello{provider: provVerbs}
		c.Write(h.marshal())
		io.Copy(io.Discard, c)
	}()
	_, err = NewTCP(Config{}).Dial(context.Background(), ln.Addr().String())
	if !errors.Is(err, ErrProviderMismatch) {
		t.Fatalf("Dial: %v, want ErrProviderMismatch", err)
	}
}

// TestListenerClose: Close ends Accept with net.ErrClosed and a
// handshake that never completes does not hold it up.
func TestListenerClose(t *testing.T) {
	checkGoroutines(t)
	ln, err := NewTCP(Config{}).Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	silent, err := net.Dial("tcp", ln.Addr().String()) // never says hello
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	errc := make(chan error, 1)
	go func() { _, err := ln.Accept(); errc <- err }()
	waitfor.Blocked(t, "rdma.(*listener).Accept") // Close must end an Accept already waiting
	ln.Close()
	if err := <-errc; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
}
