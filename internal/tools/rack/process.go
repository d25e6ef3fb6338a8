package rack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/proc"
)

// Timeouts of process control.
const (
	termGrace   = 2 * time.Second // Close: SIGTERM, then SIGKILL after this
	killTimeout = 5 * time.Second // a SIGKILLed process must be gone by then
	logTailSize = 2048            // bytes of a log quoted in errors
)

// process is one run of a daemon.
type process struct {
	host   *Host
	daemon Daemon
	cmd    *exec.Cmd
	done   chan struct{} // closed once cmd.Wait returned
	err    error         // cmd.Wait's result; read after done is closed
}

// runWait reaps the process and notes its end in its log.
func (p *process) runWait() {
	p.err = p.cmd.Wait()
	if f, err := os.OpenFile(p.host.LogPath(p.daemon.Name), os.O_WRONLY|os.O_APPEND, 0); err == nil {
		fmt.Fprintf(f, "=== %s rack: %s exited: %v\n", time.Now().Format(time.RFC3339Nano), p.daemon.Name, p.cmd.ProcessState)
		f.Close()
	}
	close(p.done)
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill SIGKILLs the process's group and waits for the process to end.
func (p *process) kill() error {
	if p.exited() {
		return nil
	}
	if err := signalGroup(p.cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill %s on %s: %w", p.daemon.Name, p.host.Name, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(killTimeout):
		return fmt.Errorf("kill %s on %s: pid %d still running %v after SIGKILL", p.daemon.Name, p.host.Name, p.cmd.Process.Pid, killTimeout)
	}
}

func procKey(host, daemon string) string { return host + "/" + daemon }

// startDaemon starts d on h, in h's namespace, logging to h.LogPath.
func (r *Rack) startDaemon(h *Host, d Daemon) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("start %s on %s: rack closed", d.Name, h.Name)
	}
	if p := r.procs[procKey(h.Name, d.Name)]; p != nil && !p.exited() {
		return fmt.Errorf("start %s on %s: already running as pid %d", d.Name, h.Name, p.cmd.Process.Pid)
	}
	argv := d.Argv(h)
	if len(argv) == 0 {
		return fmt.Errorf("start %s on %s: empty command line", d.Name, h.Name)
	}
	log, err := os.OpenFile(h.LogPath(d.Name), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start %s on %s: %w", d.Name, h.Name, err)
	}
	defer log.Close() // the child has its own copy
	fmt.Fprintf(log, "=== %s rack: start %q in netns %s\n", time.Now().Format(time.RFC3339Nano), argv, h.Netns)
	cmd := exec.Command("ip", append([]string{"netns", "exec", h.Netns}, argv...)...)
	cmd.Env = append(os.Environ(), d.Env...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = daemonAttr()
	if err := startOnLauncher(cmd); err != nil {
		return fmt.Errorf("start %s on %s: %w", d.Name, h.Name, err)
	}
	p := &process{host: h, daemon: d, cmd: cmd, done: make(chan struct{})}
	go p.runWait()
	r.procs[procKey(h.Name, d.Name)] = p
	return nil
}

// proc returns the last run of a daemon.
func (r *Rack) proc(op, host, daemon string) (*process, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.procs[procKey(host, daemon)]
	if p == nil {
		return nil, fmt.Errorf("%s %s on %s: no such daemon started in rack %s", op, daemon, host, r.name)
	}
	return p, nil
}

// Kill SIGKILLs a daemon (its whole process group) and waits until it is
// gone. Killing a daemon that already ended is no error.
func (r *Rack) Kill(host, daemon string) error {
	p, err := r.proc("kill", host, daemon)
	if err != nil {
		return err
	}
	return p.kill()
}

// Restart starts a daemon again, SIGKILLing it first if it still runs, and
// waits for its Socket. Its log continues in the same file.
func (r *Rack) Restart(host, daemon string) error {
	p, err := r.proc("restart", host, daemon)
	if err != nil {
		return err
	}
	if err := p.kill(); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	if err := r.startDaemon(p.host, p.daemon); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	if p.daemon.Socket == "" {
		return nil
	}
	if err := r.waitSocket(context.Background(), p.host, p.daemon.Socket, r.ready); err != nil {
		return fmt.Errorf("restart: %w", err)
	}
	return nil
}

// Pid returns the process id of a running daemon, or 0 if it is not
// running.
func (r *Rack) Pid(host, daemon string) int {
	p, err := r.proc("pid", host, daemon)
	if err != nil || p.exited() {
		return 0
	}
	return p.cmd.Process.Pid
}

