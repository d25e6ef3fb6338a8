//go:build verbs && cgo && linux

package rdma

// #include <stdlib.h>
import "C"

import "unsafe"

// cBytes views n bytes of C memory (a registered ring) as a slice. The
// memory is not Go's: the slice is valid until the ring is freed, which
// happens only after the queue pair that may write it is destroyed.
func cBytes(p *C.char, n int) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(p)), n)
}
