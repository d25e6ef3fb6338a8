//go:build linux && !(mips || mipsle || mips64 || mips64le || ppc64 || ppc64le)

package vfio

// iocNone is _IO's direction field, _IOC_NONE << _IOC_DIRSHIFT, in
// include/uapi/asm-generic/ioctl.h: zero.
const iocNone = 0
