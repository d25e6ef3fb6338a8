//go:build !linux

package proc

import "fmt"

// SwitchNetns is not supported on this platform.
func SwitchNetns(path string) (back func() error, err error) {
	return nil, fmt.Errorf("switch netns to %s: %w", path, ErrNotSupported)
}
