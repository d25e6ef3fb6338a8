package ivshmem

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/vfio"
)

// The PCI port's own logic runs here on heap memory standing in for BAR0
// and BAR2 and real eventfds standing in for MSI-X vectors; the ioctls and
// the device itself run in the VM tier (test/vm, make vmtest).

// fakePCISysfs builds a sysfs tree with the given devices (address →
// "vendor device") and returns its Host.
func fakePCISysfs(t *testing.T, devices map[string][2]string) vfio.Host {
	t.Helper()
	root := t.TempDir()
	for addr, ids := range devices {
		dir := filepath.Join(root, "bus", "pci", "devices", addr)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, name := range []string{"vendor", "device"} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(ids[i]+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "bus", "pci", "devices"), 0o755); err != nil {
		t.Fatal(err)
	}
	return vfio.Host{SysfsRoot: root, DevRoot: filepath.Join(root, "dev")}
}

func TestFindPCI(t *testing.T) {
	h := fakePCISysfs(t, map[string][2]string{
		"0000:00:03.0": {"0x1af4", "0x1110"},
		"0000:00:01.0": {"0x1234", "0x1111"}, // VGA
		"0000:00:02.0": {"0x1af4", "0x1110"},
		"0000:00:04.0": {"0x1af4", "0x1000"}, // virtio-net
	})
	got, err := FindPCI(h)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"0000:00:02.0", "0000:00:03.0"}; !slices.Equal(got, want) {
		t.Errorf("FindPCI = %v, want %v", got, want)
	}

	bad := fakePCISysfs(t, map[string][2]string{"0000:00:02.0": {"0x1af4", "garbage"}})
	if _, err := FindPCI(bad); err == nil {
		t.Error("FindPCI accepted an unparsable device id")
	}
	if _, err := FindPCI(vfio.Host{SysfsRoot: filepath.Join(t.TempDir(), "none")}); err == nil {
		t.Error("FindPCI succeeded without a sysfs tree")
	}
}

func TestOpenPCIErrors(t *testing.T) {
	none := fakePCISysfs(t, nil)
	if _, err := OpenPCI(PCIConfig{Host: none}); !errors.Is(err, vfio.ErrNoSuchDevice) {
		t.Errorf("OpenPCI with no ivshmem device: %v, want ErrNoSuchDevice", err)
	}
	two := fakePCISysfs(t, map[string][2]string{
		"0000:00:02.0": {"0x1af4", "0x1110"},
		"0000:00:03.0": {"0x1af4", "0x1110"},
	})
	if _, err := OpenPCI(PCIConfig{Host: two}); !errors.Is(err, vfio.ErrNoSuchDevice) {
		t.Errorf("OpenPCI with two ivshmem devices and no address: %v, want ErrNoSuchDevice", err)
	}
	// The device exists but has no iommu_group link: no IOMMU.
	if _, err := OpenPCI(PCIConfig{Host: two, Addr: "0000:00:02.0"}); !errors.Is(err, vfio.ErrNoIOMMU) {
		t.Errorf("OpenPCI without an IOMMU: %v, want ErrNoIOMMU", err)
	}
	if _, err := OpenPCI(PCIConfig{Host: two, Addr: "0000:00:09.0"}); !errors.Is(err, vfio.ErrNoSuchDevice) {
		t.Errorf("OpenPCI of a missing device: %v, want ErrNoSuchDevice", err)
	}
}

// fakePCIPort is a PCIPort over heap registers with IVPosition id, and
// real eventfds.
type fakePCIPort struct {
	*PCIPort
	regs     []byte
	evs      []*vfio.Eventfd
	released int
}

func newFakePCIPort(t *testing.T, id int32, vectors int) *fakePCIPort {
	t.Helper()
	f := &fakePCIPort{regs: make([]byte, 256)}
	binary.LittleEndian.PutUint32(f.regs[regIVPosition:], uint32(id))
	binary.LittleEndian.PutUint32(f.regs[regIntrMask:], 0xffffffff)
	for range vectors {
		ev, err := vfio.NewEventfd()
		if err != nil {
			t.Fatal(err)
		}
		f.evs = append(f.evs, ev)
	}
	release := func() error {
		f.released++
		var errs []error
		for _, ev := range f.evs {
			errs = append(errs, ev.Close())
		}
		return errors.Join(errs...)
	}
	p, err := newPCIPort("0000:00:02.0", mappedRegs(f.regs), make([]byte, 4096), f.evs, release)
	if err != nil {
		release()
		t.Fatal(err)
	}
	f.PCIPort = p
	t.Cleanup(func() { p.Close() })
	return f
}

