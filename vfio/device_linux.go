package vfio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"

	"golang.org/x/sys/unix"
)

// Device owns an open VFIO device: its regions (BARs, config space),
// interrupts and reset.
type Device struct {
	file   vfioFile
	config RegionInfo // the PCI config space region, read at open
}

// PCI config space: the command register and its Bus Master Enable bit.
const (
	pciCommand          = 0x04
	pciCommandBusMaster = 1 << 2
)

// Info reports the device's flags and how many regions and IRQ indexes it
// has.
func (d *Device) Info() (DeviceInfo, error) {
	i := vfioDeviceInfo{Argsz: sizeof[vfioDeviceInfo]()}
	if _, err := d.file.ioctlBuf(vfioDeviceGetInfo, asBytes(&i)); err != nil {
		return DeviceInfo{}, fmt.Errorf("get device info: %w", err)
	}
	return DeviceInfo{Flags: DeviceFlags(i.Flags), NumRegions: i.NumRegions, NumIRQs: i.NumIrqs}, nil
}

// RegionInfo describes region index, with its capabilities.
func (d *Device) RegionInfo(index RegionIndex) (RegionInfo, error) {
	req := vfioRegionInfo{Argsz: sizeof[vfioRegionInfo](), Index: uint32(index)}
	buf, err := d.file.queryInfo(vfioDeviceGetRegionInfo, asBytes(&req))
	if err == nil {
		var info RegionInfo
		if info, err = parseRegionInfo(buf); err == nil {
			return info, nil
		}
	}
	return RegionInfo{}, fmt.Errorf("get region info %d: %w", index, err)
}

// MapRegion mmaps the whole of region index, readable and writable as the
// region allows. It fails for a region that is empty, not mmap-able, or
// mmap-able only in sparse areas that do not cover it.
func (d *Device) MapRegion(index RegionIndex) (*Mapping, error) {
	info, err := d.RegionInfo(index)
	if err != nil {
		return nil, fmt.Errorf("map region %d: %w", index, err)
	}
	return d.mapRegion(info)
}

// MapBAR maps BAR bar (0-5); see MapRegion.
func (d *Device) MapBAR(bar int) (*Mapping, error) {
	if bar < 0 || bar > 5 {
		return nil, fmt.Errorf("map bar %d: no such bar", bar)
	}
	return d.MapRegion(RegionBAR0 + RegionIndex(bar))
}

func (d *Device) mapRegion(info RegionInfo) (*Mapping, error) {
	if err := checkMappable(info); err != nil {
		return nil, fmt.Errorf("map region %d: %w", info.Index, err)
	}
	if info.Size > math.MaxInt || info.Offset > math.MaxInt64 {
		return nil, fmt.Errorf("map region %d: %#x bytes at %#x out of range", info.Index, info.Size, info.Offset)
	}
	var prot int
	if info.Flags&RegionRead != 0 {
		prot |= unix.PROT_READ
	}
	if info.Flags&RegionWrite != 0 {
		prot |= unix.PROT_WRITE
	}
	var b []byte
	err := d.file.control(func(fd uintptr) (err error) {
		b, err = unix.Mmap(int(fd), int64(info.Offset), int(info.Size), prot, unix.MAP_SHARED)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("map region %d: mmap: %w", info.Index, err)
	}
	return &Mapping{b: b}, nil
}

// checkMappable reports why a region cannot be mmap'd whole, if it cannot.
func checkMappable(info RegionInfo) error {
	switch {
	case info.Size == 0:
		return fmt.Errorf("region is empty: %w", ErrMissingBAR)
	case info.Flags&RegionMmap == 0:
		return fmt.Errorf("region is not mmap-able (I/O port BAR?): %w", ErrMissingBAR)
	case info.SparseAreas != nil && !slices.Contains(info.SparseAreas, SparseArea{Size: info.Size}):
		return fmt.Errorf("region is mmap-able only in %d sparse areas: %w", len(info.SparseAreas), ErrMissingBAR)
	}
	return nil
}

// RequireBARs checks that each BAR in minSizes (BAR number → minimum size
// in bytes) exists, can be mmap'd whole and is big enough. It reports every
// BAR that fails, each wrapping ErrMissingBAR.
func (d *Device) RequireBARs(minSizes map[int]uint64) error {
	return requireBARs(d.RegionInfo, minSizes)
}

func requireBARs(regionInfo func(RegionIndex) (RegionInfo, error), minSizes map[int]uint64) error {
	var errs []error
	for _, bar := range slices.Sorted(maps.Keys(minSizes)) {
		if bar < 0 || bar > 5 {
			errs = append(errs, fmt.Errorf("bar %d: no such bar: %w", bar, ErrMissingBAR))
			continue
		}
		info, err := regionInfo(RegionBAR0 + RegionIndex(bar))
		if err == nil {
			err = checkMappable(info)
		}
		if err == nil && info.Size < minSizes[bar] {
			err = fmt.Errorf("%d bytes, need %d: %w", info.Size, minSizes[bar], ErrMissingBAR)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("bar %d: %w", bar, err))
		}
	}
	return errors.Join(errs...)
}

