package rdma

import (
	"errors"
	"io"
	"syscall"
	"testing"
	"time"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
)

// TestRingConnCorruptPeer: an immediate that claims more than the ring
// holds, or a corrupt record, fails the connection with a protocol error
// on Read and Write, without a panic.
func TestRingConnCorruptPeer(t *testing.T) {
	t.Run("immediate", func(t *testing.T) {
		checkGoroutines(t)
		a, _, la, _ := ringPipe(t, MinRingSize)
		la.inject(completion{recv: true, imm: dataImm(3 * MinRingSize)})
		if _, err := a.Read(make([]byte, 10)); !errors.Is(err, errProtocol) {
			t.Fatalf("Read: %v, want a protocol violation", err)
		}
		if _, err := a.Write([]byte("x")); !errors.Is(err, errProtocol) {
			t.Fatalf("Write: %v, want a protocol violation", err)
		}
	})
	t.Run("record", func(t *testing.T) {
		checkGoroutines(t)
		a, _, la, _ := ringPipe(t, MinRingSize)
		copy(la.rx, "not a record header at all")
		la.inject(completion{recv: true, imm: dataImm(24)})
		if _, err := a.Read(make([]byte, 10)); !errors.Is(err, errProtocol) {
			t.Fatalf("Read: %v, want a protocol violation", err)
		}
	})
	t.Run("credit", func(t *testing.T) {
		checkGoroutines(t)
		a, _, la, _ := ringPipe(t, MinRingSize)
		la.inject(completion{recv: true, imm: creditImm(1 << 20)})
		waitfor.True(t, "the bad credit to break the connection", func() bool {
			a.mu.Lock()
			defer a.mu.Unlock()
			return a.err != nil
		})
		if _, err := a.Write([]byte("x")); !errors.Is(err, errProtocol) {
			t.Fatalf("Write: %v, want a protocol violation", err)
		}
	})
}

// TestRingConnPeerVanished: the side channel ends without a goodbye (the
// peer process died): what arrived is still read, then ECONNRESET; writes
// fail with ECONNRESET.
func TestRingConnPeerVanished(t *testing.T) {
	checkGoroutines(t)
	a, b, _, lb := ringPipe(t, MinRingSize)
	if _, err := b.Write([]byte("before the crash")); err != nil {
		t.Fatal(err)
	}
	waitfor.True(t, "the record to reach a's ring", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.rx.readable()
	})
	lb.close()     // the NIC side of the dead process
	b.side.Close() // the kernel closes its sockets
	buf := make([]byte, 100)
	n, err := a.Read(buf)
	if err != nil || string(buf[:n]) != "before the crash" {
		t.Fatalf("Read: %q, %v", buf[:n], err)
	}
	if _, err := io.ReadAll(a); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("Read after the data: %v, want ECONNRESET", err)
	}
	if _, err := a.Write([]byte("x")); !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("Write: %v, want ECONNRESET", err)
	}
}

// TestRingConnSlowReceiver: with writes arriving before the receiver
// reposts receives (receiver-not-ready), and a sender far ahead of the
// reader, nothing is lost or reordered.
func TestRingConnSlowReceiver(t *testing.T) {
	checkGoroutines(t)
	a, b, la, _ := ringPipe(t, MinRingSize)
	la.f.mu.Lock()
	la.f.recvs = [2]int{2, 2}
	la.f.delay = time.Millisecond
	la.f.mu.Unlock()
	const msgs = 3000
	go func() {
		for i := range msgs {
			if _, err := a.Write([]byte{byte(i), byte(i >> 8), 0xaa}); err != nil {
				t.Error(err)
				return
			}
		}
		a.CloseWrite()
	}()
	got, err := io.ReadAll(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3*msgs {
		t.Fatalf("read %d bytes, want %d", len(got), 3*msgs)
	}
	for i := range msgs {
		if got[3*i] != byte(i) || got[3*i+1] != byte(i>>8) || got[3*i+2] != 0xaa {
			t.Fatalf("message %d: % x", i, got[3*i:3*i+3])
		}
	}
}
