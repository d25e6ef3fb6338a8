package rdma

import (
	"sync"
	"time"
)

// deadline is a settable point in time that closes a channel when it
// passes, so a blocked call can select on it. Setting a new deadline
// re-arms it; the zero time disarms it.
type deadline struct {
	mu sync.Mutex
	// mu protects the following fields.
	timer   *time.Timer
	expired chan struct{} // closed once the deadline has passed
}

func newDeadline() *deadline { return &deadline{expired: make(chan struct{})} }

func (d *deadline) set(t time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.timer != nil && !d.timer.Stop() {
		<-d.expired // the timer fired (or is firing): wait for its close
	}
	d.timer = nil
	select {
	case <-d.expired:
		d.expired = make(chan struct{})
	default:
	}
	if t.IsZero() {
		return
	}
	if dur := time.Until(t); dur > 0 {
		ch := d.expired
		d.timer = time.AfterFunc(dur, func() { close(ch) })
		return
	}
	close(d.expired)
}

// wait returns a channel closed when the current deadline passes.
func (d *deadline) wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.expired
}

// passed reports whether the current deadline has passed.
func (d *deadline) passed() bool {
	select {
	case <-d.wait():
		return true
	default:
		return false
	}
}
