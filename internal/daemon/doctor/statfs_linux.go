package doctor

import (
	"fmt"
	"syscall"
)

// statfsFree returns the bytes an unprivileged user may still allocate on
// the filesystem holding path.
func statfsFree(path string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", path, err)
	}
	return uint64(st.Bavail) * uint64(st.Bsize), nil
}
