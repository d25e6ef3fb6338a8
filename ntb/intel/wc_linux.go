package intel

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// mapWC maps size bytes of a sysfs resourceN_wc file: the BAR,
// write-combined. The kernel offers the file only for prefetchable
// memory BARs; its absence is an error matching ntb.ErrNotSupported.
func mapWC(path string, size int) (mapping, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, notSupported("write-combined window mapping (no %s)", path)
	}
	if err != nil {
		return nil, fmt.Errorf("map window write-combined: %w", err)
	}
	defer f.Close()
	b, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", path, err)
	}
	return &wcMapping{b: b}, nil
}

// wcMapping owns a write-combined mapping; it stays valid after the file
// is closed.
type wcMapping struct {
	mu sync.Mutex
	b  []byte // nil after Close
}

func (m *wcMapping) Bytes() []byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.b
}

// Close unmaps. It is idempotent.
func (m *wcMapping) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.b == nil {
		return nil
	}
	err := unix.Munmap(m.b)
	m.b = nil
	return err
}
