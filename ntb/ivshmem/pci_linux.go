package ivshmem

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/vfio"
)

// QEMU's ivshmem-doorbell PCI device (docs/specs/ivshmem-spec.rst) as a
// driver inside the guest sees it, driven through VFIO:
//
//	BAR0  256 bytes of registers, 32-bit accesses only
//	      0x0  IntrMask    r/w  INTx only: interrupt mask (bit 0)
//	      0x4  IntrStatus  r/w  INTx only: pending interrupt (bit 0)
//	      0x8  IVPosition  ro   this device's peer id (negative: none yet)
//	      0xC  Doorbell    wo   (peer id << 16) | vector rings that peer
//	BAR1  MSI-X table and PBA: one vector per doorbell vector; a ring of
//	      vector v on this peer raises MSI-X vector v
//	BAR2  the shared memory, the server's shared-memory file
//
// The device writes nothing into BAR2; which side writes which word there
// is up to the layers above (see the Device backend). With MSI-X enabled
// IntrMask and IntrStatus are unused; OpenPCI clears IntrMask so that the
// legacy line stays quiet either way. MSI-X messages are DMA writes: the
// device drops them, silently, until Bus Master Enable is set.
const (
	// PCIVendorID and PCIDeviceID identify ivshmem devices (the Red Hat /
	// Qumranet vendor id); ivshmem-plain has the same ids but no BAR1 and
	// no doorbell.
	PCIVendorID = 0x1af4
	PCIDeviceID = 0x1110

	regIntrMask   = 0x0
	regIntrStatus = 0x4
	regIVPosition = 0x8
	regDoorbell   = 0xc
	regBlockSize  = 0x10 // the registers above; BAR0 is at least this big

	barRegs = 0 // BAR0: registers
	barMem  = 2 // BAR2: shared memory

	doorbellPeerShift = 16
	doorbellVectorMax = 1<<doorbellPeerShift - 1

	pciVendorOffset = 0x0 // config space: vendor id, then device id
)

// PCIConfig says which ivshmem device OpenPCI opens and how.
type PCIConfig struct {
	// Host names the sysfs and /dev trees; the zero Host is the running
	// system.
	Host vfio.Host
	// Addr is the device's PCI address ("0000:00:02.0"). Empty: the one
	// ivshmem device FindPCI reports; several are an error.
	Addr string
	// Vectors is how many doorbell vectors to route to eventfds, from
	// vector 0; 0 means every vector the device has (its MSI-X count,
	// QEMU's vectors= property).
	Vectors int
	// Bind binds the device to vfio-pci first if it is not bound yet
	// (driver_override and a probe; needs root).
	Bind bool
}

// PCIPort is an ivshmem-doorbell PCI device opened through VFIO: a Port
// whose shared memory is BAR2, whose doorbell is the Doorbell register and
// whose interrupts arrive as MSI-X vectors on eventfds.
//
// Ring and Wait may be called concurrently with each other and with Close;
// Mem's slice is valid until Close, and the caller must stop touching it
// before calling Close.
type PCIPort struct {
	addr    string
	id      int
	mem     []byte
	regs    registers
	evs     []*vfio.Eventfd // one per vector, the kernel signals them
	release func() error    // undoes OpenPCI: IRQs, eventfds, BARs, device, group, container

	closeOnce sync.Once
	closeErr  error

	// mu protects the following fields. Ring holds it shared so that Close
	// cannot unmap the registers under a doorbell write.
	mu     sync.RWMutex
	closed bool
}

var _ Port = (*PCIPort)(nil)

// registers is BAR0: mapped, or reached through the device file where the
// BAR cannot be mapped.
type registers interface {
	load32(off int) (uint32, error)
	store32(off int, v uint32) error
}

// mappedRegs is BAR0 mmap'd.
type mappedRegs []byte

func (r mappedRegs) load32(off int) (uint32, error)  { return mmioLoad32(r, off), nil }
func (r mappedRegs) store32(off int, v uint32) error { mmioStore32(r, off, v); return nil }

// fileRegs is BAR0 reached with pread and pwrite on the device: vfio-pci
// cannot mmap a BAR smaller than a page that does not start on a page
// boundary, which firmware is free to arrange.
type fileRegs struct {
	dev  *vfio.Device
	info vfio.RegionInfo
}

func (r fileRegs) load32(off int) (uint32, error) {
	var b [4]byte
	err := r.dev.ReadRegion(r.info, int64(off), b[:])
	return binary.LittleEndian.Uint32(b[:]), err // PCI registers are little-endian
}

func (r fileRegs) store32(off int, v uint32) error {
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], v)
	return r.dev.WriteRegion(r.info, int64(off), b[:])
}

