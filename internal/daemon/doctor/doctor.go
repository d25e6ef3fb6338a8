// Package doctor checks and explains the environment ntstack runs in:
// IOMMU and VFIO, NTB and ivshmem devices and their driver binding,
// hugepages, the emulated fabric's shared-memory filesystem, the live
// state of the configured peers and links (through ntmon's local API),
// CPUs against partition workers, the clock source, timer slack, cgroup2,
// BPF and RDMA devices. `ntmon doctor` is its command line.
//
// Every check only reads: files under Options.Root (so that tests point
// /sys, /proc and /dev at a temporary tree), one statfs, and one GET of
// ctlapi.PathStatus. Nothing is written, loaded, bound or mounted; a
// result's Fix says what an administrator would run instead.
//
// Concurrency: Run and Write keep no state between calls and may be called
// from several goroutines. Pitfall: results describe the moment they were
// taken; a device rebound or a peer that came up a second later is not
// seen, and the CPU check sees the affinity of the process running it, not
// ntproxy's.
package doctor

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
)

// Status is the outcome of a check.
type Status string

// Statuses, from good to bad; Skip means the check did not apply.
const (
	Pass Status = "pass"
	Warn Status = "warn"
	Fail Status = "fail"
	Skip Status = "skip"
)

// Result is one check's finding.
type Result struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	// Detail is what was found.
	Detail string `json:"detail"`
	// Fix is what to do about a warning or a failure; it may span lines.
	Fix string `json:"fix,omitempty"`
}

// Options say where and what Run checks. The zero value checks this
// machine without a host configuration.
type Options struct {
	// Root is where /sys, /proc and /dev are found (default "/").
	Root string
	// Config is the host's configuration; nil skips the live link check
	// and sizes the other checks with internal/daemon/config's defaults.
	Config *config.Config
	// MonitorSocket is ntmon's local API socket (default: Config's
	// state_dir/ntmon.sock).
	MonitorSocket string
	// Timeout bounds the call to ntmon (default 3s).
	Timeout time.Duration
}

// DefaultTimeout bounds the status call to ntmon.
const DefaultTimeout = 3 * time.Second

// host is one Run: the options and what several checks share.
type host struct {
	root    string
	opts    Options
	devices []pciDevice // NTB and ivshmem devices found
	pciErr  error       // why the PCI bus could not be read
}

// path returns the absolute path p (e.g. "/proc/cmdline") under the root.
func (h *host) path(p string) string { return filepath.Join(h.root, p) }

// Run runs every check and returns their results in a fixed order.
func Run(ctx context.Context, o Options) []Result {
	if o.Root == "" {
		o.Root = "/"
	}
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.MonitorSocket == "" && o.Config != nil {
		o.MonitorSocket = o.Config.Path(config.MonitorSocket)
	}
	h := &host{root: o.Root, opts: o}
	h.devices, h.pciErr = h.scanPCI()
	var rs []Result
	rs = append(rs, h.checkAuth())
	rs = append(rs, h.checkIOMMU())
	rs = append(rs, h.checkVFIO())
	rs = append(rs, h.checkDevices()...)
	rs = append(rs, h.checkHugepages())
	rs = append(rs, h.checkFabric())
	rs = append(rs, h.checkLinks(ctx)...)
	rs = append(rs, h.checkCPUs())
	rs = append(rs, h.checkClocksource())
	rs = append(rs, h.checkTimerSlack())
	rs = append(rs, h.checkCgroup2())
	rs = append(rs, h.checkBPF())
	rs = append(rs, h.checkRDMA())
	return rs
}

// Failed reports whether any result is a failure.
func Failed(rs []Result) bool {
	for _, r := range rs {
		if r.Status == Fail {
			return true
		}
	}
	return false
}

// Summary is one line counting the results by status, e.g.
// "7 passed, 2 warnings, 1 failed, 1 skipped".
func Summary(rs []Result) string {
	n := map[Status]int{}
	for _, r := range rs {
		n[r.Status]++
	}
	warnings := "warnings"
	if n[Warn] == 1 {
		warnings = "warning"
	}
	return fmt.Sprintf("%d passed, %d %s, %d failed, %d skipped", n[Pass], n[Warn], warnings, n[Fail], n[Skip])
}

// Write prints rs as a table (check, status, detail), each fix indented
// under its detail, then the summary line.
func Write(w io.Writer, rs []Result) error {
	width := len("CHECK")
	for _, r := range rs {
		width = max(width, len(r.Name))
	}
	var b strings.Builder
	indent := strings.Repeat(" ", width+2+6+2)
	fmt.Fprintf(&b, "%-*s  %-6s  %s\n", width, "CHECK", "STATUS", "DETAIL")
	for _, r := range rs {
		detail := strings.Split(r.Detail, "\n")
		fmt.Fprintf(&b, "%-*s  %-6s  %s\n", width, r.Name, strings.ToUpper(string(r.Status)), detail[0])
		for _, l := range detail[1:] {
			fmt.Fprintf(&b, "%s%s\n", indent, l)
		}
		if r.Fix == "" {
			continue
		}
		for i, l := range strings.Split(r.Fix, "\n") {
			prefix := "fix: "
			if i > 0 {
				prefix = "     "
			}
			fmt.Fprintf(&b, "%s%s%s\n", indent, prefix, l)
		}
	}
	fmt.Fprintln(&b, Summary(rs))
	_, err := io.WriteString(w, b.String())
	if err != nil {
		return fmt.Errorf("write doctor results: %w", err)
	}
	return nil
}
