package shmem

import (
	"encoding/binary"
	"math/bits"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/ntstack/ntstack/internal/prim/proc"
)

// nativeLE is true on little-endian CPUs, where no swap is needed: the
// atomics are native endian, the shared layout little endian.
var nativeLE = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

func (m Mem) ptr(off, size int) unsafe.Pointer {
	if off < 0 || off > len(m)-size || off%size != 0 {
		panic("shmem: word offset outside its block or misaligned")
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

// Load32 reads the 32-bit word at off.
func (m Mem) Load32(off int) uint32 { return le32(atomic.LoadUint32((*uint32)(m.ptr(off, 4)))) }

// Store32 writes the 32-bit word at off.
func (m Mem) Store32(off int, v uint32) { atomic.StoreUint32((*uint32)(m.ptr(off, 4)), le32(v)) }

// Load64 reads the 64-bit word at off.
func (m Mem) Load64(off int) uint64 { return le64(atomic.LoadUint64((*uint64)(m.ptr(off, 8)))) }

// Store64 writes the 64-bit word at off.
func (m Mem) Store64(off int, v uint64) { atomic.StoreUint64((*uint64)(m.ptr(off, 8)), le64(v)) }

// Aligned8 reports whether b starts on an 8-byte boundary, as a mapping
// does; 64-bit atomics need it.
func Aligned8(b []byte) bool {
	return len(b) > 0 && uintptr(unsafe.Pointer(&b[0]))%8 == 0
}

// Wait32 sleeps while the 32-bit word at off holds v, at most timeout (no
// limit if timeout ≤ 0), woken early by Wake32 on the same word from any
// process that maps it. Spurious returns happen: callers check again.
func (m Mem) Wait32(off int, v uint32, timeout time.Duration) {
	proc.FutexWait((*uint32)(m.ptr(off, 4)), le32(v), timeout)
}

// Wake32 wakes every Wait32 on the word at off.
func (m Mem) Wake32(off int) { proc.FutexWake((*uint32)(m.ptr(off, 4))) }
