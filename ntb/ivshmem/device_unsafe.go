package ivshmem

import (
	"encoding/binary"
	"math/bits"
	"sync/atomic"
	"unsafe"
)

// deviceMem is a piece of the ivshmem region that other attachments, in
// other processes or guests, access concurrently: every access is atomic,
// and every word is little endian whatever the CPU (the atomics are native
// endian, so a big-endian CPU swaps). Offsets are the layout constants of
// device_layout.go, never values read from the region, so an offset outside
// the slice is a bug and panics.
type deviceMem []byte

// nativeLE is true on little-endian CPUs, where no swap is needed.
var nativeLE = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

func (m deviceMem) ptr(off, size int) unsafe.Pointer {
	if off < 0 || off > len(m)-size || off%size != 0 {
		panic("ivshmem: register offset outside its block")
	}
	return unsafe.Pointer(&m[off])
}

func le32(v uint32) uint32 {
	if nativeLE {
		return v
	}
	return bits.ReverseBytes32(v)
}

func le64(v uint64) uint64 {
	if nativeLE {
		return v
	}
	return bits.ReverseBytes64(v)
}

func (m deviceMem) load32(off int) uint32 { return le32(atomic.LoadUint32((*uint32)(m.ptr(off, 4)))) }
func (m deviceMem) store32(off int, v uint32) {
	atomic.StoreUint32((*uint32)(m.ptr(off, 4)), le32(v))
}
func (m deviceMem) load64(off int) uint64 { return le64(atomic.LoadUint64((*uint64)(m.ptr(off, 8)))) }
func (m deviceMem) store64(off int, v uint64) {
	atomic.StoreUint64((*uint64)(m.ptr(off, 8)), le64(v))
}

// aligned8 reports whether b starts on an 8-byte boundary, as a mapping
// does; 64-bit atomics need it.
func aligned8(b []byte) bool {
	return len(b) > 0 && uintptr(unsafe.Pointer(&b[0]))%8 == 0
}
