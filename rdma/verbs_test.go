//go:build verbs && cgo && linux

package rdma

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"

	"golang.org/x/net/nettest"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
)

// verbsOrSkip returns the verbs provider, or skips naming what is
// missing: the unit tier runs without an RDMA device; make vmtest runs
// these tests in a guest with Soft-RoCE.
func verbsOrSkip(t *testing.T) *Verbs {
	t.Helper()
	v := NewVerbs(Config{})
	if err := v.Available(); err != nil {
		if !errors.Is(err, ErrNotSupported) {
			t.Fatalf("Available: %v, an error not matching ErrNotSupported", err)
		}
		t.Skipf("no usable RDMA device here (%v); make vmtest runs this test in a QEMU guest with Soft-RoCE", err)
	}
	t.Cleanup(func() {
		if err := v.Close(); err != nil {
			t.Errorf("close provider: %v", err)
		}
	})
	return v
}

// TestVerbsNoDevice: without a device, Available says so with
// ErrNotSupported, naming /sys/class/infiniband.
func TestVerbsNoDevice(t *testing.T) {
	if ents, _ := os.ReadDir(sysInfiniband); len(ents) > 0 {
		t.Skipf("%s has devices: this host is not the no-device case", sysInfiniband)
	}
	err := NewVerbs(Config{}).Available()
	if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), sysInfiniband) {
		t.Fatalf("Available: %v", err)
	}
}

// TestVerbsNettest: nettest.TestConn over real queue pairs (loopback
// through the device).
func TestVerbsNettest(t *testing.T) {
	v := verbsOrSkip(t)
	checkGoroutines(t)
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) { return providerPipe(v) })
}

// TestVerbsSemantics: the same semantics checks as the other providers.
func TestVerbsSemantics(t *testing.T) {
	v := verbsOrSkip(t)
	testSemantics(t, func(t *testing.T) (Conn, Conn) {
		a, b, stop, err := providerPipe(v)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
		return a.(Conn), b.(Conn)
	})
}

// TestVerbsHandshake: dials that cannot work fail with
// ErrProviderMismatch on real queue pairs — to a TCP-provider listener,
// and between rings of different sizes — and leave no device reference
// behind: afterwards a connection works and only the provider's own
// reference remains.
func TestVerbsHandshake(t *testing.T) {
	v := verbsOrSkip(t)
	checkGoroutines(t)
	ctx := context.Background()

	tcpLn, err := NewTCP(Config{}).Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcpLn.Close()
	if _, err := v.Dial(ctx, tcpLn.Addr().String()); !errors.Is(err, ErrProviderMismatch) {
		t.Errorf("verbs dial to a tcp listener: %v, want ErrProviderMismatch", err)
	}

	small := NewVerbs(Config{RingSize: MinRingSize})
	defer small.Close()
	ln, err := v.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := small.Dial(ctx, ln.Addr().String()); !errors.Is(err, ErrProviderMismatch) {
		t.Errorf("dial with a %d-byte ring to a %d-byte one: %v, want ErrProviderMismatch", MinRingSize, DefaultRingSize, err)
	}

	a, b, stop, err := providerPipe(v)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write([]byte("still works")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 11)
	if _, err := io.ReadFull(b, buf); err != nil || string(buf) != "still works" {
		t.Fatalf("read %q, %v", buf, err)
	}
	stop()
	ln.Close()
	waitfor.True(t, "the device's references to drop to the provider's 1", func() bool {
		v.dev.mu.Lock()
		defer v.dev.mu.Unlock()
		return v.dev.refs == 1
	})
}
