package intel

import (
	"errors"
	"fmt"
	"sync"

	"github.com/ntstack/ntstack/vfio"
)

// VFIOPort names the VFIO objects of one NTB port. The caller opens them
// in the order package vfio describes (container, group, SetIOMMU,
// device) and closes them after the Device.
type VFIOPort struct {
	Host      vfio.Host // its SysfsRoot locates resource2_wc and resource
	Addr      string    // PCI address, "0000:af:00.0"
	Container *vfio.Container
	Device    *vfio.Device
}

// Open drives the NTB port p: it checks that the device is a supported
// Intel port in a back-to-back topology (errors matching
// ntb.ErrNotSupported otherwise), maps BAR0, maps the window BAR
// write-combined, maps an inbound DMA buffer at an IOVA the inbound
// translation points at, routes the 33 MSI-X vectors to one eventfd and
// brings the link up. Link reports up once the peer's driver has done
// the same.
func Open(p VFIOPort, o Options) (_ *Device, err error) {
	var owned []func() error // released in reverse order
	release := func() error {
		var errs []error
		for i := len(owned) - 1; i >= 0; i-- {
			errs = append(errs, owned[i]())
		}
		return errors.Join(errs...)
	}
	started := false
	defer func() {
		if err != nil {
			if !started {
				err = errors.Join(err, release())
			}
			err = fmt.Errorf("open intel ntb %s: %w", p.Addr, err)
		}
	}()
	dev := p.Device
	lay, err := identify(dev)
	if err != nil {
		return nil, err
	}
	bar0, err := dev.MapBAR(0)
	if err != nil {
		return nil, fmt.Errorf("map BAR0: %w", err)
	}
	owned = append(owned, bar0.Close)
	if n := len(bar0.Bytes()); n < lay.bar0Size {
		return nil, fmt.Errorf("BAR0 of %d bytes, %v registers need %d: %w", n, lay.gen, lay.bar0Size, vfio.ErrMissingBAR)
	}
	regs := mmio{bar0.Bytes()}
	port, err := topology(lay, dev, regs)
	if err != nil {
		return nil, err
	}
	info, err := dev.RegionInfo(vfio.RegionBAR2)
	if err != nil {
		return nil, fmt.Errorf("window BAR%d: %w", windowBAR, err)
	}
	if info.Size == 0 {
		return nil, fmt.Errorf("window BAR%d: %w", windowBAR, vfio.ErrMissingBAR)
	}
	size, err := o.windowSize(info.Size)
	if err != nil {
		return nil, err
	}
	barBase, err := p.Host.ResourceStart(p.Addr, windowBAR)
	if err != nil {
		return nil, err
	}
	out, err := mapWindow(p, size, o.AllowUncachedWindow)
	if err != nil {
		return nil, err
	}
	owned = append(owned, out.Close)
	buf, err := vfio.NewDMABuffer(size)
	if err != nil {
		return nil, err
	}
	owned = append(owned, buf.Close)
	iova := uint64(o.WindowIOVA)
	if iova == 0 {
		mmu, err := p.Container.IOMMUInfo()
		if err != nil {
			return nil, err
		}
		if iova, err = pickIOVA(mmu.IOVARanges, info.Size, uint64(size)); err != nil {
			return nil, err
		}
	}
	if err := p.Container.MapDMA(buf, vfio.IOVA(iova), vfio.DMARead|vfio.DMAWrite); err != nil {
		return nil, fmt.Errorf("map inbound window at iova %#x: %w", iova, err)
	}
	owned = append(owned, func() error { return p.Container.UnmapDMA(vfio.IOVA(iova), uint64(size)) })
	if err := dev.SetBusMaster(true); err != nil { // else MSI-X is dropped
		return nil, err
	}
	irq, err := newVFIOIRQ(dev)
	if err != nil {
		return nil, err
	}
	started = true // start owns everything now, and releases it on failure
	return start(hardware{
		name: "intel-ntb/" + p.Addr, lay: lay, port: port, regs: regs, cfg: dev,
		in: buf.Bytes(), out: out.Bytes()[:size], iova: iova,
		barBase: barBase, barSize: info.Size, irq: irq, release: release,
	}, o)
}

// mapWindow maps size bytes of the window BAR write-combined through
// sysfs resourceN_wc, or uncached through VFIO if that is missing and
// allowed.
func mapWindow(p VFIOPort, size int, allowUncached bool) (*vfio.Mapping, error) {
	m, err := p.Host.MapResourceWC(p.Addr, windowBAR, size)
	if err == nil {
		return m, nil
	}
	if !errors.Is(err, vfio.ErrNotSupported) {
		return nil, fmt.Errorf("map window: %w", err)
	}
	if !allowUncached {
		return nil, notSupported("write-combined window mapping: %v", err)
	}
	uc, err := p.Device.MapBAR(windowBAR)
	if err != nil {
		return nil, fmt.Errorf("map window BAR%d uncached: %w", windowBAR, err)
	}
	if len(uc.Bytes()) < size {
		return nil, errors.Join(fmt.Errorf("window BAR%d: %w", windowBAR, vfio.ErrMissingBAR), uc.Close())
	}
	return uc, nil
}

// pickIOVA returns the first non-zero multiple of align at which size
// bytes fit inside one of ranges (any, if the kernel reports none).
func pickIOVA(ranges []vfio.IOVARange, align, size uint64) (uint64, error) {
	if len(ranges) == 0 {
		return align, nil
	}
	for _, r := range ranges {
		c := max(uint64(r.Start), align)
		if rem := c % align; rem != 0 {
			if c+(align-rem) < c {
				continue // wraps
			}
			c += align - rem
		}
		if c <= uint64(r.End) && size-1 <= uint64(r.End)-c {
			return c, nil
		}
	}
	return 0, fmt.Errorf("no iova range holds %#x bytes aligned to %#x", size, align)
}

// vfioIRQ routes all 33 MSI-X vectors to one eventfd.
type vfioIRQ struct {
	dev  *vfio.Device
	efd  *vfio.Eventfd
	once sync.Once
	err  error
}

func newVFIOIRQ(dev *vfio.Device) (*vfioIRQ, error) {
	info, err := dev.IRQInfo(vfio.IRQMSIX)
	if err != nil {
		return nil, fmt.Errorf("msi-x info: %w", err)
	}
	if info.Count < msixVectors {
		return nil, notSupported("msi-x with %d vectors (need %d)", info.Count, msixVectors)
	}
	efd, err := vfio.NewEventfd()
	if err != nil {
		return nil, err
	}
	fds := make([]int, msixVectors)
	for i := range fds {
		fds[i] = efd.FD()
	}
	if err := dev.SetIRQEventfds(vfio.IRQMSIX, 0, fds); err != nil {
		return nil, errors.Join(fmt.Errorf("route msi-x to eventfd: %w", err), efd.Close())
	}
	return &vfioIRQ{dev: dev, efd: efd}, nil
}

func (q *vfioIRQ) Wait() (uint64, error) { return q.efd.Wait() }

// Close detaches the vectors, then closes the eventfd (which wakes Wait).
func (q *vfioIRQ) Close() error {
	q.once.Do(func() { q.err = errors.Join(q.dev.DisableIRQs(vfio.IRQMSIX), q.efd.Close()) })
	return q.err
}
