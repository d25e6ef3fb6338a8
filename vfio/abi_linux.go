package vfio

// Mirror of the kernel ABI in include/uapi/linux/vfio.h.
//
// Names are the kernel's, camel-cased mechanically so that a grep for either
// spelling finds the other: struct vfio_region_info → vfioRegionInfo, field
// cap_offset → CapOffset, VFIO_DEVICE_GET_REGION_INFO →
// vfioDeviceGetRegionInfo. Layouts are checked field by field against the
// kernel's in abi_unsafe_test.go. Flexible array members (areas[], data[])
// are not part of the Go structs: they follow the struct in a byte buffer.
//
// The exported region and IRQ indexes and flag values that mirror the header
// live in types.go so that non-Linux builds have them too.

// Kernel API version (VFIO_API_VERSION) and IOMMU backends
// (VFIO_CHECK_EXTENSION / VFIO_SET_IOMMU arguments).
const (
	vfioApiVersion   = 0
	vfioType1Iommu   = 1
	vfioType1v2Iommu = 3
)

// Flags and capability IDs.
const (
	vfioGroupFlagsViable       = 1 << 0 // vfio_group_status.flags
	vfioGroupFlagsContainerSet = 1 << 1

	vfioRegionInfoFlagCaps = 1 << 3 // vfio_region_info.flags; READ, WRITE, MMAP: see RegionFlags

	vfioRegionInfoCapSparseMmapId = 1 // vfio_info_cap_header.id in region info
	vfioRegionInfoCapTypeId       = 2

	vfioIrqSetDataNone      = 1 << 0 // vfio_irq_set.flags
	vfioIrqSetDataBool      = 1 << 1
	vfioIrqSetDataEventfd   = 1 << 2
	vfioIrqSetActionMask    = 1 << 3
	vfioIrqSetActionUnmask  = 1 << 4
	vfioIrqSetActionTrigger = 1 << 5

	vfioIommuInfoPgsizes = 1 << 0 // vfio_iommu_type1_info.flags
	vfioIommuInfoCaps    = 1 << 1

	vfioIommuType1InfoCapIovaRangeId = 1 // vfio_info_cap_header.id in IOMMU info
)

// Ioctl numbers: _IO(VFIO_TYPE, VFIO_BASE + n) with VFIO_TYPE ';' and
// VFIO_BASE 100. VFIO encodes no size or direction in its numbers (argsz
// carries the size), so _IO's direction bits hold the architecture's
// _IOC_NONE, which is iocNone here (0 on x86, arm and most others).
const (
	vfioType = ';'
	vfioBase = 100

	vfioGetApiVersion       = iocNone | vfioType<<8 | (vfioBase + 0)
	vfioCheckExtension      = iocNone | vfioType<<8 | (vfioBase + 1)
	vfioSetIommu            = iocNone | vfioType<<8 | (vfioBase + 2)
	vfioGroupGetStatus      = iocNone | vfioType<<8 | (vfioBase + 3)
	vfioGroupSetContainer   = iocNone | vfioType<<8 | (vfioBase + 4)
	vfioGroupUnsetContainer = iocNone | vfioType<<8 | (vfioBase + 5)
	vfioGroupGetDeviceFd    = iocNone | vfioType<<8 | (vfioBase + 6)
	vfioDeviceGetInfo       = iocNone | vfioType<<8 | (vfioBase + 7)
	vfioDeviceGetRegionInfo = iocNone | vfioType<<8 | (vfioBase + 8)
	vfioDeviceGetIrqInfo    = iocNone | vfioType<<8 | (vfioBase + 9)
	vfioDeviceSetIrqs       = iocNone | vfioType<<8 | (vfioBase + 10)
	vfioDeviceReset         = iocNone | vfioType<<8 | (vfioBase + 11)
	vfioIommuGetInfo        = iocNone | vfioType<<8 | (vfioBase + 12)
	vfioIommuMapDma         = iocNone | vfioType<<8 | (vfioBase + 13)
	vfioIommuUnmapDma       = iocNone | vfioType<<8 | (vfioBase + 14)
)

// vfioGroupStatus mirrors struct vfio_group_status.
type vfioGroupStatus struct {
	Argsz uint32
	Flags uint32
}

// vfioDeviceInfo mirrors struct vfio_device_info.
type vfioDeviceInfo struct {
	Argsz      uint32
	Flags      uint32
	NumRegions uint32
	NumIrqs    uint32
	CapOffset  uint32
	Pad        uint32
}

// vfioRegionInfo mirrors struct vfio_region_info.
type vfioRegionInfo struct {
	Argsz     uint32
	Flags     uint32
	Index     uint32
	CapOffset uint32
	Size      uint64
	Offset    uint64
}

// vfioInfoCapHeader mirrors struct vfio_info_cap_header, the header of every
// entry in an INFO capability chain. Next is an offset from the start of the
// INFO buffer; 0 ends the chain.
type vfioInfoCapHeader struct {
	Id      uint16
	Version uint16
	Next    uint32
}

// vfioRegionSparseMmapArea mirrors struct vfio_region_sparse_mmap_area.
type vfioRegionSparseMmapArea struct {
	Offset uint64
	Size   uint64
}

// vfioRegionInfoCapSparseMmap mirrors struct vfio_region_info_cap_sparse_mmap
// without its trailing areas[] (NrAreas vfioRegionSparseMmapArea).
type vfioRegionInfoCapSparseMmap struct {
	Header   vfioInfoCapHeader
	NrAreas  uint32
	Reserved uint32
}

// vfioRegionInfoCapType mirrors struct vfio_region_info_cap_type.
type vfioRegionInfoCapType struct {
	Header  vfioInfoCapHeader
	Type    uint32
	Subtype uint32
}

// vfioIrqInfo mirrors struct vfio_irq_info.
type vfioIrqInfo struct {
	Argsz uint32
	Flags uint32
	Index uint32
	Count uint32
}

// vfioIrqSet mirrors struct vfio_irq_set without its trailing data[] (for
// DATA_EVENTFD: Count __s32 descriptors).
type vfioIrqSet struct {
	Argsz uint32
	Flags uint32
	Index uint32
	Start uint32
	Count uint32
}

// vfioIommuType1Info mirrors struct vfio_iommu_type1_info.
type vfioIommuType1Info struct {
	Argsz       uint32
	Flags       uint32
	IovaPgsizes uint64
	CapOffset   uint32
}

// vfioIovaRange mirrors struct vfio_iova_range; End is inclusive.
type vfioIovaRange struct {
	Start uint64
	End   uint64
}

// vfioIommuType1InfoCapIovaRange mirrors struct
// vfio_iommu_type1_info_cap_iova_range without its trailing iova_ranges[]
// (NrIovas vfioIovaRange).
type vfioIommuType1InfoCapIovaRange struct {
	Header   vfioInfoCapHeader
	NrIovas  uint32
	Reserved uint32
}

// vfioIommuType1DmaMap mirrors struct vfio_iommu_type1_dma_map.
type vfioIommuType1DmaMap struct {
	Argsz uint32
	Flags uint32
	Vaddr uint64
	Iova  uint64
	Size  uint64
}

// vfioIommuType1DmaUnmap mirrors struct vfio_iommu_type1_dma_unmap without
// its trailing data[].
type vfioIommuType1DmaUnmap struct {
	Argsz uint32
	Flags uint32
	Iova  uint64
	Size  uint64
}