// interrupt plays the kernel signalling vector's eventfd.
func (f *fakePCIPort) interrupt(t *testing.T, vector int) {
	t.Helper()
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1)
	if _, err := unix.Write(f.evs[vector].FD(), one[:]); err != nil {
		t.Fatal(err)
	}
}

func TestPCIPortRegisters(t *testing.T) {
	f := newFakePCIPort(t, 5, 3)
	if f.ID() != 5 || f.Vectors() != 3 || len(f.Mem()) != 4096 || f.Addr() != "0000:00:02.0" {
		t.Errorf("id %d, vectors %d, mem %d bytes, addr %s", f.ID(), f.Vectors(), len(f.Mem()), f.Addr())
	}
	if got := binary.LittleEndian.Uint32(f.regs[regIntrMask:]); got != 0 {
		t.Errorf("IntrMask = %#x after open, want 0 (INTx off)", got)
	}
	for _, tc := range []struct{ peer, vector int }{{0, 0}, {1, 2}, {5, 1}, {MaxPeers - 1, 2}} {
		if err := f.Ring(tc.peer, tc.vector); err != nil {
			t.Fatal(err)
		}
		want := uint32(tc.peer)<<16 | uint32(tc.vector)
		if got := binary.LittleEndian.Uint32(f.regs[regDoorbell:]); got != want {
			t.Errorf("Ring(%d, %d) wrote %#08x, want %#08x", tc.peer, tc.vector, got, want)
		}
	}
	for _, tc := range []struct{ peer, vector int }{{-1, 0}, {MaxPeers, 0}, {0, -1}, {0, 3}} {
		if err := f.Ring(tc.peer, tc.vector); err == nil {
			t.Errorf("Ring(%d, %d) succeeded", tc.peer, tc.vector)
		}
	}
}

func TestPCIPortNoPeerID(t *testing.T) {
	regs := make([]byte, 256)
	binary.LittleEndian.PutUint32(regs[regIVPosition:], 0xffffffff) // QEMU before the server answered
	if _, err := newPCIPort("0000:00:02.0", mappedRegs(regs), nil, nil, nil); err == nil {
		t.Error("newPCIPort accepted IVPosition -1")
	}
}

func TestPCIPortWait(t *testing.T) {
	f := newFakePCIPort(t, 0, 2)
	ctx, cancel := context.WithTimeout(t.Context(), testTimeout)
	defer cancel()

	woke := make(chan error, 1)
	go func() { woke <- f.Wait(ctx, 1) }()
	waitfor.Blocked(t, "ivshmem.(*PCIPort).Wait")
	select {
	case err := <-woke:
		t.Fatalf("Wait returned before any interrupt: %v", err)
	default:
	}
	f.interrupt(t, 1)
	if err := <-woke; err != nil {
		t.Fatal(err)
	}

	// Interrupts before Wait are kept; several are consumed by one Wait.
	f.interrupt(t, 0)
	f.interrupt(t, 0)
	if err := f.Wait(ctx, 0); err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancelShort()
	if err := f.Wait(short, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with nothing pending: %v, want the context's error", err)
	}
	// The expired context's deadline does not leak into the next Wait.
	f.interrupt(t, 0)
	if err := f.Wait(ctx, 0); err != nil {
		t.Fatalf("Wait after an expired one: %v", err)
	}
	if err := f.Wait(ctx, 2); err == nil {
		t.Error("Wait on vector 2 of 2 succeeded")
	}
}

func TestPCIPortClose(t *testing.T) {
	f := newFakePCIPort(t, 1, 1)
	woke := make(chan error, 1)
	go func() { woke <- f.Wait(context.Background(), 0) }()
	waitfor.Blocked(t, "ivshmem.(*PCIPort).Wait") // Close must wake a Wait already asleep
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-woke:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("Wait across Close: %v, want net.ErrClosed", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Close did not wake Wait")
	}
	if err := f.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if f.released != 1 {
		t.Errorf("released %d times, want once", f.released)
	}
	if err := f.Ring(0, 0); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Ring after Close: %v, want net.ErrClosed", err)
	}
	if err := f.Wait(context.Background(), 0); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Wait after Close: %v, want net.ErrClosed", err)
	}
}
