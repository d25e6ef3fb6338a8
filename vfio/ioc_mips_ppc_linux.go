//go:build linux && (mips || mipsle || mips64 || mips64le || ppc64 || ppc64le)

package vfio

// iocNone is _IO's direction field, _IOC_NONE << _IOC_DIRSHIFT: MIPS and
// PowerPC define _IOC_NONE as 1 and shift it by 29
// (arch/{mips,powerpc}/include/uapi/asm/ioctl.h).
const iocNone = 1 << 29
