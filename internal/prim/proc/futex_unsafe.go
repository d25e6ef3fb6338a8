//go:build linux

package proc

import (
	"runtime"
	"syscall"
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
	BlockingSyscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait, uintptr(val), uintptr(unsafe.Pointer(ts)), 0, 0)
	runtime.KeepAlive(ts)
}

// FutexWake wakes every sleeper on the word at addr, in any process.
func FutexWake(addr *uint32) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake, uintptr(1<<30), 0, 0, 0)
}

// BlockingSyscall6 makes a system call expected to sleep, such as a futex
// wait, and gives up the calling thread's P before it enters the kernel,
// as the runtime does for its own blocking waits: another thread runs the
// process's goroutines meanwhile. syscall.Syscall6 keeps the P until
// sysmon takes it back, which it does on its second look at the call;
// sysmon looks every 20 µs in a busy process but only every 10 ms in a
// quiet one. With both its Ps asleep in futex waits so, the process of
// the rack's KV clients and server ran nothing for 15 ms at a time while
// its other goroutines were runnable: the pools' KV took 19 ms at p99.9
// (docs/perf-log.md, 2026-12-03, issue 42). The price: giving the P up
// wakes another thread when no other P is idle, more CPU a sleep in a
// one-P process.
//
// Pointer arguments must stay alive until it returns (runtime.KeepAlive
// after the call). It is nosplit, as syscall.Syscall6 is, so a caller's
// stack does not move under a pointer into it, and norace: with its P
// given up the race detector's hooks must not run.
//
//go:nosplit
//go:norace
func BlockingSyscall6(trap, a1, a2, a3, a4, a5, a6 uintptr) (r1, r2 uintptr, errno syscall.Errno) {
	entersyscallblock()
	r1, r2, errno = syscall.RawSyscall6(trap, a1, a2, a3, a4, a5, a6)
	exitsyscall()
	return r1, r2, errno
}

// The runtime keeps these two open to packages that make their own
// blocking system calls (go.dev/issue/67401). syscall.Syscall6 is the
// same raw call between entersyscall and exitsyscall.

//go:linkname entersyscallblock runtime.entersyscallblock
func entersyscallblock()

//go:linkname exitsyscall runtime.exitsyscall
func exitsyscall()
