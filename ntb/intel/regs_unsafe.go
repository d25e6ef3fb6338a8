package intel

import (
	"sync/atomic"
	"unsafe"
)

// mmio is Regs over a mapped BAR0. 32- and 64-bit accesses are atomic
// loads and stores, which compile to single MOVs; 8- and 16-bit ones are
// plain loads and stores through a pointer, kept out of line so that the
// compiler cannot combine neighbouring ones into a wider access.
type mmio struct{ b []byte }

var _ Regs = mmio{}

func (m mmio) at(off, size int) unsafe.Pointer {
	if off < 0 || off > len(m.b)-size || off%size != 0 {
		panic("intel: register offset outside BAR0 or misaligned")
	}
	return unsafe.Pointer(&m.b[off])
}

func (m mmio) Write8(off int, v uint8)   { *(*uint8)(m.at(off, 1)) = v }
func (m mmio) Read16(off int) uint16     { return *(*uint16)(m.at(off, 2)) }
func (m mmio) Write16(off int, v uint16) { *(*uint16)(m.at(off, 2)) = v }
func (m mmio) Read32(off int) uint32     { return atomic.LoadUint32((*uint32)(m.at(off, 4))) }
func (m mmio) Write32(off int, v uint32) { atomic.StoreUint32((*uint32)(m.at(off, 4)), v) }
func (m mmio) Read64(off int) uint64     { return atomic.LoadUint64((*uint64)(m.at(off, 8))) }
func (m mmio) Write64(off int, v uint64) { atomic.StoreUint64((*uint64)(m.at(off, 8)), v) }

// alignedBytes returns n zeroed bytes, 8-byte aligned as a mapping is: the
// simulator's windows.
func alignedBytes(n int) []byte {
	w := make([]uint64, (n+7)/8)
	if len(w) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), n)
}