// FindPCI lists the PCI addresses of the ivshmem devices (doorbell or
// plain) on h, sorted.
func FindPCI(h vfio.Host) ([]string, error) {
	root := h.SysfsRoot
	if root == "" {
		root = "/sys"
	}
	dir := filepath.Join(root, "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("find ivshmem devices: %w", err)
	}
	var addrs []string
	for _, e := range entries {
		vendor, verr := readHexFile(filepath.Join(dir, e.Name(), "vendor"))
		device, derr := readHexFile(filepath.Join(dir, e.Name(), "device"))
		if err := errors.Join(verr, derr); err != nil {
			return nil, fmt.Errorf("find ivshmem devices: %s: %w", e.Name(), err)
		}
		if vendor == PCIVendorID && device == PCIDeviceID {
			addrs = append(addrs, e.Name())
		}
	}
	sort.Strings(addrs)
	return addrs, nil
}

func readHexFile(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(string(b)), "0x"), 16, 32)
}

// OpenPCI opens an ivshmem-doorbell device through VFIO: it binds it to
// vfio-pci if asked, opens its container, group and device, maps BAR0 and
// BAR2, sets Bus Master Enable and routes the doorbell vectors' MSI-X
// interrupts to eventfds. The process holds the device's IOMMU group
// until Close: a second open fails with an error matching
// vfio.ErrDeviceBusy. Errors match the vfio sentinels (vfio.ErrNotBound,
// vfio.ErrNoIOMMU, ...) and, for a device without a doorbell,
// ntb.ErrNotSupported.
func OpenPCI(cfg PCIConfig) (*PCIPort, error) {
	addr := cfg.Addr
	if addr == "" {
		addrs, err := FindPCI(cfg.Host)
		if err != nil {
			return nil, fmt.Errorf("open ivshmem pci device: %w", err)
		}
		if len(addrs) != 1 {
			return nil, fmt.Errorf("open ivshmem pci device: %d ivshmem devices %v, name one: %w", len(addrs), addrs, vfio.ErrNoSuchDevice)
		}
		addr = addrs[0]
	}
	p, err := openPCI(cfg, addr)
	if err != nil {
		return nil, fmt.Errorf("open ivshmem pci device %s: %w", addr, err)
	}
	return p, nil
}

