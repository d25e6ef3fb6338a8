package vfio

import (
	"bytes"
	"testing"
)

func TestRegionReadWrite(t *testing.T) {
	d, f := newTestDevice(t)
	const bar0Offset = 2 << 12 // where this fake device file keeps BAR 0
	bar0 := RegionInfo{Index: RegionBAR0, Flags: RegionRead | RegionWrite, Size: 256, Offset: bar0Offset}
	if err := d.WriteRegion(bar0, 0xc, []byte{1, 2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 4)
	if _, err := f.ReadAt(got, bar0Offset+0xc); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, []byte{1, 2, 3, 4}) {
		t.Errorf("device file holds % x, want 01 02 03 04", got)
	}
	clear(got)
	if err := d.ReadRegion(bar0, 0xc, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, []byte{1, 2, 3, 4}) {
		t.Errorf("read back % x, want 01 02 03 04", got)
	}

	for _, tt := range []struct {
		off int64
		n   int
	}{{-1, 1}, {0xfd, 4}, {256, 1}, {1 << 62, 1}} {
		if err := d.ReadRegion(bar0, tt.off, make([]byte, tt.n)); err == nil {
			t.Errorf("ReadRegion(%#x, %d bytes) succeeded outside the region", tt.off, tt.n)
		}
		if err := d.WriteRegion(bar0, tt.off, make([]byte, tt.n)); err == nil {
			t.Errorf("WriteRegion(%#x, %d bytes) succeeded outside the region", tt.off, tt.n)
		}
	}
	readOnly := bar0
	readOnly.Flags = RegionRead
	if err := d.WriteRegion(readOnly, 0, make([]byte, 4)); err == nil {
		t.Error("WriteRegion succeeded on a read-only region")
	}
	huge := RegionInfo{Index: RegionBAR2, Flags: RegionRead, Size: 1 << 63, Offset: 1 << 63}
	if err := d.ReadRegion(huge, 0, make([]byte, 4)); err == nil {
		t.Error("ReadRegion succeeded on a region beyond the file's offsets")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := d.ReadRegion(bar0, 0, got); err == nil {
		t.Error("ReadRegion succeeded after Close")
	}
}
