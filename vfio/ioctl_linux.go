package vfio

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
)

// vfioFile owns an open VFIO file: the container, a group or a device.
// Its methods hold the descriptor open for the duration of each call, so a
// concurrent Close never lets an ioctl reach a recycled descriptor number.
type vfioFile struct {
	f         *os.File
	closeOnce sync.Once
	closeErr  error
}

// control runs fn with the raw descriptor, or returns os.ErrClosed.
func (v *vfioFile) control(fn func(fd uintptr) error) error {
	rc, err := v.f.SyscallConn()
	if err != nil {
		return err
	}
	var fnErr error
	if err := rc.Control(func(fd uintptr) { fnErr = fn(fd) }); err != nil {
		return os.ErrClosed // Control fails only once Close has begun
	}
	return fnErr
}

// ioctlVal issues an ioctl whose argument is an integer (or unused).
func (v *vfioFile) ioctlVal(req, val uintptr) (uintptr, error) {
	var r uintptr
	err := v.control(func(fd uintptr) (err error) {
		r, err = ioctl(fd, req, nil, val)
		return err
	})
	return r, err
}

// ioctlBuf issues an ioctl whose argument points at b.
func (v *vfioFile) ioctlBuf(req uintptr, b []byte) (uintptr, error) {
	var r uintptr
	err := v.control(func(fd uintptr) (err error) {
		r, err = ioctlBytes(fd, req, b)
		return err
	})
	return r, err
}

func (v *vfioFile) close() error {
	v.closeOnce.Do(func() { v.closeErr = v.f.Close() })
	return v.closeErr
}

// sizeof returns the size of the ABI struct T, for its argsz field.
func sizeof[T any]() uint32 {
	var v T
	return uint32(len(asBytes(&v)))
}

// decodeAt copies the ABI struct at buf[off:] into *v. It reports false,
// leaving *v alone, if the struct does not fit in buf.
func decodeAt[T any](buf []byte, off uint64, v *T) bool {
	b := asBytes(v)
	if off > uint64(len(buf)) || uint64(len(b)) > uint64(len(buf))-off {
		return false
	}
	copy(b, buf[off:])
	return true
}

// Every VFIO INFO struct starts with __u32 argsz: the caller's buffer size
// on input, the size the kernel needs on output.
const (
	argszOffset = 0
	maxInfoSize = 64 << 10 // capability chains are a few hundred bytes
)

// queryInfo runs an INFO ioctl that may append a capability chain. req is
// the fixed struct, encoded, with argsz = len(req). When the kernel answers
// that the chain needs a bigger buffer it retries with the size asked for.
// It returns the kernel's answer: the struct, then the chain if any.
func (v *vfioFile) queryInfo(op uintptr, req []byte) ([]byte, error) {
	buf := req
	for range 3 { // the chain can grow between calls; it does not keep growing
		if _, err := v.ioctlBuf(op, buf); err != nil {
			return nil, err
		}
		need := binary.NativeEndian.Uint32(buf[argszOffset:])
		if uint64(need) <= uint64(len(buf)) {
			return buf, nil
		}
		if need > maxInfoSize {
			return nil, fmt.Errorf("kernel asks for a %d-byte info buffer", need)
		}
		grown := make([]byte, need)
		copy(grown, buf) // the request fields, and argsz = need
		buf = grown
	}
	return nil, errors.New("capability chain keeps growing")
}
