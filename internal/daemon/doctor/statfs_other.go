//go:build !linux

package doctor

import (
	"errors"
	"fmt"
)

// errNotSupported: the check needs Linux.
var errNotSupported = errors.New("not supported on this platform")

func statfsFree(path string) (uint64, error) {
	return 0, fmt.Errorf("statfs %s: %w", path, errNotSupported)
}
