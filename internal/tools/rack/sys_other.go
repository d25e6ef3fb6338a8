//go:build !linux

package rack

import (
	"syscall"

	"github.com/ntstack/ntstack/internal/prim/proc"
)

// Start refuses to run off Linux (Supported), so these are never reached.

func daemonAttr() *syscall.SysProcAttr { return proc.KillWithParent() }

func signalGroup(pid int, sig syscall.Signal) error { return ErrNotSupported }

func killPid(pid int) {}
