package rack

import (
	"fmt"
	"runtime"

	"github.com/ntstack/ntstack/internal/prim/proc"
)

// Enter runs fn on an OS thread switched into a host's network namespace
// and returns fn's error. Sockets fn creates (net.Listen, net.Dial to an
// IP address) belong to the host's namespace and may be used from any
// goroutine after Enter returns, until the rack closes.
//
// Only fn's own goroutine is in the namespace: goroutines fn starts run on
// other threads, in the root namespace, and so do name lookups the
// resolver hands to other goroutines. fn must not change its thread in
// other ways (unshare, setns). Afterwards the thread is switched back; if
// that fails it is retired, which SIGKILLs every child it ever started
// with a parent-death signal (Exec's commands; the daemons are safe, see
// launcher). A panic in fn is re-raised in the caller.
func (r *Rack) Enter(host string, fn func() error) error {
	h, err := r.host("enter", host)
	if err != nil {
		return err
	}
	type result struct {
		err      error
		panicked bool
		value    any
	}
	done := make(chan result, 1)
	go func() {
		var res result
		defer func() { done <- res }()
		runtime.LockOSThread()
		back, err := proc.SwitchNetns(h.NetnsPath())
		if err != nil {
			runtime.UnlockOSThread()
			res.err = fmt.Errorf("enter %s: %w", host, err)
			return
		}
		defer func() {
			if err := back(); err != nil {
				// Stay locked: the runtime retires the thread.
				res.err = fmt.Errorf("enter %s: %w", host, err)
				return
			}
			runtime.UnlockOSThread()
		}()
		defer func() {
			if v := recover(); v != nil {
				res.panicked, res.value = true, v
			}
		}()
		res.err = fn()
	}()
	res := <-done
	if res.panicked {
		panic(res.value)
	}
	return res.err
}
