// Package proc holds the few process-level system calls the ntstack tools
// need: CPU affinity of a whole process, the CPU time it has used, tying a
// child's life to its parent, a description of the host for reports, what
// shared-pool mode shares memory with (memfds, shared mappings, hole
// punching, futexes and descriptor passing over Unix sockets), and who is
// at the other end of a Unix socket (SO_PEERCRED) and what it may do
// (its effective capabilities).
//
// It is one of the packages allowed to import golang.org/x/sys/unix, so
// commands stay free of raw system calls.
//
// Concurrency: every function is safe for concurrent use, but SetAffinity
// races with threads the runtime creates while it runs; it repeats until a
// pass finds no new thread, and threads created afterwards inherit the mask
// from their creator.
//
// Pitfall: Linux delivers the parent-death signal requested by
// KillWithParent when the parent *thread* that forked the child exits, not
// the parent process. A Go program only loses a thread when a goroutine
// exits while locked to it (runtime.LockOSThread), so do not start children
// from such a goroutine.
package proc

import (
	"bufio"
	"io"
	"strings"

	"github.com/ntstack/ntstack/internal/prim/errs"
)

// ErrNotSupported reports that the platform lacks the requested operation.
// Match it with errors.Is.
var ErrNotSupported = errs.ErrNotSupported

// Host describes the machine a measurement ran on.
type Host struct {
	Hostname string `json:"hostname"`
	CPUs     int    `json:"nproc"`     // CPUs this process may run on at start-up
	CPUModel string `json:"cpu_model"` // from /proc/cpuinfo, "unknown" if absent
	Kernel   string `json:"kernel"`    // kernel release
}

// cpuModel returns the first "model name" in a /proc/cpuinfo listing, or
// "unknown" when there is none (e.g. on arm64, whose cpuinfo has no such
// line).
func cpuModel(cpuinfo io.Reader) string {
	sc := bufio.NewScanner(cpuinfo)
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(key) == "model name" {
			return strings.TrimSpace(value)
		}
	}
	return "unknown"
}
