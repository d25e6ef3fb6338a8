package vfio

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Binding and diagnosis through sysfs. The files involved, under the sysfs
// root:
//
//	bus/pci/devices/<addr>/iommu_group     → ../../../kernel/iommu_groups/<N>
//	bus/pci/devices/<addr>/driver          → ../../../bus/pci/drivers/<name>
//	bus/pci/devices/<addr>/driver_override  driver to bind on the next probe
//	bus/pci/drivers/<name>/unbind           write <addr> to unbind it
//	bus/pci/drivers/vfio-pci/               present once vfio-pci is loaded
//	bus/pci/drivers_probe                   write <addr> to probe it now
//	kernel/iommu_groups/<N>/devices/<addr>  one entry per device of group N
//
// and under the dev root: vfio/vfio (the container) and vfio/<N> (group N).

const vfioPCI = "vfio-pci"

func (h Host) sys(elem ...string) string {
	root := h.SysfsRoot
	if root == "" {
		root = "/sys"
	}
	return filepath.Join(append([]string{root}, elem...)...)
}

func (h Host) dev(elem ...string) string {
	root := h.DevRoot
	if root == "" {
		root = "/dev"
	}
	return filepath.Join(append([]string{root}, elem...)...)
}

// IOMMUGroup returns the IOMMU group of the PCI device at addr.
func (h Host) IOMMUGroup(addr string) (int, error) {
	a, err := parsePCIAddr(addr)
	group := 0
	if err == nil {
		addr = a
		group, err = h.iommuGroup(a)
	}
	if err != nil {
		return 0, fmt.Errorf("iommu group of %s: %w", addr, err)
	}
	return group, nil
}

func (h Host) iommuGroup(addr string) (int, error) {
	if err := h.checkDevice(addr); err != nil {
		return 0, err
	}
	link, err := os.Readlink(h.sys("bus", "pci", "devices", addr, "iommu_group"))
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("device has no iommu_group: %w: enable VT-d or AMD-Vi in firmware and boot with intel_iommu=on (a QEMU guest needs -device intel-iommu)", ErrNoIOMMU)
	}
	if err != nil {
		return 0, err
	}
	group, err := strconv.Atoi(filepath.Base(link))
	if err != nil {
		return 0, fmt.Errorf("iommu_group link %q: %w", link, err)
	}
	return group, nil
}

// BindVFIO binds the PCI device at addr to vfio-pci: it sets the device's
// driver_override, unbinds it from its current driver and has the kernel
// probe it again. It needs root. Other devices of the IOMMU group are left
// alone; CheckGroup names any that keep the group from being viable.
func (h Host) BindVFIO(addr string) error {
	a, err := parsePCIAddr(addr)
	if err == nil {
		addr = a
		err = h.bindVFIO(a)
	}
	if err != nil {
		return fmt.Errorf("bind %s to vfio-pci: %w", addr, err)
	}
	return nil
}

func (h Host) bindVFIO(addr string) error {
	if err := h.checkDevice(addr); err != nil {
		return err
	}
	if err := h.checkVFIOLoaded(); err != nil {
		return err
	}
	drv, err := h.driver(addr)
	if err != nil {
		return err
	}
	if isVFIODriver(drv) {
		return nil // already bound
	}
	if err := writeSysfs(h.sys("bus", "pci", "devices", addr, "driver_override"), vfioPCI); err != nil {
		return err
	}
	if drv != "" {
		if err := writeSysfs(h.sys("bus", "pci", "devices", addr, "driver", "unbind"), addr); err != nil {
			return err
		}
	}
	if err := writeSysfs(h.sys("bus", "pci", "drivers_probe"), addr); err != nil {
		return err
	}
	if drv, err = h.driver(addr); err != nil {
		return err
	}
	if isVFIODriver(drv) {
		return nil
	}
	return fmt.Errorf("%w: bound to %s after probing (see dmesg)", ErrNotBound, driverName(drv))
}

// CheckGroup checks that the PCI device at addr can be opened through VFIO
// and returns its IOMMU group. Its errors name the first problem found and
// its fix, in the order a user meets them: ErrNoSuchDevice, ErrNoIOMMU,
// ErrNotSupported (no vfio-pci, no /dev/vfio/vfio), ErrNotBound,
// ErrGroupNotViable, ErrDeviceBusy. Call it before opening the group: an
// open group is busy.
func (h Host) CheckGroup(addr string) (int, error) {
	a, err := parsePCIAddr(addr)
	group := 0
	if err == nil {
		addr = a
		group, err = h.checkGroup(a)
	}
	if err != nil {
		return 0, fmt.Errorf("check vfio group of %s: %w", addr, err)
	}
	return group, nil
}

