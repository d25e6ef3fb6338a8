package vfio

import (
	"fmt"
	"math"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Mapping owns memory mmap'd by the package: a device region (MapRegion,
// MapBAR) or the memory of a DMABuffer.
type Mapping struct {
	mu sync.Mutex
	b  []byte // nil after Close
}

// Bytes returns the mapped memory, nil after Close. The slice is valid
// until Close: touching it afterwards faults and kills the process, so the
// owner closes a mapping only once every user of the slice is done. For a
// device region, accesses go straight to the device; use sync/atomic or
// fixed-width loads and stores where the device cares about access width.
func (m *Mapping) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.b
}

// Close unmaps the memory. It is idempotent.
func (m *Mapping) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.b == nil {
		return nil
	}
	err := unix.Munmap(m.b)
	m.b = nil
	if err != nil {
		return fmt.Errorf("munmap: %w", err)
	}
	return nil
}

// DMABuffer is page-aligned anonymous memory for a device to read or
// write once Container.MapDMA has given it an IOVA.
type DMABuffer struct {
	m Mapping
}

// NewDMABuffer maps size bytes, rounded up to whole pages, of zeroed
// memory. The memory is shared rather than private so that a fork never
// makes it copy-on-write under the device.
func NewDMABuffer(size int) (*DMABuffer, error) {
	page := unix.Getpagesize()
	if size <= 0 || size > math.MaxInt-page {
		return nil, fmt.Errorf("new dma buffer of %d bytes: invalid size", size)
	}
	size = (size + page - 1) / page * page
	b, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("new dma buffer of %d bytes: mmap: %w", size, err)
	}
	return &DMABuffer{m: Mapping{b: b}}, nil
}

// Bytes returns the buffer, nil after Close; see Mapping.Bytes.
func (b *DMABuffer) Bytes() []byte { return b.m.Bytes() }

// Close unmaps the buffer. It is idempotent. Unmap it from every container
// first: the IOMMU mapping keeps the pages pinned, and the device may still
// write them, after this process has let go of them.
func (b *DMABuffer) Close() error { return b.m.Close() }

// span returns the buffer's virtual address and length.
func (b *DMABuffer) span() (vaddr, size uint64, err error) {
	b.m.mu.Lock()
	defer b.m.mu.Unlock()
	if b.m.b == nil {
		return 0, 0, fmt.Errorf("dma buffer: %w", os.ErrClosed)
	}
	return addressOf(b.m.b), uint64(len(b.m.b)), nil
}
