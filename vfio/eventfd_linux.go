package vfio

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Eventfd owns an eventfd(2) for the kernel to signal, typically an
// interrupt vector handed to Device.SetIRQEventfds. It is non-blocking
// underneath and parked in the Go netpoller, so Wait blocks only its
// goroutine, honours SetReadDeadline and returns when Close is called.
type Eventfd struct {
	f         *os.File
	fd        int
	closeOnce sync.Once
	closeErr  error
}

// NewEventfd creates an eventfd with a zero counter.
func NewEventfd() (*Eventfd, error) {
	fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return &Eventfd{f: os.NewFile(uintptr(fd), "eventfd"), fd: fd}, nil
}

// FD returns the descriptor number to hand to the kernel. It is valid
// until Close.
func (e *Eventfd) FD() int { return e.fd }

// Wait blocks until the counter is non-zero, then returns it and resets it
// to zero. After the deadline set by SetReadDeadline it returns an error
// matching os.ErrDeadlineExceeded; after Close, one matching os.ErrClosed.
func (e *Eventfd) Wait() (uint64, error) {
	var b [8]byte
	if _, err := e.f.Read(b[:]); err != nil {
		return 0, fmt.Errorf("wait eventfd: %w", err)
	}
	return binary.NativeEndian.Uint64(b[:]), nil
}

// SetReadDeadline sets the deadline for Wait; the zero time means none.
func (e *Eventfd) SetReadDeadline(t time.Time) error { return e.f.SetReadDeadline(t) }

// Close closes the eventfd, waking a blocked Wait. It is idempotent.
// Detach the eventfd from the device (SetIRQEventfds with -1, or
// DisableIRQs) first: the kernel keeps signalling the eventfd it holds.
func (e *Eventfd) Close() error {
	e.closeOnce.Do(func() { e.closeErr = e.f.Close() })
	return e.closeErr
}