// ReadConfig reads len(p) bytes of PCI config space at off.
func (d *Device) ReadConfig(off int64, p []byte) error {
	if err := d.checkConfig(off, len(p)); err != nil {
		return fmt.Errorf("read config at %#x: %w", off, err)
	}
	if _, err := d.file.f.ReadAt(p, int64(d.config.Offset)+off); err != nil {
		return fmt.Errorf("read config at %#x: %w", off, err)
	}
	return nil
}

// WriteConfig writes p to PCI config space at off. The kernel filters
// config writes: it virtualises some registers and ignores writes to
// others.
func (d *Device) WriteConfig(off int64, p []byte) error {
	if err := d.checkConfig(off, len(p)); err != nil {
		return fmt.Errorf("write config at %#x: %w", off, err)
	}
	if _, err := d.file.f.WriteAt(p, int64(d.config.Offset)+off); err != nil {
		return fmt.Errorf("write config at %#x: %w", off, err)
	}
	return nil
}

func (d *Device) checkConfig(off int64, n int) error {
	if off < 0 || uint64(off) > d.config.Size || uint64(n) > d.config.Size-uint64(off) {
		return fmt.Errorf("%d bytes outside the %d-byte config space", n, d.config.Size)
	}
	if d.config.Size > math.MaxInt64 || d.config.Offset > math.MaxInt64-d.config.Size {
		return fmt.Errorf("config region at %#x out of range", d.config.Offset)
	}
	return nil
}

// SetBusMaster sets or clears Bus Master Enable in the PCI command
// register. A device may not issue DMA, and so may not deliver MSI or
// MSI-X (which are DMA writes), without it: with it clear, MSI-X vectors
// are dropped silently.
func (d *Device) SetBusMaster(on bool) error {
	var b [2]byte
	if err := d.ReadConfig(pciCommand, b[:]); err != nil {
		return fmt.Errorf("set bus master: %w", err)
	}
	cmd := binary.LittleEndian.Uint16(b[:]) // config space is little-endian
	if on {
		cmd |= pciCommandBusMaster
	} else {
		cmd &^= pciCommandBusMaster
	}
	binary.LittleEndian.PutUint16(b[:], cmd)
	if err := d.WriteConfig(pciCommand, b[:]); err != nil {
		return fmt.Errorf("set bus master: %w", err)
	}
	return nil
}

// IRQInfo describes interrupt index index.
func (d *Device) IRQInfo(index IRQIndex) (IRQInfo, error) {
	i := vfioIrqInfo{Argsz: sizeof[vfioIrqInfo](), Index: uint32(index)}
	if _, err := d.file.ioctlBuf(vfioDeviceGetIrqInfo, asBytes(&i)); err != nil {
		return IRQInfo{}, fmt.Errorf("get irq info %d: %w", index, err)
	}
	return IRQInfo{Index: IRQIndex(i.Index), Flags: IRQFlags(i.Flags), Count: i.Count}, nil
}

