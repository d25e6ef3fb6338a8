package vfio

import (
	"errors"
	"math"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

func TestDMABuffer(t *testing.T) {
	checkNoFDLeak(t)
	page := unix.Getpagesize()
	b, err := NewDMABuffer(page + 1)
	if err != nil {
		t.Fatal(err)
	}
	mem := b.Bytes()
	if len(mem) != 2*page {
		t.Errorf("%d bytes for %d asked, want %d (whole pages)", len(mem), page+1, 2*page)
	}
	for i, c := range mem {
		if c != 0 {
			t.Fatalf("byte %d is %#x, want zeroed memory", i, c)
		}
	}
	mem[len(mem)-1] = 1
	vaddr, size, err := b.span()
	if err != nil || vaddr%uint64(page) != 0 || size != uint64(2*page) {
		t.Errorf("span = %#x, %d, %v; want a page-aligned address and %d bytes", vaddr, size, err, 2*page)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if b.Bytes() != nil {
		t.Error("Bytes after Close is not nil")
	}
	if _, _, err := b.span(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("span after Close: %v, want os.ErrClosed", err)
	}
	for _, size := range []int{0, -1, math.MaxInt} {
		if b, err := NewDMABuffer(size); err == nil {
			b.Close()
			t.Errorf("NewDMABuffer(%d) succeeded", size)
		}
	}
}

// TestContainerDMA checks MapDMA's validation, and that valid calls reach
// the kernel (a regular file answers ENOTTY).
func TestContainerDMA(t *testing.T) {
	c := &Container{file: vfioFile{f: tempFile(t, 0)}}
	page := IOVA(unix.Getpagesize())
	buf, err := NewDMABuffer(int(2 * page))
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Close()
	for _, tt := range []struct {
		name  string
		iova  IOVA
		flags DMAFlags
	}{
		{"no flags", page, 0},
		{"unknown flag", page, DMARead | 1<<2},
		{"unaligned iova", page + 1, DMARead},
		{"iova space overflow", math.MaxUint64 &^ (page - 1), DMARead}, // 2 pages from the last page
	} {
		if err := c.MapDMA(buf, tt.iova, tt.flags); err == nil || errors.Is(err, unix.ENOTTY) {
			t.Errorf("%s: MapDMA = %v, want a validation error", tt.name, err)
		}
	}
	if err := c.MapDMA(buf, page, DMARead|DMAWrite); !errors.Is(err, unix.ENOTTY) {
		t.Errorf("MapDMA = %v, want ENOTTY", err)
	}
	if err := c.UnmapDMA(page, uint64(page)); !errors.Is(err, unix.ENOTTY) {
		t.Errorf("UnmapDMA = %v, want ENOTTY", err)
	}
	if _, err := c.IOMMUInfo(); !errors.Is(err, unix.ENOTTY) {
		t.Errorf("IOMMUInfo = %v, want ENOTTY", err)
	}
	if err := c.SetIOMMU(); !errors.Is(err, unix.ENOTTY) {
		t.Errorf("SetIOMMU = %v, want ENOTTY", err)
	}
	closed, _ := NewDMABuffer(1)
	closed.Close()
	if err := c.MapDMA(closed, page, DMARead); !errors.Is(err, os.ErrClosed) {
		t.Errorf("MapDMA of a closed buffer = %v, want os.ErrClosed", err)
	}
}
