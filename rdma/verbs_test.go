//go:build verbs && cgo && linux

package rdma

import (
	"errors"
	"net"
	"os"
	"strings"
	"testing"

	"golang.org/x/net/nettest"
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
