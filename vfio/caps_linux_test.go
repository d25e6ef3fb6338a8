package vfio

import (
	"reflect"
	"slices"
	"strings"
	"testing"
)

// INFO answers built by hand the way the kernel lays them out: the fixed
// struct, then the capabilities back to back, each header's next pointing
// at the following one.

func capHeader(id uint16) vfioInfoCapHeader { return vfioInfoCapHeader{Id: id, Version: 1} }

func sparseCap(areas ...vfioRegionSparseMmapArea) []byte {
	c := vfioRegionInfoCapSparseMmap{Header: capHeader(vfioRegionInfoCapSparseMmapId), NrAreas: uint32(len(areas))}
	b := slices.Clone(asBytes(&c))
	for _, a := range areas {
		b = append(b, asBytes(&a)...)
	}
	return b
}

func typeCap(typ, subtype uint32) []byte {
	c := vfioRegionInfoCapType{Header: capHeader(vfioRegionInfoCapTypeId), Type: typ, Subtype: subtype}
	return slices.Clone(asBytes(&c))
}

func iovaCap(ranges ...vfioIovaRange) []byte {
	c := vfioIommuType1InfoCapIovaRange{Header: capHeader(vfioIommuType1InfoCapIovaRangeId), NrIovas: uint32(len(ranges))}
	b := slices.Clone(asBytes(&c))
	for _, r := range ranges {
		b = append(b, asBytes(&r)...)
	}
	return b
}

// chainCaps appends caps to fixed, linking their headers, and returns the
// buffer and the offset of the first capability (0 if none).
func chainCaps(fixed []byte, caps [][]byte) ([]byte, uint32) {
	buf := slices.Clone(fixed)
	var first uint32
	for i, c := range caps {
		off := uint32(len(buf))
		if i == 0 {
			first = off
		}
		var h vfioInfoCapHeader
		decodeAt(c, 0, &h)
		if i < len(caps)-1 {
			h.Next = off + uint32(len(c))
		}
		c = slices.Clone(c)
		copy(c, asBytes(&h))
		buf = append(buf, c...)
	}
	return buf, first
}

func regionInfoBuf(r vfioRegionInfo, caps ...[]byte) []byte {
	buf, first := chainCaps(asBytes(&r), caps)
	if first != 0 {
		r.Flags |= vfioRegionInfoFlagCaps
		r.CapOffset = first
	}
	r.Argsz = uint32(len(buf))
	copy(buf, asBytes(&r))
	return buf
}

func iommuInfoBuf(r vfioIommuType1Info, caps ...[]byte) []byte {
	buf, first := chainCaps(asBytes(&r), caps)
	if first != 0 {
		r.Flags |= vfioIommuInfoCaps
		r.CapOffset = first
	}
	r.Argsz = uint32(len(buf))
	copy(buf, asBytes(&r))
	return buf
}

// setU32 overwrites the little pieces of a buffer the malformed cases need.
func setU32(buf []byte, off int, v uint32) []byte {
	buf = slices.Clone(buf)
	x := v
	copy(buf[off:], asBytes(&x))
	return buf
}

const (
	capOffsetField = 12 // vfio_region_info.cap_offset
	firstCap       = 32 // sizeof(struct vfio_region_info)
	nextField      = 4  // vfio_info_cap_header.next
	countField     = 8  // nr_areas, nr_iovas: the count after a capability header
)

var bar0 = vfioRegionInfo{
	Index:  0,
	Flags:  uint32(RegionRead | RegionWrite | RegionMmap),
	Size:   0x4000,
	Offset: 0,
}

func TestParseRegionInfo(t *testing.T) {
	tests := []struct {
		name string
		buf  []byte
		want RegionInfo
	}{
		{
			name: "no caps",
			buf:  regionInfoBuf(vfioRegionInfo{Index: 2, Flags: uint32(RegionRead | RegionMmap), Size: 1 << 20, Offset: 2 << 40}),
			want: RegionInfo{Index: 2, Flags: RegionRead | RegionMmap, Size: 1 << 20, Offset: 2 << 40},
		},
		{
			name: "sparse and type",
			buf: regionInfoBuf(bar0,
				sparseCap(vfioRegionSparseMmapArea{Offset: 0, Size: 0x1000}, vfioRegionSparseMmapArea{Offset: 0x3000, Size: 0x1000}),
				typeCap(1<<31|0x8086, 1)),
			want: RegionInfo{
				Flags: RegionRead | RegionWrite | RegionMmap, Size: 0x4000,
				SparseAreas: []SparseArea{{0, 0x1000}, {0x3000, 0x1000}},
				Type:        &RegionType{Type: 1<<31 | 0x8086, Subtype: 1},
			},
		},
		{
			name: "no sparse areas means no mmap",
			buf:  regionInfoBuf(bar0, sparseCap()),
			want: RegionInfo{Flags: RegionRead | RegionWrite | RegionMmap, Size: 0x4000, SparseAreas: []SparseArea{}},
		},
		{
			name: "unknown capability skipped",
			buf:  regionInfoBuf(bar0, slices.Concat(asBytes(&vfioInfoCapHeader{Id: 99}), make([]byte, 8)), typeCap(2, 3)),
			want: RegionInfo{Flags: RegionRead | RegionWrite | RegionMmap, Size: 0x4000, Type: &RegionType{2, 3}},
		},
		{
			// The kernel's answer when argsz is too small for the chain.
			name: "caps flag without chain",
			buf:  regionInfoBuf(vfioRegionInfo{Flags: vfioRegionInfoFlagCaps, Size: 8}),
			want: RegionInfo{Size: 8},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseRegionInfo(tt.buf)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// malformedRegionInfo are answers parseRegionInfo must refuse, each with a
// word its error must contain.
func malformedRegionInfo() []struct {
	name, want string
	buf        []byte
} {
	two := regionInfoBuf(bar0, typeCap(1, 1), sparseCap(vfioRegionSparseMmapArea{Size: 0x1000}))
	secondCap := firstCap + 16
	return []struct {
		name, want string
		buf        []byte
	}{
		{"truncated struct", "truncated", regionInfoBuf(bar0)[:31]},
		{"chain inside struct", "inside", setU32(two, capOffsetField, 8)},
		{"chain beyond buffer", "beyond", setU32(two, capOffsetField, uint32(len(two)))},
		{"header cut short", "beyond", setU32(two, capOffsetField, uint32(len(two)-4))},
		{"self loop", "loop", setU32(two, firstCap+nextField, firstCap)},
		{"backward loop", "loop", setU32(two, secondCap+nextField, firstCap)},
		{"next inside header", "loop", setU32(two, firstCap+nextField, firstCap+4)},
		{"next beyond buffer", "beyond", setU32(two, firstCap+nextField, 1<<31)},
		{"too many areas", "do not fit", setU32(two, secondCap+countField, 0xffffffff)},
		{"area past region", "outside", regionInfoBuf(bar0, sparseCap(vfioRegionSparseMmapArea{Offset: 0x3000, Size: 0x2000}))},
		{"area wraps", "outside", regionInfoBuf(bar0, sparseCap(vfioRegionSparseMmapArea{Offset: 1<<64 - 0x1000, Size: 0x2000}))},
		{"type cap truncated", "truncated", regionInfoBuf(bar0, typeCap(1, 1)[:12])},
		{"sparse cap truncated", "truncated", regionInfoBuf(bar0, sparseCap()[:12])},
	}
}

func TestParseRegionInfoMalformed(t *testing.T) {
	for _, tt := range malformedRegionInfo() {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseRegionInfo(tt.buf)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("parseRegionInfo = %+v, %v; want error containing %q", got, err, tt.want)
			}
		})
	}
}

