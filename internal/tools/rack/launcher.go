package rack

import (
	"os/exec"
	"runtime"
	"sync"
)

// launcher starts the daemons of every rack from one OS thread that never
// exits. A daemon's parent-death signal fires when the thread that forked
// it ends, and the Go runtime retires any thread whose goroutine exits
// while locked to it (runtime.LockOSThread), whatever it forked earlier
// for other goroutines. Forking from this thread alone ties the daemons to
// the life of the process.
var launcher struct {
	once sync.Once
	reqs chan launchReq
}

type launchReq struct {
	cmd  *exec.Cmd
	done chan error
}

// startOnLauncher starts cmd from the launcher thread.
func startOnLauncher(cmd *exec.Cmd) error {
	launcher.once.Do(func() {
		launcher.reqs = make(chan launchReq)
		go runLauncher(launcher.reqs)
	})
	req := launchReq{cmd: cmd, done: make(chan error, 1)}
	launcher.reqs <- req
	return <-req.done
}

// runLauncher serves start requests for the rest of the process's life.
func runLauncher(reqs <-chan launchReq) {
	runtime.LockOSThread() // never unlocked: see launcher
	for req := range reqs {
		req.done <- req.cmd.Start()
	}
}
