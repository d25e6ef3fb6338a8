//go:build !linux

package redirect

import (
	"net/netip"
	"runtime"
)

// errNoRedirect is what every operation returns off Linux; it matches
// ErrNotSupported.
var errNoRedirect = &NotSupportedError{What: "cgroup connect redirection on " + runtime.GOOS}

// Redirect is the owner Attach returns on Linux; elsewhere there is none.
type Redirect struct{}

// Attach fails: cgroup eBPF hooks exist only on Linux.
func Attach(cgroupPath string) (*Redirect, error) { return nil, errNoRedirect }

// Cgroup returns "".
func (r *Redirect) Cgroup() string { return "" }

// Set fails with an error matching ErrNotSupported.
func (r *Redirect) Set(from, to netip.AddrPort) error { return errNoRedirect }

// Delete fails with an error matching ErrNotSupported.
func (r *Redirect) Delete(from netip.AddrPort) error { return errNoRedirect }

// Count fails with an error matching ErrNotSupported.
func (r *Redirect) Count(from netip.AddrPort) (uint64, error) { return 0, errNoRedirect }

// Counts fails with an error matching ErrNotSupported.
func (r *Redirect) Counts() (map[netip.AddrPort]uint64, error) { return nil, errNoRedirect }

// Close does nothing.
func (r *Redirect) Close() error { return nil }
