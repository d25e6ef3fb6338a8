package proc

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// SwitchNetns moves the calling OS thread into the network namespace bound
// at path (for a namespace made by `ip netns add NAME`, /run/netns/NAME)
// and returns a function that moves it back. Only this thread changes
// namespace: sockets it creates meanwhile live in the new namespace (and
// stay there when used from other threads), while every other thread, and
// every goroutine started from this one, keeps the old one.
//
// Lock the goroutine to its thread (runtime.LockOSThread) before the call
// and unlock it only after back returned nil. If back fails, leave the
// goroutine locked so the runtime retires the thread when the goroutine
// exits; children started with a parent-death signal from that thread, at
// any earlier time by any goroutine, then get that signal.
func SwitchNetns(path string) (back func() error, err error) {
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, fmt.Errorf("switch netns: %w", err)
	}
	target, err := os.Open(path)
	if err != nil {
		orig.Close()
		return nil, fmt.Errorf("switch netns: %w", err)
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		orig.Close()
		return nil, fmt.Errorf("switch netns to %s: setns: %w", path, err)
	}
	return func() error {
		defer orig.Close()
		if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("switch netns back from %s: setns: %w", path, err)
		}
		return nil
	}, nil
}
