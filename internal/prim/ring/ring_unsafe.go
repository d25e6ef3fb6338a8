package ring

import (
	"fmt"
	"sync/atomic"
	"unsafe"
)

// The ring's shared words are accessed with 8-byte atomics so that a header
// store publishes everything written before it (x86-TSO and Go's memory
// model both order it) and a load never sees a torn word.

func word(b []byte, off int) *uint64 {
	if off < 0 || off > len(b)-8 {
		panic("ring: word outside region") // callers compute offsets from validated values
	}
	return (*uint64)(unsafe.Pointer(&b[off]))
}

func load64(b []byte, off int) uint64     { return atomic.LoadUint64(word(b, off)) }
func store64(b []byte, off int, v uint64) { atomic.StoreUint64(word(b, off), v) }

// checkAligned refuses memory whose words would not be 8-byte aligned:
// atomics on such words are neither atomic on every platform nor allowed
// by the race detector.
func checkAligned(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	if a := uintptr(unsafe.Pointer(&b[0])) & 7; a != 0 {
		return fmt.Errorf("region not 8-byte aligned (address ends %#x): %w", a, ErrLayout)
	}
	return nil
}