func (h Host) checkGroup(addr string) (int, error) {
	group, err := h.iommuGroup(addr)
	if err != nil {
		return 0, err
	}
	if err := h.checkVFIOLoaded(); err != nil {
		return 0, err
	}
	drv, err := h.driver(addr)
	if err != nil {
		return 0, err
	}
	if !isVFIODriver(drv) {
		return 0, fmt.Errorf("%w: bound to %s (BindVFIO binds it)", ErrNotBound, driverName(drv))
	}
	if err := h.checkViable(group); err != nil {
		return 0, fmt.Errorf("group %d: %w", group, err)
	}
	for _, path := range []string{h.dev("vfio", "vfio"), h.dev("vfio", strconv.Itoa(group))} {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			return 0, h.openError(path, err)
		}
		f.Close()
	}
	return group, nil
}

// checkViable names the devices of the group that keep it from being
// viable.
func (h Host) checkViable(group int) error {
	entries, err := os.ReadDir(h.sys("kernel", "iommu_groups", strconv.Itoa(group), "devices"))
	if err != nil {
		return err
	}
	var blockers []string
	for _, e := range entries {
		drv, err := h.driver(e.Name())
		if err != nil {
			return err
		}
		if !vfioTolerates(drv) {
			blockers = append(blockers, e.Name()+" ("+drv+")")
		}
	}
	if len(blockers) > 0 {
		return fmt.Errorf("%w: %s bound to a host driver; bind to vfio-pci or unbind every device of the group", ErrGroupNotViable, strings.Join(blockers, ", "))
	}
	return nil
}

// notViable explains a group the kernel reports not viable.
func (h Host) notViable(group int) error {
	if err := h.checkViable(group); errors.Is(err, ErrGroupNotViable) {
		return err
	}
	return fmt.Errorf("%w: bind to vfio-pci or unbind every device of the group", ErrGroupNotViable)
}

// openError explains a failed open of a /dev/vfio file.
func (h Host) openError(path string, err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if _, serr := os.Stat(h.dev("vfio", "vfio")); serr == nil {
			return fmt.Errorf("no %s: is a device of the group bound to vfio-pci, and /dev/vfio visible here (containers need --device)? %w", path, ErrNoSuchDevice)
		}
		return fmt.Errorf("no %s: host kernel has no VFIO (modprobe vfio-pci): %w", h.dev("vfio", "vfio"), ErrNotSupported)
	case errors.Is(err, unix.EBUSY):
		return fmt.Errorf("%w: %w (another process, or this one, holds the group open)", ErrDeviceBusy, err)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%w (run as root, or give the user access to %s)", err, path)
	}
	return err
}

func (h Host) checkDevice(addr string) error {
	_, err := os.Stat(h.sys("bus", "pci", "devices", addr))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no pci device %s: %w", addr, ErrNoSuchDevice)
	}
	return err
}

func (h Host) checkVFIOLoaded() error {
	_, err := os.Stat(h.sys("bus", "pci", "drivers", vfioPCI))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("vfio-pci driver not loaded (modprobe vfio-pci): %w", ErrNotSupported)
	}
	return err
}

// driver returns the name of the driver bound to the device, "" if none.
func (h Host) driver(addr string) (string, error) {
	link, err := os.Readlink(h.sys("bus", "pci", "devices", addr, "driver"))
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return filepath.Base(link), nil
}

func driverName(drv string) string {
	if drv == "" {
		return "no driver"
	}
	return drv
}

// isVFIODriver reports whether drv hands devices to VFIO: vfio-pci or a
// vendor variant of it (mlx5_vfio_pci, ...).
func isVFIODriver(drv string) bool {
	return drv == vfioPCI || strings.HasSuffix(drv, "_vfio_pci")
}

// vfioTolerates reports whether a device bound to drv leaves its group
// viable: VFIO drivers, no driver, pci-stub, and pcieport (bridges).
func vfioTolerates(drv string) bool {
	return drv == "" || drv == "pci-stub" || drv == "pcieport" || isVFIODriver(drv)
}

// writeSysfs writes value to an existing sysfs attribute.
func writeSysfs(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	return errors.Join(err, f.Close())
}

// parsePCIAddr returns addr in the form sysfs and VFIO name devices by,
// "0000:01:00.0"; the domain may be left out ("01:00.0").
func parsePCIAddr(addr string) (string, error) {
	s := strings.ToLower(addr)
	if strings.Count(s, ":") == 1 {
		s = "0000:" + s
	}
	domain, rest, _ := strings.Cut(s, ":")
	bus, rest, _ := strings.Cut(rest, ":")
	dev, fn, _ := strings.Cut(rest, ".")
	if !isHex(domain, 4, 8) || !isHex(bus, 2, 2) || !isHex(dev, 2, 2) || len(fn) != 1 || fn[0] < '0' || fn[0] > '7' {
		return "", fmt.Errorf("invalid pci address %q (want DDDD:BB:DD.F)", addr)
	}
	return s, nil
}

func isHex(s string, minLen, maxLen int) bool {
	if len(s) < minLen || len(s) > maxLen {
		return false
	}
	for _, c := range s {
		if !strings.ContainsRune("0123456789abcdef", c) {
			return false
		}
	}
	return true
}
