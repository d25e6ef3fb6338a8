package vfio

import (
	"errors"
	"fmt"
	"math"
	"os"

	"golang.org/x/sys/unix"
)

// Container owns an open /dev/vfio/vfio: one IOMMU context (address space)
// shared by the groups attached to it.
type Container struct {
	file vfioFile
}

// OpenContainer opens /dev/vfio/vfio and checks that the kernel speaks
// VFIO API version 0 and has a type1 IOMMU backend.
func (h Host) OpenContainer() (_ *Container, err error) {
	path := h.dev("vfio", "vfio")
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open container: %w", h.openError(path, err))
	}
	c := &Container{file: vfioFile{f: f}}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	v, err := c.file.ioctlVal(vfioGetApiVersion, 0)
	if err != nil {
		return nil, fmt.Errorf("open container: get api version: %w", err)
	}
	if v != vfioApiVersion {
		return nil, fmt.Errorf("open container: vfio api version %d, want %d: %w", v, vfioApiVersion, ErrNotSupported)
	}
	if _, err := c.iommuType(); err != nil {
		return nil, fmt.Errorf("open container: %w", err)
	}
	return c, nil
}

// iommuType returns the best type1 IOMMU backend the kernel has.
func (c *Container) iommuType() (uintptr, error) {
	for _, t := range []uintptr{vfioType1v2Iommu, vfioType1Iommu} {
		ok, err := c.file.ioctlVal(vfioCheckExtension, t)
		if err != nil {
			return 0, fmt.Errorf("check extension %d: %w", t, err)
		}
		if ok > 0 {
			return t, nil
		}
	}
	return 0, fmt.Errorf("no type1 iommu backend (modprobe vfio_iommu_type1): %w", ErrNotSupported)
}

// SetIOMMU enables the container's IOMMU, type1v2 where the kernel has it,
// else type1. Call it once, after the first group is attached
// (Group.SetContainer) and before MapDMA or Group.OpenDevice.
func (c *Container) SetIOMMU() error {
	t, err := c.iommuType()
	if err == nil {
		_, err = c.file.ioctlVal(vfioSetIommu, t)
	}
	if err != nil {
		return fmt.Errorf("set iommu: %w", err)
	}
	return nil
}

// IOMMUInfo reports the IOMMU's page sizes and valid IOVA ranges. It needs
// SetIOMMU first.
func (c *Container) IOMMUInfo() (IOMMUInfo, error) {
	req := vfioIommuType1Info{Argsz: sizeof[vfioIommuType1Info]()}
	buf, err := c.file.queryInfo(vfioIommuGetInfo, asBytes(&req))
	if err == nil {
		var info IOMMUInfo
		if info, err = parseIOMMUInfo(buf); err == nil {
			return info, nil
		}
	}
	return IOMMUInfo{}, fmt.Errorf("get iommu info: %w", err)
}

// MapDMA makes buf visible to the container's devices at iova, which must
// be page-aligned and, where IOMMUInfo reports ranges, inside one. The
// kernel pins the pages: they count against RLIMIT_MEMLOCK. Unmap before
// closing buf.
func (c *Container) MapDMA(buf *DMABuffer, iova IOVA, flags DMAFlags) error {
	if err := c.mapDMA(buf, iova, flags); err != nil {
		return fmt.Errorf("map dma at iova %#x: %w", uint64(iova), err)
	}
	return nil
}

func (c *Container) mapDMA(buf *DMABuffer, iova IOVA, flags DMAFlags) error {
	if flags == 0 || flags&^(DMARead|DMAWrite) != 0 {
		return fmt.Errorf("invalid flags %#x", uint32(flags))
	}
	if uint64(iova)%uint64(unix.Getpagesize()) != 0 {
		return errors.New("iova not page-aligned")
	}
	vaddr, size, err := buf.span()
	if err != nil {
		return err
	}
	if size-1 > math.MaxUint64-uint64(iova) {
		return fmt.Errorf("%d bytes overflow the iova space", size)
	}
	m := vfioIommuType1DmaMap{
		Argsz: sizeof[vfioIommuType1DmaMap](),
		Flags: uint32(flags),
		Vaddr: vaddr,
		Iova:  uint64(iova),
		Size:  size,
	}
	_, err = c.file.ioctlBuf(vfioIommuMapDma, asBytes(&m))
	if errors.Is(err, unix.ENOMEM) {
		return fmt.Errorf("%w (locked-memory limit? raise RLIMIT_MEMLOCK, ulimit -l)", err)
	}
	return err
}

// UnmapDMA removes the mapping of size bytes at iova made by MapDMA.
func (c *Container) UnmapDMA(iova IOVA, size uint64) error {
	u := vfioIommuType1DmaUnmap{Argsz: sizeof[vfioIommuType1DmaUnmap](), Iova: uint64(iova), Size: size}
	if _, err := c.file.ioctlBuf(vfioIommuUnmapDma, asBytes(&u)); err != nil {
		return fmt.Errorf("unmap dma at iova %#x: %w", uint64(iova), err)
	}
	if u.Size != size { // the kernel reports how much it unmapped
		return fmt.Errorf("unmap dma at iova %#x: unmapped %d of %d bytes", uint64(iova), u.Size, size)
	}
	return nil
}

// Close closes the container. It is idempotent. The IOMMU context lives on
// while a group is still attached; close devices and groups first.
func (c *Container) Close() error { return c.file.close() }
