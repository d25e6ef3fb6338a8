package doctor

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/ntstack/ntstack/ntb/intel"
	"github.com/ntstack/ntstack/ntb/ivshmem"
)

// The BAR that holds the memory window on both device kinds: Intel NTB
// memory window 0 (ntb/intel's windowBAR) and ivshmem's shared memory.
const windowBAR = 2

// Intel gen4 ports ntb/intel supports: revisions 0x2-0xF of 0x347E
// (ntb/intel's icxRevMin, icxRevMax; Sapphire Rapids reuses the id).
const (
	icxRevMin = 0x02
	icxRevMax = 0x0F
)

// Linux IORESOURCE_* flags of a sysfs "resource" line (linux/ioport.h).
const (
	ioresourceIO       = 0x00000100
	ioresourceMem      = 0x00000200
	ioresourcePrefetch = 0x00002000
	ioresourceMem64    = 0x00100000
)

const vfioPCI = "vfio-pci"

// pciDevice is an NTB or ivshmem function found on the PCI bus.
type pciDevice struct {
	addr     string // domain:bus:device.function
	kind     string // what it is, in words
	intel    bool   // an Intel NTB port (else ivshmem)
	device   uint64
	revision uint64
	driver   string // bound driver, "" for none
	group    string // IOMMU group, "" for none
	bars     []bar
	wc       bool // resource2_wc exists
}

// bar is one memory or I/O region of a device.
type bar struct {
	index int
	size  uint64
	flags uint64
}

func (b bar) String() string {
	s := fmt.Sprintf("BAR%d %s", b.index, formatBytes(b.size))
	switch {
	case b.flags&ioresourceIO != 0:
		s += " io"
	case b.flags&ioresourcePrefetch != 0:
		s += " prefetchable"
	}
	if b.flags&ioresourceMem64 != 0 {
		s += " 64-bit"
	}
	return s
}

// scanPCI finds the NTB and ivshmem devices under /sys/bus/pci/devices.
// A bus that does not exist (no PCI at all) is no devices, not an error.
func (h *host) scanPCI() ([]pciDevice, error) {
	dir := h.path("/sys/bus/pci/devices")
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list pci devices: %w", err)
	}
	var devs []pciDevice
	for _, e := range ents {
		d := pciDevice{addr: e.Name()}
		p := filepath.Join(dir, d.addr)
		vendor, err1 := readHex(filepath.Join(p, "vendor"))
		device, err2 := readHex(filepath.Join(p, "device"))
		if err1 != nil || err2 != nil {
			continue // not a function we can identify: not ours either
		}
		d.device = device
		switch {
		case vendor == intel.VendorIntel && device == intel.DeviceSKX:
			d.kind, d.intel = "Intel NTB gen3 (Skylake-SP)", true
		case vendor == intel.VendorIntel && device == intel.DeviceICX:
			d.kind, d.intel = "Intel NTB gen4 (Ice Lake-SP)", true
		case vendor == ivshmem.PCIVendorID && device == ivshmem.PCIDeviceID:
			d.kind = "QEMU ivshmem"
		default:
			continue
		}
		d.revision, _ = readHex(filepath.Join(p, "revision"))
		d.driver = linkBase(filepath.Join(p, "driver"))
		d.group = linkBase(filepath.Join(p, "iommu_group"))
		d.bars, err = readBARs(filepath.Join(p, "resource"))
		if err != nil {
			return nil, fmt.Errorf("pci device %s: %w", d.addr, err)
		}
		d.wc = exists(filepath.Join(p, fmt.Sprintf("resource%d_wc", windowBAR)))
		devs = append(devs, d)
	}
	sort.Slice(devs, func(i, j int) bool { return devs[i].addr < devs[j].addr })
	return devs, nil
}

