//go:build linux

package vfio

import (
	"testing"
	"unsafe"
)

// TestABILayout checks every mirrored struct's size and field offsets
// against the kernel's C layout, written out in each comment. Flexible
// array members are checked as the struct's size: that is where they start.
func TestABILayout(t *testing.T) {
	type field struct {
		name      string
		got, want uintptr
	}
	var (
		gs  vfioGroupStatus
		di  vfioDeviceInfo
		ri  vfioRegionInfo
		ch  vfioInfoCapHeader
		sa  vfioRegionSparseMmapArea
		sm  vfioRegionInfoCapSparseMmap
		ct  vfioRegionInfoCapType
		ii  vfioIrqInfo
		is  vfioIrqSet
		io  vfioIommuType1Info
		ir  vfioIovaRange
		irc vfioIommuType1InfoCapIovaRange
		dm  vfioIommuType1DmaMap
		du  vfioIommuType1DmaUnmap
	)
	// On 64-bit targets __u64 is 8-byte aligned, so vfio_iommu_type1_info
	// has 4 bytes of tail padding; 32-bit Go, like i386 C, has none. The
	// kernel reads only up to cap_offset, so either size works as argsz.
	iommuInfoSize := uintptr(24)
	if unsafe.Sizeof(uintptr(0)) == 4 {
		iommuInfoSize = 20
	}
	tests := []struct {
		name       string
		size, want uintptr
		fields     []field
	}{
		// struct vfio_group_status {   // 8 bytes
		//   __u32 argsz;                //  0
		//   __u32 flags;                //  4
		// };
		{"vfio_group_status", unsafe.Sizeof(gs), 8, []field{
			{"argsz", unsafe.Offsetof(gs.Argsz), 0},
			{"flags", unsafe.Offsetof(gs.Flags), 4},
		}},
		// struct vfio_device_info {    // 24 bytes (20 before pad was added)
		//   __u32 argsz;                //  0
		//   __u32 flags;                //  4
		//   __u32 num_regions;          //  8
		//   __u32 num_irqs;             // 12
		//   __u32 cap_offset;           // 16
		//   __u32 pad;                  // 20
		// };
		{"vfio_device_info", unsafe.Sizeof(di), 24, []field{
			{"argsz", unsafe.Offsetof(di.Argsz), 0},
			{"flags", unsafe.Offsetof(di.Flags), 4},
			{"num_regions", unsafe.Offsetof(di.NumRegions), 8},
			{"num_irqs", unsafe.Offsetof(di.NumIrqs), 12},
			{"cap_offset", unsafe.Offsetof(di.CapOffset), 16},
			{"pad", unsafe.Offsetof(di.Pad), 20},
		}},
		// struct vfio_region_info {    // 32 bytes
		//   __u32 argsz;                //  0
		//   __u32 flags;                //  4
		//   __u32 index;                //  8
		//   __u32 cap_offset;           // 12
		//   __aligned_u64 size;         // 16
		//   __aligned_u64 offset;       // 24
		// };
		{"vfio_region_info", unsafe.Sizeof(ri), 32, []field{
			{"argsz", unsafe.Offsetof(ri.Argsz), 0},
			{"flags", unsafe.Offsetof(ri.Flags), 4},
			{"index", unsafe.Offsetof(ri.Index), 8},
			{"cap_offset", unsafe.Offsetof(ri.CapOffset), 12},
			{"size", unsafe.Offsetof(ri.Size), 16},
			{"offset", unsafe.Offsetof(ri.Offset), 24},
		}},
		// struct vfio_info_cap_header { // 8 bytes
		//   __u16 id;                   //  0
		//   __u16 version;              //  2
		//   __u32 next;                 //  4
		// };
		{"vfio_info_cap_header", unsafe.Sizeof(ch), 8, []field{
			{"id", unsafe.Offsetof(ch.Id), 0},
			{"version", unsafe.Offsetof(ch.Version), 2},
			{"next", unsafe.Offsetof(ch.Next), 4},
		}},
		// struct vfio_region_sparse_mmap_area { // 16 bytes
		//   __aligned_u64 offset;       //  0
		//   __aligned_u64 size;         //  8
		// };
		{"vfio_region_sparse_mmap_area", unsafe.Sizeof(sa), 16, []field{
			{"offset", unsafe.Offsetof(sa.Offset), 0},
			{"size", unsafe.Offsetof(sa.Size), 8},
		}},
		// struct vfio_region_info_cap_sparse_mmap { // 16 bytes + areas
		//   struct vfio_info_cap_header header; //  0
		//   __u32 nr_areas;             //  8
		//   __u32 reserved;             // 12
		//   struct vfio_region_sparse_mmap_area areas[]; // 16
		// };
		{"vfio_region_info_cap_sparse_mmap", unsafe.Sizeof(sm), 16, []field{
			{"header", unsafe.Offsetof(sm.Header), 0},
			{"nr_areas", unsafe.Offsetof(sm.NrAreas), 8},
			{"reserved", unsafe.Offsetof(sm.Reserved), 12},
		}},
		// struct vfio_region_info_cap_type { // 16 bytes
		//   struct vfio_info_cap_header header; //  0
		//   __u32 type;                 //  8
		//   __u32 subtype;              // 12
		// };
		{"vfio_region_info_cap_type", unsafe.Sizeof(ct), 16, []field{
			{"header", unsafe.Offsetof(ct.Header), 0},
			{"type", unsafe.Offsetof(ct.Type), 8},
			{"subtype", unsafe.Offsetof(ct.Subtype), 12},
		}},
		// struct vfio_irq_info {       // 16 bytes
		//   __u32 argsz;                //  0
		//   __u32 flags;                //  4
		//   __u32 index;                //  8
		//   __u32 count;                // 12
		// };
		{"vfio_irq_info", unsafe.Sizeof(ii), 16, []field{
			{"argsz", unsafe.Offsetof(ii.Argsz), 0},
			{"flags", unsafe.Offsetof(ii.Flags), 4},
			{"index", unsafe.Offsetof(ii.Index), 8},
			{"count", unsafe.Offsetof(ii.Count), 12},
		}},
		// struct vfio_irq_set {        // 20 bytes + data
		//   __u32 argsz;                //  0
		//   __u32 flags;                //  4
		//   __u32 index;                //  8
		//   __u32 start;                // 12
		//   __u32 count;                // 16
		//   __u8  data[];               // 20
		// };
		{"vfio_irq_set", unsafe.Sizeof(is), 20, []field{
			{"argsz", unsafe.Offsetof(is.Argsz), 0},
			{"flags", unsafe.Offsetof(is.Flags), 4},
			{"index", unsafe.Offsetof(is.Index), 8},
			{"start", unsafe.Offsetof(is.Start), 12},
			{"count", unsafe.Offsetof(is.Count), 16},
		}},
		// struct vfio_iommu_type1_info { // 24 bytes on 64-bit (see above)
		//   __u32 argsz;                //  0
		//   __u32 flags;                //  4
		//   __u64 iova_pgsizes;         //  8
		//   __u32 cap_offset;           // 16
		// };
		{"vfio_iommu_type1_info", unsafe.Sizeof(io), iommuInfoSize, []field{
			{"argsz", unsafe.Offsetof(io.Argsz), 0},
			{"flags", unsafe.Offsetof(io.Flags), 4},
			{"iova_pgsizes", unsafe.Offsetof(io.IovaPgsizes), 8},
			{"cap_offset", unsafe.Offsetof(io.CapOffset), 16},
		}},
		// struct vfio_iova_range {     // 16 bytes
		//   __u64 start;                //  0
		//   __u64 end;                  //  8
		// };
		{"vfio_iova_range", unsafe.Sizeof(ir), 16, []field{
			{"start", unsafe.Offsetof(ir.Start), 0},
			{"end", unsafe.Offsetof(ir.End), 8},
		}},
		// struct vfio_iommu_type1_info_cap_iova_range { // 16 bytes + ranges
		//   struct vfio_info_cap_header header; //  0
		//   __u32 nr_iovas;             //  8
		//   __u32 reserved;             // 12
		//   struct vfio_iova_range iova_ranges[]; // 16
		// };
		{"vfio_iommu_type1_info_cap_iova_range", unsafe.Sizeof(irc), 16, []field{
			{"header", unsafe.Offsetof(irc.Header), 0},
			{"nr_iovas", unsafe.Offsetof(irc.NrIovas), 8},
			{"reserved", unsafe.Offsetof(irc.Reserved), 12},
		}},
		// struct vfio_iommu_type1_dma_map { // 32 bytes
		//   __u32 argsz;                //  0
		//   __u32 flags;                //  4
		//   __u64 vaddr;                //  8
		//   __u64 iova;                 // 16
		//   __u64 size;                 // 24
		// };
		{"vfio_iommu_type1_dma_map", unsafe.Sizeof(dm), 32, []field{
			{"argsz", unsafe.Offsetof(dm.Argsz), 0},
			{"flags", unsafe.Offsetof(dm.Flags), 4},
			{"vaddr", unsafe.Offsetof(dm.Vaddr), 8},
			{"iova", unsafe.Offsetof(dm.Iova), 16},
			{"size", unsafe.Offsetof(dm.Size), 24},
		}},
		// struct vfio_iommu_type1_dma_unmap { // 24 bytes + data
		//   __u32 argsz;                //  0
		//   __u32 flags;                //  4
		//   __u64 iova;                 //  8
		//   __u64 size;                 // 16
		//   __u8  data[];               // 24
		// };
		{"vfio_iommu_type1_dma_unmap", unsafe.Sizeof(du), 24, []field{
			{"argsz", unsafe.Offsetof(du.Argsz), 0},
			{"flags", unsafe.Offsetof(du.Flags), 4},
			{"iova", unsafe.Offsetof(du.Iova), 8},
			{"size", unsafe.Offsetof(du.Size), 16},
		}},
	}
	for _, tt := range tests {
		if tt.size != tt.want {
			t.Errorf("sizeof(struct %s) = %d, want %d", tt.name, tt.size, tt.want)
		}
		for _, f := range tt.fields {
			if f.got != f.want {
				t.Errorf("offsetof(struct %s, %s) = %d, want %d", tt.name, f.name, f.got, f.want)
			}
		}
	}
}