// WaitSocket polls until the Unix socket at path accepts a connection, for
// at most timeout. A relative path is taken under the host's state
// directory (e.g. config.ProxySocket). If a daemon of the host whose
// Socket this is ends meanwhile, WaitSocket fails at once, quoting its log.
func (r *Rack) WaitSocket(host, path string, timeout time.Duration) error {
	h, err := r.host("wait for socket", host)
	if err != nil {
		return err
	}
	return r.waitSocket(context.Background(), h, path, timeout)
}

func (r *Rack) waitSocket(ctx context.Context, h *Host, path string, timeout time.Duration) error {
	if !filepath.IsAbs(path) {
		path = filepath.Join(h.StateDir, path)
	}
	var owner *process // the daemon that should open the socket, if known
	r.mu.Lock()
	for _, p := range r.procs {
		if p.host == h && p.daemon.Socket != "" && filepath.Join(h.StateDir, p.daemon.Socket) == path {
			owner = p
		}
	}
	r.mu.Unlock()
	var ownerDone <-chan struct{}
	if owner != nil {
		ownerDone = owner.done
	}

	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		c, err := net.DialTimeout("unix", path, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-tick.C:
		case <-ownerDone:
			return fmt.Errorf("wait for socket %s on %s: %s ended (%v) first; log %s ends:\n%s",
				path, h.Name, owner.daemon.Name, owner.err, h.LogPath(owner.daemon.Name), logTail(h.LogPath(owner.daemon.Name)))
		case <-ctx.Done():
			return fmt.Errorf("wait for socket %s on %s: %w (last dial: %v)", path, h.Name, ctx.Err(), err)
		}
	}
}

// logTail returns the end of a log file, or why it cannot.
func logTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > logTailSize {
		if _, err := f.Seek(-logTailSize, io.SeekEnd); err != nil {
			return fmt.Sprintf("(%v)", err)
		}
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(%v)", err)
	}
	return string(b)
}

// Exec prepares a command to run in a host's namespace, with ProxyEnv set
// to the host's ntproxy socket and a parent-death SIGKILL (which fires
// when the thread that calls Start ends: see the package comment). An
// unknown host makes the command's Start fail. The caller owns the command
// (Wait for it); Close kills it if it still runs.
func (r *Rack) Exec(host, name string, args ...string) *exec.Cmd {
	return r.ExecContext(context.Background(), host, name, args...)
}

// ExecContext is Exec with a context that kills the command when done.
func (r *Rack) ExecContext(ctx context.Context, host, name string, args ...string) *exec.Cmd {
	h := r.byName[host]
	ns := "?"
	if h != nil {
		ns = h.Netns
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, name}, args...)...)
	if h == nil {
		cmd.Err = fmt.Errorf("exec %s: rack %s has no host %q", name, r.name, host)
		return cmd
	}
	cmd.Env = append(os.Environ(), ProxyEnv+"="+h.Config.Path(config.ProxySocket))
	cmd.SysProcAttr = proc.KillWithParent()
	return cmd
}

// Close stops the rack: SIGTERM to every daemon, SIGKILL to those still
// running after 2 s, SIGKILL to anything else left in the namespaces, then
// it deletes the veths, namespaces and bridge, the fabric directory and
// (unless Spec.KeepState) the state directories. Close is idempotent: later
// calls return the first call's result.
func (r *Rack) Close() error {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closed = true
		procs := make([]*process, 0, len(r.procs))
		for _, p := range r.procs {
			procs = append(procs, p)
		}
		r.mu.Unlock()
		err := errors.Join(stopAll(procs), r.teardown())
		if err != nil {
			r.closeErr = fmt.Errorf("close rack %s: %w", r.name, err)
		}
	})
	return r.closeErr
}

// stopAll asks every process to end, then kills those that do not within
// termGrace.
func stopAll(procs []*process) error {
	for _, p := range procs {
		if !p.exited() {
			_ = signalGroup(p.cmd.Process.Pid, syscall.SIGTERM)
		}
	}
	grace := time.NewTimer(termGrace)
	defer grace.Stop()
	var errs []error
	for _, p := range procs {
		select {
		case <-p.done:
		case <-grace.C:
			grace.Reset(0) // the grace is over for the rest too
			errs = append(errs, p.kill())
		}
	}
	return errors.Join(errs...)
}
