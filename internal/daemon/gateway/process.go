package gateway

// The gateway in a process of its own.
//
// ntproxy does not serve the gateway itself: it starts its own executable
// in gateway mode (ntproxy -gateway), which attaches to it as an
// application and serves the gateway there. The gateway waits on TCP
// sockets, and a process that waits on sockets lets at most GOMAXPROCS−1
// of its goroutines spin (DESIGN.md invariant 11, spingate): were the
// sockets in ntproxy, its one P would let nobody spin, and every fabric
// wait of every application's connection would park and pay a doorbell
// wake-up across CPUs. In a process of its own the gateway runs two Ps,
// one to spin and one for the poller, and ntproxy's legs spin as if it had
// no gateway.
//
//	ntproxy ──fd 3 (socketpair: stats)── ntproxy -gateway
//	   ▲                                     │ socklike attached mode
//	   └──────────── proxy socket ───────────┘
//
// The child's descriptor StatsFD is one end of a socketpair: ntproxy asks
// over it for Stats and TrunkStats (one JSON line each way) and the child
// answers with ServeStats. The child is ntproxy's: the kernel kills it
// when the thread that started it ends (a parent-death signal; the thread
// stays locked to one goroutine until the child is reaped), it ends when
// the socket closes, and Stop asks it to end with SIGTERM.

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// StatsFD is the gateway process's descriptor of its stats socket.
const StatsFD = 3

// Bounds of the control of a gateway process.
const (
	// statsTimeout bounds one stats request: a status query gets no
	// gateway rows rather than hang on a stuck child.
	statsTimeout = 2 * time.Second
	// stopGrace is how long Stop waits after SIGTERM before SIGKILL: the
	// gateway closes its listeners and connections at once.
	stopGrace = 5 * time.Second
	// stderrTail bounds the end of the child's stderr kept for its error.
	stderrTail = 1024
)

// Reporter is what a gateway process reports: a *Gateway's counters.
type Reporter interface {
	Stats() []ctlapi.GatewayStat
	TrunkStats() []ctlapi.TrunkStat
}

var (
	_ Reporter = (*Gateway)(nil)
	_ Reporter = (*Process)(nil)
)

// statsRequest and statsReply are the stats socket's messages, one JSON
// object a line; a reply carries its request's Seq, so a reply that comes
// after its request timed out is told apart and dropped.
type statsRequest struct {
	Seq uint64 `json:"seq"`
}

type statsReply struct {
	Seq     uint64               `json:"seq"`
	Gateway []ctlapi.GatewayStat `json:"gateway"`
	Trunks  []ctlapi.TrunkStat   `json:"trunks"`
}

// ServeStats answers the stats requests read from c with r's counters
// until c ends; it returns nil when the other end closed it.
func ServeStats(c io.ReadWriter, r Reporter) error {
	dec, enc := json.NewDecoder(c), json.NewEncoder(c)
	for {
		var q statsRequest
		if err := dec.Decode(&q); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("gateway stats: %w", err)
		}
		if err := enc.Encode(statsReply{Seq: q.Seq, Gateway: r.Stats(), Trunks: r.TrunkStats()}); err != nil {
			return fmt.Errorf("gateway stats: %w", err)
		}
	}
}

// StatsConn returns the stats socket ntproxy passed the gateway process
// (descriptor StatsFD). A process that ntproxy did not start fails here,
// and the descriptor, which may then be one of the runtime's own, is left
// open.
func StatsConn() (net.Conn, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(StatsFD, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFSOCK {
		return nil, fmt.Errorf("descriptor %d is not the gateway stats socket that ntproxy passes the gateway process it starts", StatsFD)
	}
	f := os.NewFile(StatsFD, "gateway stats")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("gateway stats socket (descriptor %d): %w", StatsFD, err)
	}
	return c, nil
}

// Process is a gateway served by a child process (StartProcess). Its
// methods are safe for concurrent use.
type Process struct {
	cmd   *exec.Cmd
	stats net.Conn // this end of the stats socket
	tail  *tailWriter
	done  chan struct{} // closed once the child is reaped
	err   error         // why it ended (Err); set before done closes

	stopOnce sync.Once
	killed   atomic.Bool // Stop had to SIGKILL it

	mu sync.Mutex
	// mu protects the following fields: one stats request at a time.
	seq uint64
	rd  *bufio.Reader
}

// StartProcess starts cmd, a gateway process: cmd.Path, Args and Env are
// the caller's; StartProcess adds the stats socket as descriptor StatsFD
// and the parent-death signal. The child's stderr goes to cmd.Stderr (nil:
// os.Stderr), and its last line makes part of Err.
func StartProcess(cmd *exec.Cmd) (_ *Process, err error) {
	ours, theirs, err := socketPair()
	if err != nil {
		return nil, fmt.Errorf("start gateway process: %w", err)
	}
	defer theirs.Close() // the child has its own copy
	stats, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return nil, fmt.Errorf("start gateway process: %w", err)
	}
	defer func() {
		if err != nil {
			stats.Close()
		}
	}()
	out := cmd.Stderr
	if out == nil {
		out = os.Stderr
	}
	p := &Process{cmd: cmd, stats: stats, tail: &tailWriter{w: out}, done: make(chan struct{}), rd: bufio.NewReader(stats)}
	cmd.Stderr = p.tail
	cmd.ExtraFiles = []*os.File{theirs} // descriptor 3 = StatsFD
	cmd.SysProcAttr = proc.KillWithParent()
	started := make(chan error, 1)
	go p.runChild(started)
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start gateway process: %w", err)
	}
	return p, nil
}

