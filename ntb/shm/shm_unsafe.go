package shm

import (
	"encoding/binary"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

var le = binary.LittleEndian

// futex(2) operations (linux/futex.h); x/sys/unix does not define them.
const (
	futexWaitOp = 0 // FUTEX_WAIT
	futexWakeOp = 1 // FUTEX_WAKE
)

// Registers are shared with another process: every access is atomic.

func ptr(b []byte, off, size int) unsafe.Pointer {
	if off < 0 || off > len(b)-size {
		panic("shm: register offset outside the register block")
	}
	return unsafe.Pointer(&b[off])
}

func load32(b []byte, off int) uint32     { return atomic.LoadUint32((*uint32)(ptr(b, off, 4))) }
func store32(b []byte, off int, v uint32) { atomic.StoreUint32((*uint32)(ptr(b, off, 4)), v) }
func load64(b []byte, off int) uint64     { return atomic.LoadUint64((*uint64)(ptr(b, off, 8))) }
func store64(b []byte, off int, v uint64) { atomic.StoreUint64((*uint64)(ptr(b, off, 8)), v) }

// futexWait sleeps while the shared word at off holds val, at most d.
// Spurious returns are fine: callers re-check.
func futexWait(b []byte, off int, val uint32, d time.Duration) {
	ts := unix.NsecToTimespec(int64(d))
	// Not FUTEX_PRIVATE_FLAG: the word is shared with another process.
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(ptr(b, off, 4)), futexWaitOp, uintptr(val), uintptr(unsafe.Pointer(&ts)), 0, 0)
}

// futexWake wakes every sleeper on the shared word at off.
func futexWake(b []byte, off int) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(ptr(b, off, 4)), futexWakeOp, uintptr(1<<30), 0, 0, 0)
}
