//go:build linux

package shm

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/ntstack/ntstack/internal/prim/proc"
)

var le = binary.LittleEndian

// futex(2) and futex_waitv(2) constants (linux/futex.h); x/sys/unix does
// not define them.
const (
	futexWaitOp    = 0   // FUTEX_WAIT
	futexWakeOp    = 1   // FUTEX_WAKE
	futexPrivate   = 128 // FUTEX_PRIVATE_FLAG
	futex2Size32   = 2   // FUTEX2_SIZE_U32
	futex2Private  = 128 // FUTEX2_PRIVATE
	fallbackSlice  = 100 * time.Millisecond
	futexWaitvSize = 24
)

// futexWaitv mirrors struct futex_waitv.
type futexWaitv struct {
	val      uint64
	uaddr    uint64
	flags    uint32
	reserved uint32
}

var _ [futexWaitvSize - unsafe.Sizeof(futexWaitv{})]byte // size check

// Futex words (the doorbell sequence, the private wake word) are accessed
// natively, as the kernel compares them; the other registers go through
// shmem.Mem.

func ptr(b []byte, off, size int) unsafe.Pointer {
	if off < 0 || off > len(b)-size {
		panic("shm: register offset outside the register block")
	}
	return unsafe.Pointer(&b[off])
}

func loadFutex(b []byte, off int) uint32     { return atomic.LoadUint32((*uint32)(ptr(b, off, 4))) }
func storeFutex(b []byte, off int, v uint32) { atomic.StoreUint32((*uint32)(ptr(b, off, 4)), v) }
func add32(b []byte, off int, v uint32)      { atomic.AddUint32((*uint32)(ptr(b, off, 4)), v) }

var noWaitv atomic.Bool // futex_waitv is missing (kernel < 5.16)

// futexWait2 sleeps until the shared word at shared[soff] differs from sval
// or the process-private word at private[poff] differs from pval. Spurious
// returns are fine: callers re-check. Both words are compared by the
// kernel atomically with going to sleep, so a wake between the caller's
// check and the sleep is never lost and no timeout is needed. Without
// futex_waitv it falls back to waiting on the shared word in slices.
func futexWait2(shared []byte, soff int, sval uint32, private []byte, poff int, pval uint32) {
	if !noWaitv.Load() {
		w := [2]futexWaitv{
			{val: uint64(sval), uaddr: uint64(uintptr(ptr(shared, soff, 4))), flags: futex2Size32},
			{val: uint64(pval), uaddr: uint64(uintptr(ptr(private, poff, 4))), flags: futex2Size32 | futex2Private},
		}
		_, _, errno := proc.BlockingSyscall6(unix.SYS_FUTEX_WAITV, uintptr(unsafe.Pointer(&w[0])), 2, 0, 0, 0, 0)
		runtime.KeepAlive(&w)
		if errno != unix.ENOSYS {
			return
		}
		noWaitv.Store(true)
	}
	if loadFutex(private, poff) != pval {
		return
	}
	ts := unix.NsecToTimespec(int64(fallbackSlice))
	_, _, _ = proc.BlockingSyscall6(unix.SYS_FUTEX, uintptr(ptr(shared, soff, 4)), futexWaitOp, uintptr(sval), uintptr(unsafe.Pointer(&ts)), 0, 0)
	runtime.KeepAlive(&ts)
}

// futexWait3 is futexWait2 on two shared words, soff1 and soff2, at
// once. Without futex_waitv it waits on the first in slices.
func futexWait3(shared []byte, soff1 int, sval1 uint32, soff2 int, sval2 uint32, private []byte, poff int, pval uint32) {
	if !noWaitv.Load() {
		w := [3]futexWaitv{
			{val: uint64(sval1), uaddr: uint64(uintptr(ptr(shared, soff1, 4))), flags: futex2Size32},
			{val: uint64(sval2), uaddr: uint64(uintptr(ptr(shared, soff2, 4))), flags: futex2Size32},
			{val: uint64(pval), uaddr: uint64(uintptr(ptr(private, poff, 4))), flags: futex2Size32 | futex2Private},
		}
		_, _, errno := proc.BlockingSyscall6(unix.SYS_FUTEX_WAITV, uintptr(unsafe.Pointer(&w[0])), 3, 0, 0, 0, 0)
		runtime.KeepAlive(&w)
		if errno != unix.ENOSYS {
			return
		}
		noWaitv.Store(true)
	}
	futexWait2(shared, soff1, sval1, private, poff, pval)
}

// futexWake wakes every sleeper on the shared word at off.
func futexWake(b []byte, off int) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(ptr(b, off, 4)), futexWakeOp, uintptr(1<<30), 0, 0, 0)
}

// futexWakePrivate wakes every sleeper of this process on the private
// word at off.
func futexWakePrivate(b []byte, off int) {
	_, _, _ = unix.Syscall6(unix.SYS_FUTEX, uintptr(ptr(b, off, 4)), futexWakeOp|futexPrivate, uintptr(1<<30), 0, 0, 0)
}

// remapShared maps fd, from offset 0, shared, over the mapping mem in
// place (MAP_FIXED): every slice of mem now reads and writes the new file.
// A thread touching mem meanwhile sees the old file or the new one, never
// a hole.
func remapShared(mem []byte, fd int) error {
	if len(mem) == 0 {
		return nil
	}
	_, err := unix.MmapPtr(fd, 0, unsafe.Pointer(&mem[0]), uintptr(len(mem)), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_FIXED)
	if err != nil {
		return fmt.Errorf("map the new link memory in place: %w", err)
	}
	return nil
}
