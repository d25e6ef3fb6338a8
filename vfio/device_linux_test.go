package vfio

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

const testConfigOffset = 7 << 12 // where the fake device file keeps config space

// newTestDevice returns a Device over a regular file with a 256-byte config
// space at testConfigOffset: config access and mmap work, ioctls fail with
// ENOTTY.
func newTestDevice(t *testing.T) (*Device, *os.File) {
	t.Helper()
	f := tempFile(t, 16<<12)
	d := &Device{
		file:   vfioFile{f: f},
		config: RegionInfo{Index: RegionConfig, Flags: RegionRead | RegionWrite, Size: 256, Offset: testConfigOffset},
	}
	return d, f
}

func TestConfigSpace(t *testing.T) {
	d, f := newTestDevice(t)
	// PCI_COMMAND = I/O space | memory space, bus master clear.
	if _, err := f.WriteAt([]byte{0x03, 0x00}, testConfigOffset+pciCommand); err != nil {
		t.Fatal(err)
	}
	command := func() uint16 {
		var b [2]byte
		if _, err := f.ReadAt(b[:], testConfigOffset+pciCommand); err != nil {
			t.Fatal(err)
		}
		return binary.LittleEndian.Uint16(b[:])
	}
	if err := d.SetBusMaster(true); err != nil {
		t.Fatal(err)
	}
	if got := command(); got != 0x0007 {
		t.Errorf("command after SetBusMaster(true) = %#04x, want 0x0007", got)
	}
	if err := d.SetBusMaster(false); err != nil {
		t.Fatal(err)
	}
	if got := command(); got != 0x0003 {
		t.Errorf("command after SetBusMaster(false) = %#04x, want 0x0003", got)
	}

	if err := d.WriteConfig(0xfc, []byte{1, 2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	if err := d.ReadConfig(0xfc, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, []byte{1, 2, 3, 4}) {
		t.Errorf("read back % x, want 01 02 03 04", got)
	}

	for _, tt := range []struct {
		off int64
		n   int
	}{{-1, 1}, {0xfd, 4}, {256, 1}, {1 << 62, 1}} {
		if err := d.ReadConfig(tt.off, make([]byte, tt.n)); err == nil {
			t.Errorf("ReadConfig(%#x, %d bytes) succeeded outside config space", tt.off, tt.n)
		}
		if err := d.WriteConfig(tt.off, make([]byte, tt.n)); err == nil {
			t.Errorf("WriteConfig(%#x, %d bytes) succeeded outside config space", tt.off, tt.n)
		}
	}
}

func TestMapRegion(t *testing.T) {
	d, f := newTestDevice(t)
	page := uint64(unix.Getpagesize())
	if _, err := f.WriteAt([]byte("bar2"), int64(2*page)); err != nil {
		t.Fatal(err)
	}
	rw := RegionRead | RegionWrite | RegionMmap
	m, err := d.mapRegion(RegionInfo{Index: RegionBAR2, Flags: rw, Size: 2 * page, Offset: 2 * page})
	if err != nil {
		t.Fatal(err)
	}
	b := m.Bytes()
	if uint64(len(b)) != 2*page || string(b[:4]) != "bar2" {
		t.Fatalf("mapping holds %d bytes starting %q, want %d starting \"bar2\"", len(b), b[:4], 2*page)
	}
	copy(b[page:], "written")
	got := make([]byte, 7)
	if _, err := f.ReadAt(got, int64(3*page)); err != nil || string(got) != "written" {
		t.Errorf("file holds %q, %v after a write through the mapping", got, err)
	}
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if m.Bytes() != nil {
		t.Error("Bytes after Close is not nil")
	}

	whole := []SparseArea{{Offset: 0, Size: page}}
	if m, err := d.mapRegion(RegionInfo{Flags: rw, Size: page, SparseAreas: whole}); err != nil {
		t.Errorf("region covered by one sparse area: %v", err)
	} else {
		m.Close()
	}
	for name, info := range map[string]RegionInfo{
		"empty":        {Flags: rw},
		"not mmap":     {Flags: RegionRead | RegionWrite, Size: page},
		"sparse":       {Flags: rw, Size: 2 * page, SparseAreas: whole},
		"sparse, none": {Flags: rw, Size: page, SparseAreas: []SparseArea{}},
	} {
		if m, err := d.mapRegion(info); !errors.Is(err, ErrMissingBAR) {
			t.Errorf("%s region: mapRegion = %v, %v; want ErrMissingBAR", name, m, err)
		}
	}
	if _, err := d.MapBAR(6); err == nil {
		t.Error("MapBAR(6) succeeded")
	}
}

func TestRequireBARs(t *testing.T) {
	rw := RegionRead | RegionWrite | RegionMmap
	regions := map[RegionIndex]RegionInfo{
		RegionBAR0: {Flags: rw, Size: 0x1000},
		RegionBAR1: {Flags: rw, Size: 0x1000},
		RegionBAR2: {Flags: rw, Size: 1 << 20},
		RegionBAR4: {Flags: RegionRead | RegionWrite, Size: 0x100}, // I/O port BAR
	}
	regionInfo := func(i RegionIndex) (RegionInfo, error) {
		if i == RegionBAR5 {
			return RegionInfo{}, unix.EIO
		}
		return regions[i], nil
	}
	if err := requireBARs(regionInfo, map[int]uint64{0: 0x1000, 2: 1 << 20}); err != nil {
		t.Errorf("BARs present: %v", err)
	}
	err := requireBARs(regionInfo, map[int]uint64{0: 0x1000, 1: 0x2000, 2: 1, 3: 1, 4: 1, 7: 1})
	if !errors.Is(err, ErrMissingBAR) {
		t.Fatalf("err = %v, want ErrMissingBAR", err)
	}
	for _, want := range []string{"bar 1: 4096 bytes, need 8192", "bar 3: region is empty", "bar 4: region is not mmap-able", "bar 7: no such bar"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "bar 0") || strings.Contains(err.Error(), "bar 2") {
		t.Errorf("error %q blames a good BAR", err)
	}
	if err := requireBARs(regionInfo, map[int]uint64{5: 1}); !errors.Is(err, unix.EIO) || errors.Is(err, ErrMissingBAR) {
		t.Errorf("failing region info: err = %v, want EIO only", err)
	}
}

func TestIRQSetEncoding(t *testing.T) {
	buf, err := irqSet(vfioIrqSetDataEventfd|vfioIrqSetActionTrigger, IRQMSIX, 2, 3, []int{5, -1, 7})
	if err != nil {
		t.Fatal(err)
	}
	var s vfioIrqSet
	decodeAt(buf, 0, &s)
	want := vfioIrqSet{Argsz: 32, Flags: vfioIrqSetDataEventfd | vfioIrqSetActionTrigger, Index: 2, Start: 2, Count: 3}
	if s != want {
		t.Errorf("header %+v, want %+v", s, want)
	}
	var fds [3]int32
	decodeAt(buf, 20, &fds)
	if len(buf) != 32 || fds != [3]int32{5, -1, 7} {
		t.Errorf("%d bytes, eventfds %v; want 32 bytes, [5 -1 7]", len(buf), fds)
	}

	buf, err = irqSet(vfioIrqSetDataNone|vfioIrqSetActionTrigger, IRQMSIX, 0, 0, nil)
	decodeAt(buf, 0, &s)
	if err != nil || len(buf) != 20 || s.Argsz != 20 || s.Count != 0 {
		t.Errorf("disable: %d bytes %+v, %v; want a bare 20-byte struct", len(buf), s, err)
	}

	d, _ := newTestDevice(t)
	invalid := map[string][]int{"no eventfds": nil, "fd below -1": {-2}}
	if math.MaxInt > math.MaxInt32 {
		invalid["fd beyond int32"] = []int{math.MaxInt}
	}
	for name, fds := range invalid {
		if err := d.SetIRQEventfds(IRQMSIX, 0, fds); err == nil || errors.Is(err, unix.ENOTTY) {
			t.Errorf("%s: SetIRQEventfds = %v, want a validation error", name, err)
		}
	}
	if err := d.MaskIRQ(IRQIntx, -1); err == nil || errors.Is(err, unix.ENOTTY) {
		t.Errorf("MaskIRQ(-1) = %v, want a validation error", err)
	}
}

// TestDeviceIoctls checks that operations reach the kernel through the
// gateway (a regular file answers ENOTTY) and fail cleanly after Close.
func TestDeviceIoctls(t *testing.T) {
	d, _ := newTestDevice(t)
	ops := map[string]func() error{
		"Info":           func() error { _, err := d.Info(); return err },
		"RegionInfo":     func() error { _, err := d.RegionInfo(RegionBAR0); return err },
		"MapBAR":         func() error { _, err := d.MapBAR(0); return err },
		"IRQInfo":        func() error { _, err := d.IRQInfo(IRQMSIX); return err },
		"SetIRQEventfds": func() error { return d.SetIRQEventfds(IRQMSIX, 0, []int{-1}) },
		"DisableIRQs":    func() error { return d.DisableIRQs(IRQMSIX) },
		"MaskIRQ":        func() error { return d.MaskIRQ(IRQIntx, 0) },
		"UnmaskIRQ":      func() error { return d.UnmaskIRQ(IRQIntx, 0) },
		"Reset":          d.Reset,
	}
	for name, op := range ops {
		if err := op(); !errors.Is(err, unix.ENOTTY) {
			t.Errorf("%s = %v, want ENOTTY", name, err)
		}
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	for name, op := range ops {
		if err := op(); !errors.Is(err, os.ErrClosed) {
			t.Errorf("%s after Close = %v, want os.ErrClosed", name, err)
		}
	}
	if err := d.ReadConfig(0, make([]byte, 2)); !errors.Is(err, os.ErrClosed) {
		t.Errorf("ReadConfig after Close = %v, want os.ErrClosed", err)
	}
}
