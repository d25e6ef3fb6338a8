package vfio

import (
	"encoding/binary"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRealDevice drives a device bound to vfio-pci through every ioctl the
// package issues. It is the VM tier's test: run it as root in a guest with
// an IOMMU and NTSTACK_VFIO_DEVICE=<PCI address of the device>.
func TestRealDevice(t *testing.T) {
	if _, err := os.Stat("/dev/vfio/vfio"); err != nil {
		t.Skip("no /dev/vfio/vfio: host kernel has no VFIO (run make vmtest)")
	}
	addr := os.Getenv("NTSTACK_VFIO_DEVICE")
	if addr == "" {
		t.Skip("NTSTACK_VFIO_DEVICE unset: it names the vfio-pci device to test (run make vmtest)")
	}
	var h Host
	group, err := h.CheckGroup(addr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := h.OpenContainer()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g, err := h.OpenGroup(group)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := h.OpenGroup(group); !errors.Is(err, ErrDeviceBusy) {
		t.Errorf("second OpenGroup = %v, want ErrDeviceBusy", err)
	}
	if err := g.SetContainer(c); err != nil {
		t.Fatal(err)
	}
	if err := c.SetIOMMU(); err != nil {
		t.Fatal(err)
	}
	if st, err := g.Status(); err != nil || !st.Viable || !st.ContainerSet {
		t.Errorf("group status %+v, %v; want viable and attached", st, err)
	}
	iommu, err := c.IOMMUInfo()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("iommu: %+v", iommu)

	d, err := g.OpenDevice(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	info, err := d.Info()
	if err != nil || info.Flags&DevicePCI == 0 {
		t.Fatalf("device info %+v, %v; want a PCI device", info, err)
	}
	var vendor [2]byte
	if err := d.ReadConfig(0, vendor[:]); err != nil || binary.LittleEndian.Uint16(vendor[:]) == 0xffff {
		t.Errorf("vendor id % x, %v", vendor, err)
	}
	for i := range RegionIndex(info.NumRegions) {
		r, err := d.RegionInfo(i)
		if i == RegionVGA && errors.Is(err, unix.EINVAL) {
			continue // vfio-pci has no VGA region for a device that is not VGA
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("region %d: %+v", i, r)
		if checkMappable(r) != nil {
			continue
		}
		m, err := d.MapRegion(i)
		if err != nil {
			t.Fatal(err)
		}
		if uint64(len(m.Bytes())) != r.Size {
			t.Errorf("region %d: mapped %d bytes, want %d", i, len(m.Bytes()), r.Size)
		}
		if err := m.Close(); err != nil {
			t.Error(err)
		}
	}

	if err := d.SetBusMaster(true); err != nil {
		t.Fatal(err)
	}
	msix, err := d.IRQInfo(IRQMSIX)
	if err != nil {
		t.Fatal(err)
	}
	if msix.Count > 0 {
		ev, err := NewEventfd()
		if err != nil {
			t.Fatal(err)
		}
		if err := d.SetIRQEventfds(IRQMSIX, 0, []int{ev.FD()}); err != nil {
			t.Error(err)
		}
		if err := d.DisableIRQs(IRQMSIX); err != nil {
			t.Error(err)
		}
		ev.Close()
	}

	buf, err := NewDMABuffer(1)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Close()
	var iova IOVA // the lowest valid IOVA
	if len(iommu.IOVARanges) > 0 {
		iova = iommu.IOVARanges[0].Start
	}
	if err := c.MapDMA(buf, iova, DMARead|DMAWrite); err != nil {
		t.Fatal(err)
	}
	if err := c.UnmapDMA(iova, uint64(len(buf.Bytes()))); err != nil {
		t.Error(err)
	}
}
