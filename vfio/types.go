package vfio

// Values returned by the package and the kernel ABI constants users pass in.
// The constants mirror include/uapi/linux/vfio.h (named in each comment);
// abi_linux_test.go checks them.

// RegionIndex selects a region of a device. vfio-pci uses fixed indexes for
// the BARs, the expansion ROM, config space and VGA; indexes from 9 up are
// device specific and described by a region type capability.
type RegionIndex uint32

// vfio-pci region indexes (VFIO_PCI_*_REGION_INDEX).
const (
	RegionBAR0   RegionIndex = 0 // VFIO_PCI_BAR0_REGION_INDEX
	RegionBAR1   RegionIndex = 1
	RegionBAR2   RegionIndex = 2
	RegionBAR3   RegionIndex = 3
	RegionBAR4   RegionIndex = 4
	RegionBAR5   RegionIndex = 5 // VFIO_PCI_BAR5_REGION_INDEX
	RegionROM    RegionIndex = 6 // VFIO_PCI_ROM_REGION_INDEX
	RegionConfig RegionIndex = 7 // VFIO_PCI_CONFIG_REGION_INDEX
	RegionVGA    RegionIndex = 8 // VFIO_PCI_VGA_REGION_INDEX
)

// IRQIndex selects an interrupt type of a device.
type IRQIndex uint32

// vfio-pci IRQ indexes (VFIO_PCI_*_IRQ_INDEX).
const (
	IRQIntx IRQIndex = 0 // VFIO_PCI_INTX_IRQ_INDEX: legacy INTx line
	IRQMSI  IRQIndex = 1 // VFIO_PCI_MSI_IRQ_INDEX
	IRQMSIX IRQIndex = 2 // VFIO_PCI_MSIX_IRQ_INDEX
	IRQErr  IRQIndex = 3 // VFIO_PCI_ERR_IRQ_INDEX: AER error notification
	IRQReq  IRQIndex = 4 // VFIO_PCI_REQ_IRQ_INDEX: the kernel asks for the device back
)

// DeviceFlags describe a device (vfio_device_info.flags).
type DeviceFlags uint32

const (
	DeviceReset DeviceFlags = 1 << 0 // VFIO_DEVICE_FLAGS_RESET: Reset is supported
	DevicePCI   DeviceFlags = 1 << 1 // VFIO_DEVICE_FLAGS_PCI: a vfio-pci device
)

// DeviceInfo describes a device as VFIO_DEVICE_GET_INFO reports it.
type DeviceInfo struct {
	Flags      DeviceFlags
	NumRegions uint32 // highest region index + 1
	NumIRQs    uint32 // highest IRQ index + 1
}

// RegionFlags describe the access a region allows (vfio_region_info.flags).
type RegionFlags uint32

const (
	RegionRead  RegionFlags = 1 << 0 // VFIO_REGION_INFO_FLAG_READ
	RegionWrite RegionFlags = 1 << 1 // VFIO_REGION_INFO_FLAG_WRITE
	RegionMmap  RegionFlags = 1 << 2 // VFIO_REGION_INFO_FLAG_MMAP
)

// RegionInfo describes a device region as VFIO_DEVICE_GET_REGION_INFO
// reports it, with its capability chain decoded.
type RegionInfo struct {
	Index  RegionIndex
	Flags  RegionFlags
	Size   uint64 // bytes; 0 for a region the device does not implement
	Offset uint64 // where the region starts in the device file

	// SparseAreas, when non-nil, are the only parts of the region that may
	// be mmap'd (VFIO_REGION_INFO_CAP_SPARSE_MMAP). Every area lies inside
	// [0, Size).
	SparseAreas []SparseArea

	// Type is the device-specific region type, nil if the kernel reported
	// none (VFIO_REGION_INFO_CAP_TYPE).
	Type *RegionType
}

// SparseArea is an mmap-able part of a region, relative to its start.
type SparseArea struct {
	Offset uint64
	Size   uint64
}

// RegionType identifies a device-specific region (struct
// vfio_region_info_cap_type): a type global per bus driver, and a subtype.
type RegionType struct {
	Type    uint32
	Subtype uint32
}

// IRQFlags describe an interrupt index (vfio_irq_info.flags).
type IRQFlags uint32

const (
	IRQEventfd    IRQFlags = 1 << 0 // VFIO_IRQ_INFO_EVENTFD: can signal an eventfd
	IRQMaskable   IRQFlags = 1 << 1 // VFIO_IRQ_INFO_MASKABLE
	IRQAutomasked IRQFlags = 1 << 2 // VFIO_IRQ_INFO_AUTOMASKED: masked after each signal (INTx)
	IRQNoresize   IRQFlags = 1 << 3 // VFIO_IRQ_INFO_NORESIZE: vectors are set up as a set
)

// IRQInfo describes an interrupt index as VFIO_DEVICE_GET_IRQ_INFO reports it.
type IRQInfo struct {
	Index IRQIndex
	Flags IRQFlags
	Count uint32 // vectors in this index; 0 if the device has none
}

// GroupStatus is the state of an IOMMU group (struct vfio_group_status).
type GroupStatus struct {
	// Viable reports that every device in the group is bound to vfio-pci,
	// to a driver VFIO tolerates, or to none: only then can the group be
	// attached to a container.
	Viable bool
	// ContainerSet reports that the group is attached to a container.
	ContainerSet bool
}

// IOVA is an address in a device's I/O virtual address space. It is an
// integer on purpose: it is meaningless in this process and must never be
// turned into a pointer.
type IOVA uint64

// IOVARange is a range of IOVAs the IOMMU can map. End is the last valid
// address (inclusive), as the kernel reports it.
type IOVARange struct {
	Start IOVA
	End   IOVA
}

// IOMMUInfo describes a container's IOMMU (VFIO_IOMMU_GET_INFO).
type IOMMUInfo struct {
	// PageSizes is a bitmap of the IOMMU's page sizes: bit n set means
	// 2^n-byte pages. 0 if the kernel did not report them.
	PageSizes uint64
	// IOVARanges lists where DMA mappings may be placed; nil if the kernel
	// does not report it (before Linux 5.4), in which case any range the
	// IOMMU accepts is valid.
	IOVARanges []IOVARange
}

// DMAFlags say what a device may do with a DMA mapping.
type DMAFlags uint32

const (
	DMARead  DMAFlags = 1 << 0 // VFIO_DMA_MAP_FLAG_READ: the device may read the buffer
	DMAWrite DMAFlags = 1 << 1 // VFIO_DMA_MAP_FLAG_WRITE: the device may write the buffer
)

// Host names the sysfs and /dev trees the package works in. The zero Host
// is the running system; tests point it at fake trees.
type Host struct {
	SysfsRoot string // "" means "/sys"
	DevRoot   string // "" means "/dev"
}
