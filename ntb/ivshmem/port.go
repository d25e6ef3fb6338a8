package ivshmem

import "context"

// Port is one attachment to an ivshmem shared-memory region: the host-side
// Client of this package, or QEMU's ivshmem-doorbell PCI device driven
// through VFIO inside a guest. The ntb.Device backend of this package is
// built on a Port and does not care which.
type Port interface {
	// ID is this attachment's peer id (the device's IVPosition register).
	ID() int
	// Vectors is the number of doorbell vectors per peer.
	Vectors() int
	// Mem is the shared memory (the device's BAR2), valid until Close.
	Mem() []byte
	// Ring raises vector on peer.
	Ring(peer, vector int) error
	// Wait blocks until vector has been raised on this attachment since
	// the last Wait returned, consuming the interrupt, or until ctx ends.
	// At most one goroutine waits on a given vector at a time.
	Wait(ctx context.Context, vector int) error
	// Close detaches; it is idempotent.
	Close() error
}