// SetIRQEventfds routes vectors start, start+1, ... of interrupt index
// index to the eventfds fds; -1 detaches a vector. Setting the first
// eventfd enables the index (for MSI-X: the device's MSI-X capability).
// The kernel holds its own reference to each eventfd until the vector is
// detached or the device closed.
func (d *Device) SetIRQEventfds(index IRQIndex, start int, fds []int) error {
	buf, err := irqSet(vfioIrqSetDataEventfd|vfioIrqSetActionTrigger, index, start, len(fds), fds)
	if err == nil {
		_, err = d.file.ioctlBuf(vfioDeviceSetIrqs, buf)
	}
	if err != nil {
		return fmt.Errorf("set irq %d eventfds: %w", index, err)
	}
	return nil
}

// DisableIRQs disables interrupt index index, detaching all its eventfds.
func (d *Device) DisableIRQs(index IRQIndex) error {
	return d.setIRQs("disable irq", vfioIrqSetDataNone|vfioIrqSetActionTrigger, index, 0, 0)
}

// MaskIRQ masks vector sub of interrupt index index (INTx, or any index
// IRQInfo reports IRQMaskable).
func (d *Device) MaskIRQ(index IRQIndex, sub int) error {
	return d.setIRQs("mask irq", vfioIrqSetDataNone|vfioIrqSetActionMask, index, sub, 1)
}

// UnmaskIRQ unmasks vector sub of interrupt index index; for an
// IRQAutomasked index (INTx) it re-arms the line after each interrupt.
func (d *Device) UnmaskIRQ(index IRQIndex, sub int) error {
	return d.setIRQs("unmask irq", vfioIrqSetDataNone|vfioIrqSetActionUnmask, index, sub, 1)
}

// setIRQs issues a DATA_NONE VFIO_DEVICE_SET_IRQS for count vectors.
func (d *Device) setIRQs(op string, flags uint32, index IRQIndex, start, count int) error {
	buf, err := irqSet(flags, index, start, count, nil)
	if err == nil {
		_, err = d.file.ioctlBuf(vfioDeviceSetIrqs, buf)
	}
	if err != nil {
		return fmt.Errorf("%s %d/%d: %w", op, index, start, err)
	}
	return nil
}

// irqSet encodes a vfio_irq_set for count vectors from start. With
// DATA_EVENTFD the count eventfds follow the struct as __s32; with
// DATA_NONE nothing follows.
func irqSet(flags uint32, index IRQIndex, start, count int, eventfds []int) ([]byte, error) {
	if start < 0 || count < 0 || uint64(start)+uint64(count) > math.MaxUint32 {
		return nil, fmt.Errorf("vectors [%d, +%d) out of range", start, count)
	}
	s := vfioIrqSet{Flags: flags, Index: uint32(index), Start: uint32(start), Count: uint32(count)}
	buf := slices.Clone(asBytes(&s))
	if flags&vfioIrqSetDataEventfd != 0 {
		if count == 0 || len(eventfds) != count {
			return nil, fmt.Errorf("%d eventfds for %d vectors", len(eventfds), count)
		}
		for _, fd := range eventfds {
			if fd < -1 || fd > math.MaxInt32 {
				return nil, fmt.Errorf("invalid eventfd %d", fd)
			}
			buf = binary.NativeEndian.AppendUint32(buf, uint32(int32(fd)))
		}
	}
	binary.NativeEndian.PutUint32(buf[argszOffset:], uint32(len(buf)))
	return buf, nil
}

// Reset resets the device (function-level or similar reset), if
// DeviceInfo reports DeviceReset.
func (d *Device) Reset() error {
	if _, err := d.file.ioctlVal(vfioDeviceReset, 0); err != nil {
		return fmt.Errorf("reset device: %w", err)
	}
	return nil
}

// Close closes the device. It is idempotent. The kernel releases the
// device, disabling its interrupts and dropping its references to their
// eventfds, once every Mapping of its regions is closed too: a Mapping
// keeps the device open, and stays usable, until its own Close.
func (d *Device) Close() error { return d.file.close() }
