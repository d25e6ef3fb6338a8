// Package closeguard is the close guard the ntb backends share: every
// method that touches a device's mapping or registers holds the guard
// (Enter … Exit), and Close marks the device closed, wakes its waiters and
// waits for the methods in flight before it unmaps anything, so that no
// method ever touches memory that is gone.
//
// Concurrency: a Guard is safe for concurrent use; its zero value is an
// open device. Close runs its shutdown once; a method must not call Close
// between its Enter and Exit (Close would wait for it forever).
package closeguard

import (
	"sync"
	"sync/atomic"
)

// Guard guards a device's resources against Close.
type Guard struct {
	// users is held shared between Enter and Exit and exclusively by
	// Close to release the resources.
	users  sync.RWMutex
	closed atomic.Bool
	once   sync.Once
	err    error // the first Close's, returned by every Close
}

// Enter reports whether the device is open; if it is, the device's
// resources stay until Exit.
func (g *Guard) Enter() bool {
	g.users.RLock()
	if g.closed.Load() {
		g.users.RUnlock()
		return false
	}
	return true
}

// Exit ends what Enter began.
func (g *Guard) Exit() { g.users.RUnlock() }

// Closed reports whether Close has marked the device closed.
func (g *Guard) Closed() bool { return g.closed.Load() }

// Close shuts the device down, the first call only, in the order every
// backend needs: stop (the device's own goroutines end), then the mark
// (Enter fails and Closed reports true from here on), then wake (the
// waiters and the peer learn of it; they find the device closed), then,
// once the methods in flight have exited, release, whose error every
// call returns. stop and wake may still use the resources: nothing is
// released before they return.
func (g *Guard) Close(stop, wake func(), release func() error) error {
	g.once.Do(func() {
		stop()
		g.closed.Store(true)
		wake()
		g.users.Lock()
		defer g.users.Unlock()
		g.err = release()
	})
	return g.err
}
