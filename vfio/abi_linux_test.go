package vfio

import (
	"testing"

	"golang.org/x/sys/unix"
)

// The expected values below are copied from include/uapi/linux/vfio.h by
// hand, not computed, so that a wrong constant cannot agree with itself.

func TestIoctlNumbers(t *testing.T) {
	// _IO(t, nr) is t<<8 | nr plus the architecture's _IOC_NONE direction
	// bits. x/sys/unix generates BLKRRPART, _IO(0x12, 95), from each
	// architecture's headers: its direction bits must be iocNone.
	if got, want := uint64(iocNone), uint64(unix.BLKRRPART)&^0x125f; got != want {
		t.Fatalf("iocNone = %#x, but BLKRRPART has direction bits %#x", got, want)
	}
	tests := []struct {
		name      string
		got, want uint64
	}{
		{"VFIO_GET_API_VERSION", vfioGetApiVersion, 0x3B64},
		{"VFIO_CHECK_EXTENSION", vfioCheckExtension, 0x3B65},
		{"VFIO_SET_IOMMU", vfioSetIommu, 0x3B66},
		{"VFIO_GROUP_GET_STATUS", vfioGroupGetStatus, 0x3B67},
		{"VFIO_GROUP_SET_CONTAINER", vfioGroupSetContainer, 0x3B68},
		{"VFIO_GROUP_UNSET_CONTAINER", vfioGroupUnsetContainer, 0x3B69},
		{"VFIO_GROUP_GET_DEVICE_FD", vfioGroupGetDeviceFd, 0x3B6A},
		{"VFIO_DEVICE_GET_INFO", vfioDeviceGetInfo, 0x3B6B},
		{"VFIO_DEVICE_GET_REGION_INFO", vfioDeviceGetRegionInfo, 0x3B6C},
		{"VFIO_DEVICE_GET_IRQ_INFO", vfioDeviceGetIrqInfo, 0x3B6D},
		{"VFIO_DEVICE_SET_IRQS", vfioDeviceSetIrqs, 0x3B6E},
		{"VFIO_DEVICE_RESET", vfioDeviceReset, 0x3B6F},
		{"VFIO_IOMMU_GET_INFO", vfioIommuGetInfo, 0x3B70},
		{"VFIO_IOMMU_MAP_DMA", vfioIommuMapDma, 0x3B71},
		{"VFIO_IOMMU_UNMAP_DMA", vfioIommuUnmapDma, 0x3B72},
	}
	for _, tt := range tests {
		if want := iocNone | tt.want; tt.got != want {
			t.Errorf("%s = %#x, want %#x", tt.name, tt.got, want)
		}
	}
}

func TestABIConstants(t *testing.T) {
	tests := []struct {
		name      string
		got, want uint64
	}{
		{"VFIO_API_VERSION", vfioApiVersion, 0},
		{"VFIO_TYPE1_IOMMU", vfioType1Iommu, 1},
		{"VFIO_TYPE1v2_IOMMU", vfioType1v2Iommu, 3},

		{"VFIO_GROUP_FLAGS_VIABLE", vfioGroupFlagsViable, 1},
		{"VFIO_GROUP_FLAGS_CONTAINER_SET", vfioGroupFlagsContainerSet, 2},

		{"VFIO_DEVICE_FLAGS_RESET", uint64(DeviceReset), 1},
		{"VFIO_DEVICE_FLAGS_PCI", uint64(DevicePCI), 2},

		{"VFIO_REGION_INFO_FLAG_READ", uint64(RegionRead), 1},
		{"VFIO_REGION_INFO_FLAG_WRITE", uint64(RegionWrite), 2},
		{"VFIO_REGION_INFO_FLAG_MMAP", uint64(RegionMmap), 4},
		{"VFIO_REGION_INFO_FLAG_CAPS", vfioRegionInfoFlagCaps, 8},
		{"VFIO_REGION_INFO_CAP_SPARSE_MMAP", vfioRegionInfoCapSparseMmapId, 1},
		{"VFIO_REGION_INFO_CAP_TYPE", vfioRegionInfoCapTypeId, 2},

		{"VFIO_IRQ_INFO_EVENTFD", uint64(IRQEventfd), 1},
		{"VFIO_IRQ_INFO_MASKABLE", uint64(IRQMaskable), 2},
		{"VFIO_IRQ_INFO_AUTOMASKED", uint64(IRQAutomasked), 4},
		{"VFIO_IRQ_INFO_NORESIZE", uint64(IRQNoresize), 8},

		{"VFIO_IRQ_SET_DATA_NONE", vfioIrqSetDataNone, 1},
		{"VFIO_IRQ_SET_DATA_BOOL", vfioIrqSetDataBool, 2},
		{"VFIO_IRQ_SET_DATA_EVENTFD", vfioIrqSetDataEventfd, 4},
		{"VFIO_IRQ_SET_ACTION_MASK", vfioIrqSetActionMask, 8},
		{"VFIO_IRQ_SET_ACTION_UNMASK", vfioIrqSetActionUnmask, 16},
		{"VFIO_IRQ_SET_ACTION_TRIGGER", vfioIrqSetActionTrigger, 32},

		{"VFIO_IOMMU_INFO_PGSIZES", vfioIommuInfoPgsizes, 1},
		{"VFIO_IOMMU_INFO_CAPS", vfioIommuInfoCaps, 2},
		{"VFIO_IOMMU_TYPE1_INFO_CAP_IOVA_RANGE", vfioIommuType1InfoCapIovaRangeId, 1},
		{"VFIO_DMA_MAP_FLAG_READ", uint64(DMARead), 1},
		{"VFIO_DMA_MAP_FLAG_WRITE", uint64(DMAWrite), 2},

		{"VFIO_PCI_BAR0_REGION_INDEX", uint64(RegionBAR0), 0},
		{"VFIO_PCI_BAR1_REGION_INDEX", uint64(RegionBAR1), 1},
		{"VFIO_PCI_BAR2_REGION_INDEX", uint64(RegionBAR2), 2},
		{"VFIO_PCI_BAR3_REGION_INDEX", uint64(RegionBAR3), 3},
		{"VFIO_PCI_BAR4_REGION_INDEX", uint64(RegionBAR4), 4},
		{"VFIO_PCI_BAR5_REGION_INDEX", uint64(RegionBAR5), 5},
		{"VFIO_PCI_ROM_REGION_INDEX", uint64(RegionROM), 6},
		{"VFIO_PCI_CONFIG_REGION_INDEX", uint64(RegionConfig), 7},
		{"VFIO_PCI_VGA_REGION_INDEX", uint64(RegionVGA), 8},

		{"VFIO_PCI_INTX_IRQ_INDEX", uint64(IRQIntx), 0},
		{"VFIO_PCI_MSI_IRQ_INDEX", uint64(IRQMSI), 1},
		{"VFIO_PCI_MSIX_IRQ_INDEX", uint64(IRQMSIX), 2},
		{"VFIO_PCI_ERR_IRQ_INDEX", uint64(IRQErr), 3},
		{"VFIO_PCI_REQ_IRQ_INDEX", uint64(IRQReq), 4},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s = %#x, want %#x", tt.name, tt.got, tt.want)
		}
	}
}
