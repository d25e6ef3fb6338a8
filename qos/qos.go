// Package qos is ntstack's quality of service: 8 priority classes served
// strictly by priority with a per-class limit of consecutive rounds, so
// lower classes are never starved; token-bucket bandwidth limits; and byte
// quotas.
//
// These are plain data structures. Scheduler and Bucket are not safe for
// concurrent use: their owner (a partition's TX scheduler) serialises calls
// under its own lock. Quota is safe for concurrent use.
package qos

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Class is a priority class, 0 (highest) to 7 (lowest).
type Class uint8

const (
	NumClasses = 8
	// Lowest is the lowest class; Default the class of a connection nobody
	// classified.
	Lowest  Class = NumClasses - 1
	Default Class = 0
)

// Valid reports whether c is one of the 8 classes.
func (c Class) Valid() bool { return c < NumClasses }

// DefaultMaxRounds is how many rounds in a row a class may take while a
// lower class waits. With 8, a waiting lower class gets at least one round
// in nine: a bulk class-7 flow keeps ≥ 1/9 of the rounds (and, with
// MTU-sized rounds against small high-class messages, far more of the
// bytes), while class 0 keeps 8/9 of the rounds under contention.
const DefaultMaxRounds = 8

// Scheduler orders ready items (connections with something to send) by
// class: each Next serves the highest class with a ready item, round-robin
// within a class, except that a class which has taken MaxRounds rounds in
// a row while a lower class waited yields one round to the next lower
// waiting class. An item is either queued once or not at all; the caller
// pushes it back after serving it if it still has work.
type Scheduler[T any] struct {
	// MaxRounds bounds consecutive rounds of a class over a waiting lower
	// class (0: DefaultMaxRounds).
	MaxRounds int

	queues  [NumClasses]fifo[T]
	express [NumClasses]fifo[T] // served before queues[c], in order
	streak  [NumClasses]int
	ready   uint8 // bit c: queues[c] or express[c] is not empty
}

// Push queues item in class c (clamped to Lowest).
func (s *Scheduler[T]) Push(c Class, item T) {
	c = min(c, Lowest)
	s.queues[c].push(item)
	s.ready |= 1 << c
}

// PushExpress queues item in class c ahead of the items Push queued there:
// a class's express items are served first, in the order they came. Class
// order and the round limits are unchanged. For items whose service is
// short (a small message beside bulk transfers of the same class).
func (s *Scheduler[T]) PushExpress(c Class, item T) {
	c = min(c, Lowest)
	s.express[c].push(item)
	s.ready |= 1 << c
}

// Len is the number of queued items.
func (s *Scheduler[T]) Len() int {
	n := 0
	for i := range s.queues {
		n += s.queues[i].len() + s.express[i].len()
	}
	return n
}

// Next dequeues the item to serve now.
func (s *Scheduler[T]) Next() (item T, c Class, ok bool) {
	if s.ready == 0 {
		return item, 0, false
	}
	max := s.MaxRounds
	if max <= 0 {
		max = DefaultMaxRounds
	}
	c = s.highest(0)
	if lower := s.highest(c + 1); lower < NumClasses {
		s.streak[c]++
		if s.streak[c] > max {
			s.streak[c] = 0
			c = lower
		}
	} else {
		s.streak[c] = 0
	}
	if s.express[c].len() > 0 {
		item = s.express[c].pop()
	} else {
		item = s.queues[c].pop()
	}
	if s.queues[c].len() == 0 && s.express[c].len() == 0 {
		s.ready &^= 1 << c
	}
	return item, c, true
}

// highest returns the highest ready class ≥ from, or NumClasses.
func (s *Scheduler[T]) highest(from Class) Class {
	for c := from; c < NumClasses; c++ {
		if s.ready&(1<<c) != 0 {
			return c
		}
	}
	return NumClasses
}

// fifo is a growable ring of items.
type fifo[T any] struct {
	buf        []T
	head, size int
}

func (f *fifo[T]) len() int { return f.size }

func (f *fifo[T]) push(v T) {
	if f.size == len(f.buf) {
		buf := make([]T, max(8, 2*len(f.buf)))
		for i := range f.size {
			buf[i] = f.buf[(f.head+i)%len(f.buf)]
		}
		f.buf, f.head = buf, 0
	}
	f.buf[(f.head+f.size)%len(f.buf)] = v
	f.size++
}

func (f *fifo[T]) pop() T {
	var zero T
	v := f.buf[f.head]
	f.buf[f.head] = zero
	f.head = (f.head + 1) % len(f.buf)
	f.size--
	return v
}

// Bucket is a token bucket: Rate bytes per second, at most Burst saved.
// The zero Bucket (Rate 0) is unlimited.
type Bucket struct {
	Rate  int64 // bytes per second; 0: unlimited
	Burst int64 // bytes; 0: one tenth of a second at Rate

	tokens int64
	last   time.Time
}

// Take takes n bytes' worth of tokens at time now. If there are not enough
// it takes nothing and returns how long until there will be. A request
// larger than the burst is allowed once the bucket is full, so it always
// completes.
func (b *Bucket) Take(n int, now time.Time) (wait time.Duration) {
	if b.Rate <= 0 {
		return 0
	}
	burst := b.Burst
	if burst <= 0 {
		burst = max(b.Rate/10, 1)
	}
	if b.last.IsZero() {
		b.tokens, b.last = burst, now
	}
	if el := now.Sub(b.last); el > 0 {
		b.tokens = min(burst, b.tokens+int64(float64(b.Rate)*el.Seconds()))
		b.last = now
	}
	need := min(int64(n), burst)
	if b.tokens < need {
		return time.Duration(float64(need-b.tokens) / float64(b.Rate) * float64(time.Second))
	}
	b.tokens -= int64(n) // may go negative for a request above the burst
	return 0
}

// ErrQuota is matched by errors of a Quota that is used up.
var ErrQuota = errors.New("quota exceeded")

// Quota bounds a sum of bytes (a process's receive-window memory, say).
// The zero Quota (Limit 0) is unlimited.
type Quota struct {
	Name  string
	Limit int64

	mu   sync.Mutex
	used int64
}

// Acquire reserves n bytes or fails with an error matching ErrQuota.
func (q *Quota) Acquire(n int64) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.Limit > 0 && q.used+n > q.Limit {
		return fmt.Errorf("%s: %d of %d bytes in use, %d more requested: %w", q.Name, q.used, q.Limit, n, ErrQuota)
	}
	q.used += n
	return nil
}

// Release returns n bytes.
func (q *Quota) Release(n int64) {
	q.mu.Lock()
	q.used -= n
	q.mu.Unlock()
}

// Used is the number of bytes reserved.
func (q *Quota) Used() int64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.used
}
