//go:build !linux

package proc

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"syscall"
	"time"
)

// Pollable returns f: this platform's files are left as they are.
func Pollable(f *os.File) *os.File { return f }

// Affinity is not supported on this platform.
func Affinity() ([]int, error) {
	return nil, fmt.Errorf("sched_getaffinity: %w", ErrNotSupported)
}

// SetAffinity is not supported on this platform.
func SetAffinity(cpus []int) error {
	return fmt.Errorf("set affinity: %w", ErrNotSupported)
}

// PinThread is not supported on this platform.
func PinThread(cpu int) error {
	return fmt.Errorf("pin thread to cpu %d: %w", cpu, ErrNotSupported)
}

// CPUTime is not supported on this platform.
func CPUTime() (time.Duration, error) {
	return 0, fmt.Errorf("getrusage: %w", ErrNotSupported)
}

// KillWithParent returns nil: this platform has no parent-death signal,
// so children rely on noticing that their stdin closed.
func KillWithParent() *syscall.SysProcAttr { return nil }

// ReadHost describes this machine as far as the platform tells.
func ReadHost() Host {
	h := Host{CPUs: runtime.NumCPU(), CPUModel: "unknown"}
	h.Hostname, _ = os.Hostname()
	return h
}

// Cred is the identity of a Unix socket's peer process.
type Cred struct {
	PID, UID, GID int
}

// PeerCred is not supported on this platform.
func PeerCred(c *net.UnixConn) (Cred, error) {
	return Cred{}, fmt.Errorf("peer credentials: %w", ErrNotSupported)
}

// SendFile is not supported on this platform.
func SendFile(c *net.UnixConn, msg []byte, f *os.File) error {
	return fmt.Errorf("send descriptor: %w", ErrNotSupported)
}

// SendFiles is not supported on this platform.
func SendFiles(c *net.UnixConn, msg []byte, files ...*os.File) error {
	return fmt.Errorf("send descriptor: %w", ErrNotSupported)
}

// RecvFiles is not supported on this platform.
func RecvFiles(c *net.UnixConn, buf []byte, names ...string) (int, []*os.File, error) {
	return 0, nil, fmt.Errorf("receive descriptor: %w", ErrNotSupported)
}

// RecvFile is not supported on this platform.
func RecvFile(c *net.UnixConn, buf []byte, name string) (int, *os.File, error) {
	return 0, nil, fmt.Errorf("receive descriptor: %w", ErrNotSupported)
}

// Yield only yields the goroutine on this platform.
func Yield() { runtime.Gosched() }

// NewMemfd is not supported on this platform.
func NewMemfd(name string, size int64) (*os.File, error) {
	return nil, fmt.Errorf("memfd_create %s: %w", name, ErrNotSupported)
}

// SealSize is not supported on this platform.
func SealSize(f *os.File) error { return fmt.Errorf("seal %s: %w", f.Name(), ErrNotSupported) }

// MapShared is not supported on this platform.
func MapShared(f *os.File, size int) ([]byte, error) {
	return nil, fmt.Errorf("map %s: %w", f.Name(), ErrNotSupported)
}

// Unmap is not supported on this platform.
func Unmap(b []byte) error { return fmt.Errorf("unmap: %w", ErrNotSupported) }

// Discard is not supported on this platform.
func Discard(f *os.File, off, n int64) error {
	return fmt.Errorf("discard: %w", ErrNotSupported)
}

// FutexWait sleeps briefly: this platform has no futex, so waiters poll.
func FutexWait(addr *uint32, val uint32, timeout time.Duration) {
	time.Sleep(min(max(timeout, time.Millisecond), time.Millisecond))
}

// FutexWake does nothing: waiters poll on this platform.
func FutexWake(addr *uint32) {}

// EffectiveCaps is not supported on this platform.
func EffectiveCaps(pid int) (uint64, error) {
	return 0, fmt.Errorf("capabilities of pid %d: %w", pid, ErrNotSupported)
}
