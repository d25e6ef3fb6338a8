package ntbtest

import "unsafe"

// unsafeBytes views a []uint64 as bytes, giving an 8-byte aligned []byte.
func unsafeBytes(w []uint64) []byte {
	if len(w) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), 8*len(w))
}
