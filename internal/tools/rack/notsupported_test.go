package rack_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/ntstack/ntstack/internal/daemon/redirect"
	"github.com/ntstack/ntstack/internal/prim/errs"
	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/tools/rack"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/intel"
	"github.com/ntstack/ntstack/rdma"
	"github.com/ntstack/ntstack/vfio"
)

// TestErrNotSupportedShared: every package's ErrNotSupported is the one
// value, so a missing capability reported by any package (wrapped, or as
// a package's typed error) matches the name any other package gives it.
// This test lives in the top tier, the one that may import them all.
func TestErrNotSupportedShared(t *testing.T) {
	names := map[string]error{
		"errs": errs.ErrNotSupported, "ntb": ntb.ErrNotSupported, "vfio": vfio.ErrNotSupported,
		"rdma": rdma.ErrNotSupported, "proc": proc.ErrNotSupported, "redirect": redirect.ErrNotSupported,
		"rack": rack.ErrNotSupported,
	}
	reported := map[string]error{
		"wrapped by vfio":    fmt.Errorf("map BAR2 write-combined: %w", vfio.ErrNotSupported),
		"wrapped by rdma":    fmt.Errorf("verbs provider: no RDMA device: %w", rdma.ErrNotSupported),
		"vfio.ErrNoIOMMU":    fmt.Errorf("open group: %w", vfio.ErrNoIOMMU),
		"intel's typed":      &intel.NotSupportedError{What: "write-combined window mapping"},
		"redirect's typed":   &redirect.NotSupportedError{What: "cgroup2 at /sys/fs/cgroup"},
		"rack's typed":       &rack.NotSupportedError{Reason: "no network namespaces"},
		"wrapped by proc":    fmt.Errorf("memfd_create: %w", proc.ErrNotSupported),
		"wrapped twice, ntb": fmt.Errorf("attach: %w", fmt.Errorf("port: %w", ntb.ErrNotSupported)),
	}
	for what, err := range reported {
		for name, target := range names {
			if !errors.Is(err, target) {
				t.Errorf("%s (%v) does not match %s.ErrNotSupported", what, err, name)
			}
		}
	}
	if errors.Is(vfio.ErrNotBound, ntb.ErrNotSupported) {
		t.Error("vfio.ErrNotBound matches ErrNotSupported")
	}
}