// readBARs parses a sysfs "resource" file: one "start end flags" line per
// resource, the first six being BAR0-BAR5; unset ones are all zero.
func readBARs(path string) ([]bar, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read bars: %w", err)
	}
	defer f.Close()
	var bars []bar
	sc := bufio.NewScanner(f)
	for i := 0; i < 6 && sc.Scan(); i++ {
		fields := strings.Fields(sc.Text())
		if len(fields) != 3 {
			return nil, fmt.Errorf("read bars: %s line %d: want start end flags, got %q", path, i+1, sc.Text())
		}
		var v [3]uint64
		for j, s := range fields {
			if v[j], err = strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 64); err != nil {
				return nil, fmt.Errorf("read bars: %s line %d: %w", path, i+1, err)
			}
		}
		start, end, flags := v[0], v[1], v[2]
		if end == 0 || end < start {
			continue
		}
		bars = append(bars, bar{index: i, size: end - start + 1, flags: flags})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read bars: %w", err)
	}
	return bars, nil
}

// checkDevices reports each NTB and ivshmem device: its driver binding,
// IOMMU group, BARs and write-combining.
func (h *host) checkDevices() []Result {
	if h.pciErr != nil {
		return []Result{{Name: "devices", Status: Fail, Detail: h.pciErr.Error(),
			Fix: "run ntmon doctor as root, or check that /sys is mounted"}}
	}
	if len(h.devices) == 0 {
		return []Result{{Name: "devices", Status: Skip,
			Detail: "no NTB or ivshmem device; the emulated fabric (/dev/shm) is in use"}}
	}
	var rs []Result
	for _, d := range h.devices {
		rs = append(rs, h.checkDevice(d))
	}
	return rs
}

func (h *host) checkDevice(d pciDevice) Result {
	r := Result{Name: "device " + d.addr, Status: Pass}
	var detail, fixes []string
	drv := d.driver
	if drv == "" {
		drv = "no driver"
	}
	group := "no IOMMU group"
	if d.group != "" {
		group = "IOMMU group " + d.group
	}
	detail = append(detail, fmt.Sprintf("%s, %s, %s", d.kind, drv, group))
	var bars []string
	for _, b := range d.bars {
		bars = append(bars, b.String())
	}
	if len(bars) == 0 {
		bars = append(bars, "no BARs assigned")
	}
	wc := fmt.Sprintf("resource%d_wc present (write-combined window)", windowBAR)
	if !d.wc {
		wc = fmt.Sprintf("no resource%d_wc", windowBAR)
	}
	detail = append(detail, strings.Join(bars, ", ")+"; "+wc)

	worse := func(s Status) {
		if rank(s) > rank(r.Status) {
			r.Status = s
		}
	}
	sysdev := "/sys/bus/pci/devices/" + d.addr
	if d.driver != vfioPCI && !strings.HasSuffix(d.driver, "_vfio_pci") {
		worse(Warn)
		fix := fmt.Sprintf("bind it to vfio-pci (as root):\n  modprobe vfio-pci\n  echo vfio-pci > %s/driver_override\n", sysdev)
		if d.driver != "" {
			fix += fmt.Sprintf("  echo %s > %s/driver/unbind\n", d.addr, sysdev)
		}
		fix += fmt.Sprintf("  echo %s > /sys/bus/pci/drivers_probe", d.addr)
		fixes = append(fixes, fix)
	}
	if d.group == "" {
		worse(Fail)
		fixes = append(fixes, "VFIO needs the device in an IOMMU group: see the iommu check")
	}
	if d.intel && d.device == intel.DeviceICX && (d.revision < icxRevMin || d.revision > icxRevMax) {
		worse(Fail)
		detail = append(detail, fmt.Sprintf("revision %#x: ntb/intel drives gen4 revisions %#x-%#x only (Sapphire Rapids reuses this id with another layout)", d.revision, icxRevMin, icxRevMax))
		fixes = append(fixes, "this port cannot be driven: reach its peer over RDMA or TCP (peers.transports without \"ntb\")")
	}
	if d.intel && !d.wc {
		worse(Warn)
		fixes = append(fixes, fmt.Sprintf("the kernel offers resource%d_wc only for a prefetchable BAR with PAT enabled (no \"nopat\" on the kernel command line); without it ntb/intel refuses the window unless AllowUncachedWindow, and uncached every store is its own PCIe write", windowBAR))
	}
	r.Detail = strings.Join(detail, "\n")
	r.Fix = strings.Join(fixes, "\n")
	return r
}

func rank(s Status) int {
	switch s {
	case Warn:
		return 1
	case Fail:
		return 2
	}
	return 0
}
