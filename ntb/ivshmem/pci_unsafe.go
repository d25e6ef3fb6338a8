package ivshmem

import (
	"sync/atomic"
	"unsafe"
)

// Device registers are accessed with exactly one 32-bit load or store each:
// QEMU's ivshmem register block (like a real NTB's) takes 4-byte accesses
// only, and a Go copy or binary.LittleEndian.PutUint32 may be split into
// byte accesses.

func mmioPtr(b []byte, off int) *uint32 {
	if off < 0 || off > len(b)-4 || off%4 != 0 {
		panic("ivshmem: register offset outside the register block")
	}
	return (*uint32)(unsafe.Pointer(&b[off]))
}

func mmioLoad32(b []byte, off int) uint32     { return atomic.LoadUint32(mmioPtr(b, off)) }
func mmioStore32(b []byte, off int, v uint32) { atomic.StoreUint32(mmioPtr(b, off), v) }