// runChild starts the child and reaps it. The child's parent-death signal
// fires when the thread that forked it ends, so this goroutine holds that
// thread, locked, until the child is gone.
func (p *Process) runChild(started chan<- error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := p.cmd.Start(); err != nil {
		started <- err
		return
	}
	started <- nil
	err := p.cmd.Wait()
	switch {
	case p.killed.Load():
		p.err = fmt.Errorf("gateway process (pid %d) did not stop within %v of SIGTERM: %w", p.cmd.Process.Pid, stopGrace, err)
	case err != nil:
		p.err = fmt.Errorf("gateway process (pid %d): %w", p.cmd.Process.Pid, err)
		// A process that exits says why last; one a signal killed
		// had no word.
		if last := p.tail.lastLine(); last != "" && p.cmd.ProcessState.Exited() {
			p.err = fmt.Errorf("%w; its stderr ends: %s", p.err, last)
		}
	}
	close(p.done)
}

// Pid returns the child's process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the child has exited and been reaped.
func (p *Process) Done() <-chan struct{} { return p.done }

// Err waits until Done is closed and returns why the child ended: nil if
// it exited with status 0 (it serves until SIGTERM or SIGINT, or until its
// stats socket closes), otherwise its exit status — with its last line of
// stderr if it exited — or the signal that killed it.
func (p *Process) Err() error {
	<-p.done
	return p.err
}

// Stop asks the child to end (SIGTERM), SIGKILLs it if it has not within
// a few seconds, waits until it is reaped and returns Err. Stop is
// idempotent; a child that already ended is only reaped.
func (p *Process) Stop() error {
	p.stopOnce.Do(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			grace := time.NewTimer(stopGrace)
			select {
			case <-p.done:
			case <-grace.C:
				p.killed.Store(true)
				_ = p.cmd.Process.Kill()
				<-p.done
			}
			grace.Stop()
		}
		p.stats.Close()
	})
	return p.Err()
}

// Stats returns the gateway's services as the child counts them, or nil
// if the child does not answer (gone, or not within statsTimeout).
func (p *Process) Stats() []ctlapi.GatewayStat {
	r, _ := p.report()
	return r.Gateway
}

// TrunkStats returns the gateway's trunks as the child counts them, or
// nil if the child does not answer.
func (p *Process) TrunkStats() []ctlapi.TrunkStat {
	r, _ := p.report()
	return r.Trunks
}

// report asks the child for its counters.
func (p *Process) report() (statsReply, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq++
	if err := p.stats.SetDeadline(time.Now().Add(statsTimeout)); err != nil {
		return statsReply{}, err
	}
	if err := json.NewEncoder(p.stats).Encode(statsRequest{Seq: p.seq}); err != nil {
		return statsReply{}, fmt.Errorf("gateway stats: %w", err)
	}
	for {
		line, err := p.rd.ReadBytes('\n')
		if err != nil {
			return statsReply{}, fmt.Errorf("gateway stats: %w", err)
		}
		var r statsReply
		// A line that does not parse is the rest of one a timed-out
		// read cut; one of an older Seq answers a timed-out request.
		if json.Unmarshal(line, &r) == nil && r.Seq == p.seq {
			return r, nil
		}
	}
}

// tailWriter passes what it is written on to w and keeps the last
// stderrTail bytes.
type tailWriter struct {
	w io.Writer

	mu sync.Mutex
	// mu protects the following field.
	tail []byte
}

func (t *tailWriter) Write(b []byte) (int, error) {
	t.mu.Lock()
	t.tail = append(t.tail, b...)
	if len(t.tail) > stderrTail {
		t.tail = append([]byte(nil), t.tail[len(t.tail)-stderrTail:]...)
	}
	t.mu.Unlock()
	return t.w.Write(b)
}

// lastLine returns the last non-empty line written.
func (t *tailWriter) lastLine() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimRight(string(t.tail), "\n")
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// socketPair returns the two ends of a Unix stream socketpair, both
// close-on-exec (exec.Cmd's ExtraFiles clears the flag in the child).
func socketPair() (*os.File, *os.File, error) {
	syscall.ForkLock.RLock() // no fork may inherit them before close-on-exec is set
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fds[0])
		syscall.CloseOnExec(fds[1])
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "gateway stats"), os.NewFile(uintptr(fds[1]), "gateway stats (child)"), nil
}
