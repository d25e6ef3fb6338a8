//go:build linux

package vfio

import (
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ioctl is the package's only way into ioctl(2). The third argument is ptr
// when ptr is non-nil (memory the kernel reads or writes during the call and
// never keeps), otherwise the integer val.
func ioctl(fd, req uintptr, ptr unsafe.Pointer, val uintptr) (uintptr, error) {
	var r uintptr
	var errno unix.Errno
	if ptr != nil {
		r, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, req, uintptr(ptr))
		runtime.KeepAlive(ptr)
	} else {
		r, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, req, val)
	}
	if errno != 0 {
		return 0, errno
	}
	return r, nil
}

// ioctlBytes passes b's memory to the kernel for one ioctl.
func ioctlBytes(fd, req uintptr, b []byte) (uintptr, error) {
	return ioctl(fd, req, unsafe.Pointer(unsafe.SliceData(b)), 0)
}

// asBytes returns the memory of *p as a byte slice aliasing it. T must hold
// no pointers: it is used on the kernel ABI structs only.
func asBytes[T any](p *T) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(p)), unsafe.Sizeof(*p))
}

// addressOf returns the virtual address of b's first byte, for the kernel
// (VFIO_IOMMU_MAP_DMA). b must be mmap'd memory, never the Go heap.
func addressOf(b []byte) uint64 {
	return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b))))
}
