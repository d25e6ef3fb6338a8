package rack

import (
	"syscall"

	"github.com/ntstack/ntstack/internal/prim/proc"
)

// daemonAttr starts a daemon in its own process group, so Kill reaches its
// children too, and kills it with the thread that started it.
func daemonAttr() *syscall.SysProcAttr {
	a := proc.KillWithParent()
	a.Setpgid = true
	return a
}

// signalGroup sends sig to the process group led by pid.
func signalGroup(pid int, sig syscall.Signal) error { return syscall.Kill(-pid, sig) }

// killPid SIGKILLs one process; one already gone is no error.
func killPid(pid int) { _ = syscall.Kill(pid, syscall.SIGKILL) }
