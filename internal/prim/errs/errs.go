// Package errs holds the error values every tier of the module shares.
// Public packages re-export them (ntb.ErrNotSupported, vfio.ErrNotSupported,
// rdma.ErrNotSupported, ...), each the same value, so errors.Is matches a
// missing capability whichever package's name the caller uses. It imports
// only the standard library, so any package may import it.
package errs

import "errors"

// ErrNotSupported reports a capability this machine, kernel, build or
// device lacks: no IOMMU, no write-combining, no RDMA device, no cgroup2,
// not Linux. The error that wraps it says which, and what to do about it.
var ErrNotSupported = errors.New("not supported")
