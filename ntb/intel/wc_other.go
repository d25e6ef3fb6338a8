//go:build !linux

package intel

import "runtime"

// mapWC fails: write-combined sysfs mappings are Linux's.
func mapWC(path string, size int) (mapping, error) {
	return nil, notSupported("write-combined window mapping on %s", runtime.GOOS)
}