func openPCI(cfg PCIConfig, addr string) (_ *PCIPort, err error) {
	h := cfg.Host
	if cfg.Bind {
		if err := h.BindVFIO(addr); err != nil {
			return nil, err
		}
	}
	group, err := h.CheckGroup(addr)
	if err != nil {
		return nil, err
	}

	// Everything opened so far, undone in reverse on failure or Close.
	var undo []func() error
	release := func() error {
		var errs []error
		for i := len(undo) - 1; i >= 0; i-- {
			errs = append(errs, undo[i]())
		}
		undo = nil
		return errors.Join(errs...)
	}
	defer func() {
		if err != nil {
			err = errors.Join(err, release())
		}
	}()

	c, err := h.OpenContainer()
	if err != nil {
		return nil, err
	}
	undo = append(undo, c.Close)
	g, err := h.OpenGroup(group)
	if err != nil {
		return nil, err
	}
	undo = append(undo, g.Close)
	if err := g.SetContainer(c); err != nil {
		return nil, err
	}
	if err := c.SetIOMMU(); err != nil {
		return nil, err
	}
	d, err := g.OpenDevice(addr)
	if err != nil {
		return nil, err
	}
	undo = append(undo, d.Close)

	var ids [4]byte
	if err := d.ReadConfig(pciVendorOffset, ids[:]); err != nil {
		return nil, err
	}
	vendor, device := binary.LittleEndian.Uint16(ids[:2]), binary.LittleEndian.Uint16(ids[2:])
	if vendor != PCIVendorID || device != PCIDeviceID {
		return nil, fmt.Errorf("%04x:%04x is not an ivshmem device (%04x:%04x): %w", vendor, device, PCIVendorID, PCIDeviceID, vfio.ErrNoSuchDevice)
	}

	msix, err := d.IRQInfo(vfio.IRQMSIX)
	if err != nil {
		return nil, err
	}
	vectors := cfg.Vectors
	switch {
	case msix.Count == 0:
		return nil, fmt.Errorf("no MSI-X vectors (ivshmem-plain has no doorbell; use ivshmem-doorbell): %w", ntb.ErrNotSupported)
	case vectors == 0:
		vectors = int(msix.Count)
	case vectors < 0 || vectors > int(msix.Count) || vectors > MaxVectors:
		return nil, fmt.Errorf("%d vectors asked for, the device has %d", vectors, msix.Count)
	}

	if err := d.RequireBARs(map[int]uint64{barMem: 1}); err != nil {
		return nil, err
	}
	memMap, err := d.MapBAR(barMem)
	if err != nil {
		return nil, err
	}
	undo = append(undo, memMap.Close)
	regs, err := openRegs(d, &undo)
	if err != nil {
		return nil, err
	}

	evs := make([]*vfio.Eventfd, vectors)
	for i := range evs {
		if evs[i], err = vfio.NewEventfd(); err != nil {
			return nil, err
		}
		undo = append(undo, evs[i].Close) // after DisableIRQs below: the kernel stops first
	}
	fds := make([]int, vectors)
	for i, ev := range evs {
		fds[i] = ev.FD()
	}
	if err := d.SetBusMaster(true); err != nil { // or every MSI-X message is dropped
		return nil, err
	}
	if err := d.SetIRQEventfds(vfio.IRQMSIX, 0, fds); err != nil {
		return nil, err
	}
	undo = append(undo, func() error { return d.DisableIRQs(vfio.IRQMSIX) })

	p, err := newPCIPort(addr, regs, memMap.Bytes(), evs, release)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// openRegs maps BAR0, or falls back to reaching it through the device file
// when the kernel cannot map it.
func openRegs(d *vfio.Device, undo *[]func() error) (registers, error) {
	info, err := d.RegionInfo(vfio.RegionBAR0 + barRegs)
	if err != nil {
		return nil, err
	}
	if info.Size < regBlockSize {
		return nil, fmt.Errorf("bar %d: %d bytes, need %d: %w", barRegs, info.Size, regBlockSize, vfio.ErrMissingBAR)
	}
	if info.Flags&vfio.RegionMmap == 0 || info.SparseAreas != nil {
		return fileRegs{dev: d, info: info}, nil
	}
	m, err := d.MapBAR(barRegs)
	if err != nil {
		return nil, err
	}
	*undo = append(*undo, m.Close)
	return mappedRegs(m.Bytes()), nil
}

// newPCIPort finishes a port over its registers, shared memory and one
// eventfd per vector; release undoes everything, eventfds included, and
// becomes the port's to call. On failure the caller still owns it.
func newPCIPort(addr string, regs registers, mem []byte, evs []*vfio.Eventfd, release func() error) (*PCIPort, error) {
	pos, err := regs.load32(regIVPosition)
	if err != nil {
		return nil, err
	}
	id := int(int32(pos))
	if id < 0 || id >= MaxPeers {
		return nil, fmt.Errorf("IVPosition %d: the device has no peer id (is QEMU connected to an ivshmem server?)", id)
	}
	if err := regs.store32(regIntrMask, 0); err != nil { // INTx off: doorbells come as MSI-X
		return nil, err
	}
	return &PCIPort{addr: addr, id: id, mem: mem, regs: regs, evs: evs, release: release}, nil
}

// Addr is the device's PCI address.
func (p *PCIPort) Addr() string { return p.addr }

// ID is the device's peer id, its IVPosition register.
func (p *PCIPort) ID() int { return p.id }

// Vectors is the number of doorbell vectors routed to eventfds.
func (p *PCIPort) Vectors() int { return len(p.evs) }

// Mem is BAR2, the shared memory, mapped. The slice is valid until Close;
// words other peers read concurrently must be accessed atomically.
func (p *PCIPort) Mem() []byte { return p.mem }

// Ring raises vector on peer through the Doorbell register; peer may be
// this port's own id. The device drops a ring of a peer that is not
// connected, so no error says so. It never blocks.
func (p *PCIPort) Ring(peer, vector int) error {
	if peer < 0 || peer >= MaxPeers {
		return fmt.Errorf("ring peer %d vector %d: peer outside 0..%d", peer, vector, MaxPeers-1)
	}
	if vector < 0 || vector >= len(p.evs) {
		return fmt.Errorf("ring peer %d vector %d: vector outside 0..%d", peer, vector, len(p.evs)-1)
	}
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return fmt.Errorf("ring peer %d vector %d: %w", peer, vector, net.ErrClosed)
	}
	if err := p.regs.store32(regDoorbell, uint32(peer)<<doorbellPeerShift|uint32(vector)); err != nil {
		return fmt.Errorf("ring peer %d vector %d: %w", peer, vector, err)
	}
	return nil
}

// Wait blocks until vector's MSI-X interrupt has fired since the last Wait
// on it, or ctx is done. Interrupts that fire before Wait are kept; several
// are consumed by one Wait. At most one goroutine may Wait on a vector at a
// time. After Close it returns an error matching net.ErrClosed.
func (p *PCIPort) Wait(ctx context.Context, vector int) error {
	if vector < 0 || vector >= len(p.evs) {
		return fmt.Errorf("wait vector %d: vector outside 0..%d", vector, len(p.evs)-1)
	}
	ev := p.evs[vector]
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := ev.SetReadDeadline(time.Time{}); err != nil {
			return p.waitErr(vector, err)
		}
		stop := context.AfterFunc(ctx, func() { _ = ev.SetReadDeadline(time.Unix(1, 0)) })
		_, err := ev.Wait()
		stop()
		if err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return p.waitErr(vector, err)
		}
		// ctx is done (checked above), or a late deadline from an earlier
		// Wait's context: clear it and wait again.
	}
}

func (p *PCIPort) waitErr(vector int, err error) error {
	p.mu.RLock()
	closed := p.closed
	p.mu.RUnlock()
	if closed || errors.Is(err, os.ErrClosed) {
		err = net.ErrClosed
	}
	return fmt.Errorf("wait vector %d: %w", vector, err)
}

// Close disables the interrupts, wakes every Wait, unmaps both BARs and
// releases the device, its group and its container. It is idempotent.
func (p *PCIPort) Close() error {
	p.closeOnce.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		if err := p.release(); err != nil {
			p.closeErr = fmt.Errorf("close ivshmem pci device %s: %w", p.addr, err)
		}
	})
	return p.closeErr
}
