package pool

import "unsafe"

// unsafeBytes views w as bytes: heap memory 8-byte aligned, as a mapping is.
func unsafeBytes(w []uint64) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), 8*len(w)) }

// addr is the address of b's first byte, for checking where a slice lies.
func addr(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }
