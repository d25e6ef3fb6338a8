package proc

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// NewMemfd creates an anonymous shared-memory file of size bytes
// (memfd_create), to be mapped here and passed to another process. Its
// size is sealed (SealSize).
func NewMemfd(name string, size int64) (*os.File, error) {
	fd, err := unix.MemfdCreate("ntstack-"+name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, fmt.Errorf("size memfd %s: %w", name, err)
	}
	if err := SealSize(f); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// SealSize fixes the size of f, a memfd created with MFD_ALLOW_SEALING,
// for good: a process it is passed to cannot shrink it under this one's
// mapping (touching a page past the end would kill this process with
// SIGBUS), nor grow it, nor remove the seals. Its contents stay writable,
// and holes can still be punched.
func SealSize(f *os.File) error {
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		return fmt.Errorf("seal the size of %s: %w", f.Name(), err)
	}
	return nil
}

// MapShared maps the first size bytes of f, readable and writable, shared
// with every other mapping of it. The mapping outlives f's descriptor;
// its owner ends it with Unmap.
func MapShared(f *os.File, size int) ([]byte, error) {
	b, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", f.Name(), err)
	}
	return b, nil
}

// Unmap ends a mapping MapShared returned.
func Unmap(b []byte) error {
	if err := unix.Munmap(b); err != nil {
		return fmt.Errorf("unmap: %w", err)
	}
	return nil
}

// Discard gives bytes off..off+n of f back to the system
// (FALLOC_FL_PUNCH_HOLE): every mapping then reads them as zeros, and they
// use no memory until written again.
func Discard(f *os.File, off, n int64) error {
	if err := unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, off, n); err != nil {
		return fmt.Errorf("discard %d bytes of %s at %d: %w", n, f.Name(), off, err)
	}
	return nil
}
