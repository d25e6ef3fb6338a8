package guest

import (
	"sync/atomic"
	"unsafe"
)

// Words of the shared memory are read and written atomically: the other
// guest (a different QEMU process) accesses them concurrently.

func word(mem []byte, off int) *uint64 {
	if off < 0 || off > len(mem)-8 || off%8 != 0 {
		panic("guest: shared word outside the shared memory")
	}
	return (*uint64)(unsafe.Pointer(&mem[off]))
}

func load64(mem []byte, off int) uint64     { return atomic.LoadUint64(word(mem, off)) }
func store64(mem []byte, off int, v uint64) { atomic.StoreUint64(word(mem, off), v) }
