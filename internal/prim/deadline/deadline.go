// Package deadline is the settable deadline behind net.Conn's
// SetDeadline in socklike's and rdma's connections: a point in time that
// closes a channel when it passes, so a blocked call can select on it.
//
// Concurrency: every method is safe for concurrent use. Lifetime: a
// Deadline holds a timer only while armed; Set(time.Time{}) disarms it.
package deadline

import (
	"sync"
	"sync/atomic"
	"time"
)

// Deadline is settable; the zero value is not ready: use New.
type Deadline struct {
	armed atomic.Bool // a deadline is set: Passed's fast path skips the lock

	mu sync.Mutex
	// mu protects the following fields.
	timer   *time.Timer
	expired chan struct{} // closed once the deadline has passed
}

// New returns a disarmed Deadline.
func New() *Deadline { return &Deadline{expired: make(chan struct{})} }

// Set arms the deadline for t, re-arming it if it was set; the zero time
// disarms it. A time in the past expires it at once.
func (d *Deadline) Set(t time.Time) {
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
	d.armed.Store(!t.IsZero())
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

// Wait returns a channel closed when the current deadline passes.
func (d *Deadline) Wait() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.expired
}

// Armed reports whether a deadline is set (passed or not).
func (d *Deadline) Armed() bool { return d.armed.Load() }

// Passed reports whether the current deadline has passed.
func (d *Deadline) Passed() bool {
	if !d.armed.Load() {
		return false
	}
	select {
	case <-d.Wait():
		return true
	default:
		return false
	}
}
