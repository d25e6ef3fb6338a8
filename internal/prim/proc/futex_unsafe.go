//go:build linux

package proc

import (
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const (
	futexWait = 0 // FUTEX_WAIT, shared: the word may be in memory another process maps
	futexWake = 1 // FUTEX_WAKE
)

// FutexWait sleeps while the word at addr holds val, at most timeout (no
// limit if timeout ≤ 0). It returns at once if the word differs; it may
// also return spuriously, so callers check what they wait for again.
// addr must point into memory that stays mapped until the call returns.
func FutexWait(addr *uint32, val uint32, timeout time.Duration) {
	var ts *unix.Timespec
	if timeout > 0 {
		t := unix.NsecToTimespec(int64(timeout))
		ts = &t
	}
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait, uintptr(val), uintptr(unsafe.Pointer(ts)), 0, 0)
}

// FutexWake wakes every sleeper on the word at addr, in any process.
func FutexWake(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake, uintptr(1<<30), 0, 0, 0)
}
