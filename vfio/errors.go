package vfio

import (
	"errors"

	"github.com/ntstack/ntstack/internal/prim/errs"
)

// Errors the package's operations wrap; match them with errors.Is. The
// wrapping error says what failed and what to do about it.
var (
	// ErrNotSupported: the platform or kernel lacks something VFIO needs
	// (no VFIO at all, no type1 IOMMU backend, not Linux).
	ErrNotSupported = errs.ErrNotSupported

	// ErrNoIOMMU: the device has no IOMMU group because no IOMMU is
	// enabled. It also matches ErrNotSupported.
	ErrNoIOMMU error = noIOMMUError{}

	// ErrGroupNotViable: a device of the IOMMU group is bound to a host
	// driver, so the group cannot be handed to user space.
	ErrGroupNotViable = errors.New("iommu group not viable")

	// ErrNotBound: the device is not bound to vfio-pci.
	ErrNotBound = errors.New("device not bound to vfio-pci")

	// ErrDeviceBusy: the group or device is already in use, by this or
	// another process (EBUSY).
	ErrDeviceBusy = errors.New("device busy")

	// ErrNoSuchDevice: no such PCI device, group or device node.
	ErrNoSuchDevice = errors.New("no such device")

	// ErrMissingBAR: a region the caller needs is absent, not mmap-able or
	// too small.
	ErrMissingBAR = errors.New("missing BAR")
)

type noIOMMUError struct{}

func (noIOMMUError) Error() string        { return "no IOMMU" }
func (noIOMMUError) Is(target error) bool { return target == ErrNotSupported }
