package vfio

import (
	"fmt"
	"math"
)

// ReadRegion reads len(p) bytes at off of the region info describes (as
// RegionInfo returned it) through the device file, without mapping it: the
// way to reach a BAR that is not mmap-able, for instance one smaller than a
// page that does not start on a page boundary. vfio-pci turns a naturally
// aligned read of 1, 2, 4 or 8 bytes of an MMIO BAR into one device access
// of that width. Every call is a system call; map what can be mapped.
func (d *Device) ReadRegion(info RegionInfo, off int64, p []byte) error {
	if err := checkRegionAccess(info, RegionRead, off, len(p)); err != nil {
		return fmt.Errorf("read region %d at %#x: %w", info.Index, off, err)
	}
	if _, err := d.file.f.ReadAt(p, int64(info.Offset)+off); err != nil {
		return fmt.Errorf("read region %d at %#x: %w", info.Index, off, err)
	}
	return nil
}

// WriteRegion writes p at off of the region info describes through the
// device file; see ReadRegion.
func (d *Device) WriteRegion(info RegionInfo, off int64, p []byte) error {
	if err := checkRegionAccess(info, RegionWrite, off, len(p)); err != nil {
		return fmt.Errorf("write region %d at %#x: %w", info.Index, off, err)
	}
	if _, err := d.file.f.WriteAt(p, int64(info.Offset)+off); err != nil {
		return fmt.Errorf("write region %d at %#x: %w", info.Index, off, err)
	}
	return nil
}

// checkRegionAccess checks that n bytes at off lie inside the region and
// that the region allows the access.
func checkRegionAccess(info RegionInfo, need RegionFlags, off int64, n int) error {
	if info.Flags&need != need {
		return fmt.Errorf("region does not allow the access (flags %#x)", info.Flags)
	}
	if off < 0 || uint64(off) > info.Size || uint64(n) > info.Size-uint64(off) {
		return fmt.Errorf("%d bytes outside the %d-byte region", n, info.Size)
	}
	if info.Size > math.MaxInt64 || info.Offset > math.MaxInt64-info.Size {
		return fmt.Errorf("region at %#x out of range", info.Offset)
	}
	return nil
}