func TestParseIOMMUInfo(t *testing.T) {
	full := vfioIovaRange{Start: 0, End: 0xfedfffff}
	high := vfioIovaRange{Start: 0xfef00000, End: 1<<48 - 1}
	tests := []struct {
		name string
		buf  []byte
		want IOMMUInfo
	}{
		{"page sizes", iommuInfoBuf(vfioIommuType1Info{Flags: vfioIommuInfoPgsizes, IovaPgsizes: 0x40201000}), IOMMUInfo{PageSizes: 0x40201000}},
		{"page sizes not reported", iommuInfoBuf(vfioIommuType1Info{IovaPgsizes: 0x1000}), IOMMUInfo{}},
		{
			"iova ranges",
			iommuInfoBuf(vfioIommuType1Info{Flags: vfioIommuInfoPgsizes, IovaPgsizes: 0x1000}, iovaCap(full, high)),
			IOMMUInfo{PageSizes: 0x1000, IOVARanges: []IOVARange{{0, 0xfedfffff}, {0xfef00000, 1<<48 - 1}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseIOMMUInfo(tt.buf)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}

	bad := []struct {
		name, want string
		buf        []byte
	}{
		{"truncated struct", "truncated", iommuInfoBuf(vfioIommuType1Info{})[:16]},
		{"range ends before start", "ends before", iommuInfoBuf(vfioIommuType1Info{}, iovaCap(vfioIovaRange{Start: 2, End: 1}))},
		{"too many ranges", "do not fit", setU32(iommuInfoBuf(vfioIommuType1Info{}, iovaCap(full)), int(sizeof[vfioIommuType1Info]())+countField, 2)},
		{"range cap truncated", "truncated", iommuInfoBuf(vfioIommuType1Info{}, iovaCap()[:8])},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseIOMMUInfo(tt.buf)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("parseIOMMUInfo = %+v, %v; want error containing %q", got, err, tt.want)
			}
		})
	}
}

// FuzzParseCaps feeds arbitrary kernel answers to both INFO decoders: they
// must not panic, and whatever they accept must lie inside the buffer they
// were given and inside the region it describes.
func FuzzParseCaps(f *testing.F) {
	f.Add(regionInfoBuf(bar0))
	f.Add(regionInfoBuf(bar0, sparseCap(vfioRegionSparseMmapArea{Size: 0x1000}), typeCap(1, 2)))
	f.Add(iommuInfoBuf(vfioIommuType1Info{Flags: vfioIommuInfoPgsizes, IovaPgsizes: 0x1000}, iovaCap(vfioIovaRange{End: 0xfedfffff})))
	for _, tt := range malformedRegionInfo() {
		f.Add(tt.buf)
	}
	f.Fuzz(func(t *testing.T, buf []byte) {
		if info, err := parseRegionInfo(buf); err == nil {
			if len(info.SparseAreas) > len(buf)/int(sizeof[vfioRegionSparseMmapArea]()) {
				t.Fatalf("%d sparse areas from a %d-byte buffer", len(info.SparseAreas), len(buf))
			}
			for _, a := range info.SparseAreas {
				if a.Size > info.Size || a.Offset > info.Size-a.Size {
					t.Fatalf("area %+v outside the %#x-byte region", a, info.Size)
				}
			}
		}
		if info, err := parseIOMMUInfo(buf); err == nil {
			if len(info.IOVARanges) > len(buf)/int(sizeof[vfioIovaRange]()) {
				t.Fatalf("%d iova ranges from a %d-byte buffer", len(info.IOVARanges), len(buf))
			}
			for _, r := range info.IOVARanges {
				if r.Start > r.End {
					t.Fatalf("range %+v ends before it starts", r)
				}
			}
		}
	})
}
