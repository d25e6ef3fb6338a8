package vfio

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// MapResourceWC maps size bytes of BAR bar of the device at addr
// write-combined, through sysfs resourceN_wc. The kernel offers that file
// only for prefetchable memory BARs on platforms that support
// write-combining; without it the error matches ErrNotSupported. The
// mapping is independent of the device's VFIO file and outlives it.
func (h Host) MapResourceWC(addr string, bar, size int) (*Mapping, error) {
	path := h.sys("bus/pci/devices", addr, fmt.Sprintf("resource%d_wc", bar))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("map BAR%d write-combined: no %s: %w", bar, path, ErrNotSupported)
	}
	if err != nil {
		return nil, fmt.Errorf("map BAR%d write-combined: %w", bar, err)
	}
	defer f.Close()
	b, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", path, err)
	}
	return &Mapping{b: b}, nil
}

// ResourceStart is the bus address of BAR bar of the device at addr, from
// sysfs "resource" (one "start end flags" line per resource); an unset
// BAR is ErrMissingBAR.
func (h Host) ResourceStart(addr string, bar int) (uint64, error) {
	path := h.sys("bus/pci/devices", addr, "resource")
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("read BAR%d address: %w", bar, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for i := 0; sc.Scan(); i++ {
		if i == bar {
			fields := strings.Fields(sc.Text())
			if len(fields) == 3 {
				if v, err := strconv.ParseUint(fields[0], 0, 64); err == nil && v != 0 {
					return v, nil
				}
			}
			break
		}
	}
	return 0, fmt.Errorf("read BAR%d address from %s: %w", bar, path, ErrMissingBAR)
}
