package vfio

import "fmt"

// Decoding of INFO answers and their capability chains. The chain is drawn
// from bytes the kernel wrote into a buffer whose size it chose, so every
// offset and count is checked against the buffer before use (in uint64, so
// no sum can wrap) and a malformed chain is an error, never a panic:
//
//	0            fixed struct (vfio_region_info: 32 bytes)
//	cap_offset → header {id, version, next} | id-specific fields ...
//	next       → header {id, version, next=0} | ...
//	len(buf)
//
// Each entry is taken to end where the next begins (or at the end of the
// buffer), which is how the kernel lays them out.

// capability is one entry of a chain: its id and its bytes, header first.
type capability struct {
	id   uint16
	data []byte
}

// walkCaps follows the chain of the INFO buffer buf from offset first (0:
// no chain); fixedSize is the size of the INFO struct the chain follows.
// Entries must move strictly forward by at least a header, so a loop is an
// error and the walk ends after at most len(buf)/8 entries.
func walkCaps(buf []byte, first, fixedSize uint32) ([]capability, error) {
	if first == 0 {
		return nil, nil
	}
	if first < fixedSize {
		return nil, fmt.Errorf("capability chain starts at %d, inside the %d-byte info struct", first, fixedSize)
	}
	hdrSize := uint64(sizeof[vfioInfoCapHeader]())
	var caps []capability
	for off := uint64(first); off != 0; {
		var h vfioInfoCapHeader
		if !decodeAt(buf, off, &h) {
			return nil, fmt.Errorf("capability at %d: header beyond the %d-byte buffer", off, len(buf))
		}
		end, next := uint64(len(buf)), uint64(h.Next)
		if next != 0 {
			if next < off+hdrSize {
				return nil, fmt.Errorf("capability at %d: next at %d does not move forward (loop)", off, next)
			}
			if next > end {
				return nil, fmt.Errorf("capability at %d: next at %d beyond the %d-byte buffer", off, next, len(buf))
			}
			end = next
		}
		caps = append(caps, capability{id: h.Id, data: buf[off:end]})
		off = next
	}
	return caps, nil
}

// parseRegionInfo decodes a VFIO_DEVICE_GET_REGION_INFO answer. Unknown
// capabilities are skipped.
func parseRegionInfo(buf []byte) (RegionInfo, error) {
	var r vfioRegionInfo
	if !decodeAt(buf, 0, &r) {
		return RegionInfo{}, fmt.Errorf("region info truncated to %d bytes", len(buf))
	}
	info := RegionInfo{
		Index:  RegionIndex(r.Index),
		Flags:  RegionFlags(r.Flags) & (RegionRead | RegionWrite | RegionMmap), // not CAPS: decoded here
		Size:   r.Size,
		Offset: r.Offset,
	}
	if r.Flags&vfioRegionInfoFlagCaps == 0 {
		return info, nil
	}
	caps, err := walkCaps(buf, r.CapOffset, sizeof[vfioRegionInfo]())
	if err != nil {
		return RegionInfo{}, err
	}
	for _, c := range caps {
		switch c.id {
		case vfioRegionInfoCapSparseMmapId:
			if info.SparseAreas, err = parseSparseMmap(c.data, r.Size); err != nil {
				return RegionInfo{}, err
			}
		case vfioRegionInfoCapTypeId:
			var t vfioRegionInfoCapType
			if !decodeAt(c.data, 0, &t) {
				return RegionInfo{}, fmt.Errorf("region type capability truncated to %d bytes", len(c.data))
			}
			info.Type = &RegionType{Type: t.Type, Subtype: t.Subtype}
		}
	}
	return info, nil
}

// parseSparseMmap decodes a sparse mmap capability of a region of
// regionSize bytes. The result is non-nil: no areas means no mmap at all.
func parseSparseMmap(data []byte, regionSize uint64) ([]SparseArea, error) {
	var s vfioRegionInfoCapSparseMmap
	if !decodeAt(data, 0, &s) {
		return nil, fmt.Errorf("sparse mmap capability truncated to %d bytes", len(data))
	}
	hdrSize, areaSize := uint64(sizeof[vfioRegionInfoCapSparseMmap]()), uint64(sizeof[vfioRegionSparseMmapArea]())
	if uint64(s.NrAreas) > (uint64(len(data))-hdrSize)/areaSize {
		return nil, fmt.Errorf("sparse mmap capability: %d areas do not fit in %d bytes", s.NrAreas, len(data))
	}
	areas := make([]SparseArea, s.NrAreas)
	for i := range areas {
		var a vfioRegionSparseMmapArea
		decodeAt(data, hdrSize+uint64(i)*areaSize, &a) // fits: checked above
		if a.Size > regionSize || a.Offset > regionSize-a.Size {
			return nil, fmt.Errorf("sparse mmap area %d [%#x, +%#x) outside the %#x-byte region", i, a.Offset, a.Size, regionSize)
		}
		areas[i] = SparseArea(a)
	}
	return areas, nil
}

// parseIOMMUInfo decodes a VFIO_IOMMU_GET_INFO answer. Unknown capabilities
// are skipped.
func parseIOMMUInfo(buf []byte) (IOMMUInfo, error) {
	var r vfioIommuType1Info
	if !decodeAt(buf, 0, &r) {
		return IOMMUInfo{}, fmt.Errorf("iommu info truncated to %d bytes", len(buf))
	}
	var info IOMMUInfo
	if r.Flags&vfioIommuInfoPgsizes != 0 {
		info.PageSizes = r.IovaPgsizes
	}
	if r.Flags&vfioIommuInfoCaps == 0 {
		return info, nil
	}
	caps, err := walkCaps(buf, r.CapOffset, sizeof[vfioIommuType1Info]())
	if err != nil {
		return IOMMUInfo{}, err
	}
	for _, c := range caps {
		if c.id != vfioIommuType1InfoCapIovaRangeId {
			continue
		}
		if info.IOVARanges, err = parseIOVARanges(c.data); err != nil {
			return IOMMUInfo{}, err
		}
	}
	return info, nil
}

// parseIOVARanges decodes an IOVA range capability.
func parseIOVARanges(data []byte) ([]IOVARange, error) {
	var c vfioIommuType1InfoCapIovaRange
	if !decodeAt(data, 0, &c) {
		return nil, fmt.Errorf("iova range capability truncated to %d bytes", len(data))
	}
	hdrSize, rangeSize := uint64(sizeof[vfioIommuType1InfoCapIovaRange]()), uint64(sizeof[vfioIovaRange]())
	if uint64(c.NrIovas) > (uint64(len(data))-hdrSize)/rangeSize {
		return nil, fmt.Errorf("iova range capability: %d ranges do not fit in %d bytes", c.NrIovas, len(data))
	}
	ranges := make([]IOVARange, c.NrIovas)
	for i := range ranges {
		var r vfioIovaRange
		decodeAt(data, hdrSize+uint64(i)*rangeSize, &r) // fits: checked above
		if r.Start > r.End {
			return nil, fmt.Errorf("iova range %d [%#x, %#x] ends before it starts", i, r.Start, r.End)
		}
		ranges[i] = IOVARange{Start: IOVA(r.Start), End: IOVA(r.End)}
	}
	return ranges, nil
}
