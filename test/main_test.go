//go:build integration

package test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/ntb/shm"
)

// The environment of a child process.
const (
	roleEnv   = "NTSTACK_TEST_ROLE"   // name of the role function to run
	paramsEnv = "NTSTACK_TEST_PARAMS" // its parameters, JSON childParams
	seedEnv   = "NTSTACK_TEST_SEED"   // overrides defaultSeed (tests only)

	defaultSeed = 20240601
	linkName    = "link"
)

// roles are the functions a child process can run. A role returns when it
// is done or when the test closes the child's stdin (ctl.quit).
var roles = map[string]func(ctl *childCtl, p childParams) error{
	"stress":      roleStress,
	"kill":        roleKill,
	"idle":        roleIdle,
	"proxystream": roleProxyStream,
	"hog":         roleHog,
	"loadserve":   roleLoadServe,
	"sink":        roleSink,
	"hold":        roleHold,
}

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(runChild(role))
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir) // the daemons built for the racks (daemons)
	}
	os.Exit(code)
}

// childParams are a child's parameters, shared by every role.
type childParams struct {
	Dir      string   // fabric directory
	Side     shm.Side // which end of the link to attach
	Listen   bool     // the child listens (else it dials)
	BasePort int      // connection i uses port BasePort+i
	Conns    int
	Msgs     int    // messages per stream and direction (roleStress)
	Seed     uint64 // seeds every random choice
	Budget   time.Duration
	Proxy    string // ntproxy socket to attach to (roleProxyStream)
	Target   string // host:port to dial through it
	Pool     bool   // dial it in shared-pool mode
	Core     transport.CoreModel
}

// report is one line a child writes on stdout.
type report struct {
	Ready   bool          `json:"ready,omitempty"`   // connected, streams running
	Summary []connSummary `json:"summary,omitempty"` // roleStress: totals per connection
	CPU     time.Duration `json:"cpu,omitempty"`     // answer to "cpu": CPU time used so far
	Echoed  int           `json:"echoed,omitempty"`  // roleIdle: connections that echoed
	Resets  []string      `json:"resets,omitempty"`  // roleLoadServe: connections that failed, and how
	Bytes   int64         `json:"bytes,omitempty"`   // roleSink: bytes received
	Sum     string        `json:"sum,omitempty"`     // roleSink: their SHA-256, hex
	Pause   time.Duration `json:"pause,omitempty"`   // roleSink: the longest wait for data
	Err     string        `json:"err,omitempty"`     // roleSink: how the stream ended, if not at io.EOF
}

// childCtl is a child's side of the conversation with the test.
type childCtl struct {
	mu   sync.Mutex
	out  *json.Encoder // stdout, guarded by mu
	cmds chan string   // commands read from stdin
	quit chan struct{} // closed at EOF on stdin: finish and exit
}

func (c *childCtl) emit(r report) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.out.Encode(r); err != nil {
		fmt.Fprintf(os.Stderr, "write report: %v\n", err)
		os.Exit(2)
	}
}

func (c *childCtl) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

// runChild runs a role in a child process and returns its exit code.
func runChild(role string) int {
	f := roles[role]
	if f == nil {
		fmt.Fprintf(os.Stderr, "unknown role %q\n", role)
		return 2
	}
	var p childParams
	if err := json.Unmarshal([]byte(os.Getenv(paramsEnv)), &p); err != nil {
		fmt.Fprintf(os.Stderr, "role %s: parameters: %v\n", role, err)
		return 2
	}
	ctl := &childCtl{out: json.NewEncoder(os.Stdout), cmds: make(chan string, 16), quit: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(os.Stdin)
		for sc.Scan() {
			ctl.cmds <- sc.Text()
		}
		close(ctl.quit)
		// A role that does not wind up promptly after the test let go of
		// it must not outlive the test. The sleep is this watchdog's
		// deadline, not a synchronisation: the role's return ends the
		// process first.
		time.Sleep(10 * time.Second)
		fmt.Fprintf(os.Stderr, "role %s: still running 10s after stdin closed\n", role)
		os.Exit(3)
	}()
	if err := f(ctl, p); err != nil {
		fmt.Fprintf(os.Stderr, "role %s: %v\n", role, err)
		return 1
	}
	return 0
}

// seed is the seed of this run: defaultSeed unless NTSTACK_TEST_SEED says
// otherwise. It is logged so that a failure can be replayed.
func seed(t *testing.T) uint64 {
	t.Helper()
	s := uint64(defaultSeed)
	if v := os.Getenv(seedEnv); v != "" {
		var err error
		s, err = strconv.ParseUint(v, 0, 64)
		require.NoError(t, err, "%s", seedEnv)
	}
	t.Logf("seed %d (set %s to replay another)", s, seedEnv)
	return s
}

var dirSeq atomic.Int64

// fabricDir is a fresh directory under /dev/shm for one test's link,
// removed at cleanup. The name matches what `make clean` removes.
func fabricDir(t *testing.T) string {
	t.Helper()
	if fi, err := os.Stat("/dev/shm"); err != nil || !fi.IsDir() {
		t.Skipf("the emulated fabric needs a tmpfs at /dev/shm: %v", err)
	}
	dir := filepath.Join("/dev/shm", fmt.Sprintf("ntstack-test-integration-%d-%d", os.Getpid(), dirSeq.Add(1)))
	require.NoError(t, os.MkdirAll(dir, 0o700))
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// openEnd attaches the test process to side of the link in dir.
func openEnd(t *testing.T, dir string, side shm.Side) *transport.Endpoint {
	t.Helper()
	return openEndCore(t, dir, side, transport.CoreInline)
}

// openEndCore is openEnd with the given core model.
func openEndCore(t *testing.T, dir string, side shm.Side, core transport.CoreModel) *transport.Endpoint {
	t.Helper()
	logf := func(format string, args ...any) { t.Logf("parent: "+format, args...) }
	ep, err := transport.Open(linkName, endpointConfig(dir, side, core, logf))
	require.NoError(t, err)
	logged := logLinkEvents(ep, logf)
	t.Cleanup(func() { <-logged }) // after Close: no logging once the test is over
	t.Cleanup(func() { require.NoError(t, ep.Close()) })
	return ep
}

// logLinkEvents logs the device's link changes with their reasons (nothing
// else reads them; the session layer only logs "link down"). The returned
// channel is closed when the device has closed and every event is logged.
func logLinkEvents(ep *transport.Endpoint, logf func(string, ...any)) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range ep.Device().LinkEvents() {
			logf("%s: link %v at %s: %s", ep.Device().Name(), ev.State, ev.Time.Format("15:04:05.000000"), ev.Reason)
		}
	}()
	return done
}

func endpointConfig(dir string, side shm.Side, core transport.CoreModel, logf func(string, ...any)) transport.Config {
	return transport.Config{Fabric: shm.Options{Dir: dir, Side: side}, CoreModel: core, Logf: logf}
}

// linkEnd is one process's end of the test's connections: connection i is
// made to port base+i, so both ends know which is which.
type linkEnd struct {
	ep     *transport.Endpoint
	listen bool
	base   int
	lns    []*transport.Listener // listen: one per connection
}

// newLinkEnd prepares an end; a listening end listens at once, so a dialer
// is refused only until then.
func newLinkEnd(ep *transport.Endpoint, listen bool, base, conns int) (*linkEnd, error) {
	e := &linkEnd{ep: ep, listen: listen, base: base}
	if listen {
		for i := range conns {
			ln, err := ep.Listen(base + i)
			if err != nil {
				e.close()
				return nil, err
			}
			e.lns = append(e.lns, ln)
		}
	}
	return e, nil
}

func (e *linkEnd) close() {
	for _, ln := range e.lns {
		ln.Close()
	}
}

// connect makes n connections (accepts them when listening, dials them
// otherwise) and returns them in port order.
func (e *linkEnd) connect(ctx context.Context, n int) ([]*transport.Conn, error) {
	conns := make([]*transport.Conn, 0, n)
	fail := func(err error) ([]*transport.Conn, error) {
		for _, c := range conns {
			c.Close()
		}
		return nil, err
	}
	for i := range n {
		var c *transport.Conn
		var err error
		if e.listen {
			c, err = accept(ctx, e.lns[i])
		} else {
			c, err = dial(ctx, e.ep, e.base+i)
		}
		if err != nil {
			return fail(fmt.Errorf("connection %d: %w", i, err))
		}
		conns = append(conns, c)
	}
	return conns, nil
}

// dial dials port, trying again while the peer is not listening yet.
func dial(ctx context.Context, ep *transport.Endpoint, port int) (*transport.Conn, error) {
	for {
		c, err := ep.DialContext(ctx, port)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return c, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// accept accepts one connection on ln, until ctx ends (which closes ln).
func accept(ctx context.Context, ln *transport.Listener) (*transport.Conn, error) {
	type result struct {
		c   *transport.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := ln.AcceptConn()
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-ctx.Done():
		ln.Close()
		if r := <-ch; r.c != nil {
			r.c.Close()
		}
		return nil, ctx.Err()
	}
}

// childConnect opens a child's endpoint and connections as p says.
func childConnect(ctl *childCtl, p childParams) (*transport.Endpoint, []*transport.Conn, error) {
	ep, err := transport.Open(linkName, endpointConfig(p.Dir, p.Side, p.Core, ctl.logf))
	if err != nil {
		return nil, nil, err
	}
	logLinkEvents(ep, ctl.logf)
	end, err := newLinkEnd(ep, p.Listen, p.BasePort, p.Conns)
	if err != nil {
		return nil, nil, errors.Join(err, ep.Close())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	go func() { // the test gave up on us
		select {
		case <-ctl.quit:
			cancel()
		case <-ctx.Done():
		}
	}()
	conns, err := end.connect(ctx, p.Conns)
	end.close()
	if err != nil {
		return nil, nil, errors.Join(err, ep.Close())
	}
	return ep, conns, nil
}

// child is a child process running a role, as the test sees it.
type child struct {
	t       *testing.T
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	reports chan report   // parsed stdout lines
	done    chan struct{} // closed when the process has been reaped
	waitErr error         // set before done is closed
	stderr  *logWriter
}

// startChild starts the test binary as a child running role with p. The
// child dies with the test process (parent-death signal); cleanup kills and
// reaps it.
func startChild(t *testing.T, role string, p childParams) *child {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	params, err := json.Marshal(p)
	require.NoError(t, err)
	cmd := exec.Command(self, "-test.run=^$") // the flag only matters if the role were not dispatched
	cmd.Env = append(os.Environ(), roleEnv+"="+role, paramsEnv+"="+string(params))
	cmd.SysProcAttr = proc.KillWithParent()
	c := &child{t: t, cmd: cmd, reports: make(chan report, 64), done: make(chan struct{})}
	c.stderr = &logWriter{t: t, prefix: "child " + role}
	cmd.Stderr = c.stderr
	cmd.Stdout = &reportWriter{c: c}
	c.stdin, err = cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c.stderr.setPrefix(fmt.Sprintf("child %s[%d]", role, cmd.Process.Pid))
	go func() {
		c.waitErr = cmd.Wait()
		c.stderr.flush()
		close(c.done)
	}()
	t.Cleanup(func() {
		c.stdin.Close()
		c.cmd.Process.Kill() // fails harmlessly if it has exited
		<-c.done
	})
	return c
}

// next returns the child's next report, failing the test if the child
// exits or says nothing for timeout.
func (c *child) next(timeout time.Duration) report {
	c.t.Helper()
	select {
	case r := <-c.reports:
		return r
	case <-c.done:
		select {
		case r := <-c.reports: // the last words before it exited
			return r
		default:
		}
		c.t.Fatalf("child exited without reporting: %v", c.waitErr)
	case <-time.After(timeout):
		c.t.Fatalf("child said nothing for %v", timeout)
	}
	return report{} // not reached: Fatalf ends the test
}

// command sends one command line to the child.
func (c *child) command(cmd string) {
	c.t.Helper()
	_, err := io.WriteString(c.stdin, cmd+"\n")
	require.NoError(c.t, err, "command %q to child", cmd)
}

// finish closes the child's stdin and requires it to exit successfully
// within timeout.
func (c *child) finish(timeout time.Duration) {
	c.t.Helper()
	c.stdin.Close()
	select {
	case <-c.done:
		require.NoError(c.t, c.waitErr, "child exit")
	case <-time.After(timeout):
		c.t.Fatalf("child still running %v after its stdin closed", timeout)
	}
}

// dump asks the child for a goroutine dump (SIGQUIT makes the Go runtime
// print one on stderr, which lands in the test log) and waits for it to
// exit. Used when something hangs.
func (c *child) dump() {
	c.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
	}
}

// reportWriter parses the child's stdout into reports.
type reportWriter struct {
	c   *child
	buf []byte
}

func (w *reportWriter) Write(b []byte) (int, error) {
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		line := w.buf[:i]
		var r report
		if err := json.Unmarshal(line, &r); err != nil {
			w.c.t.Errorf("child wrote %q on stdout: %v", line, err)
		} else {
			select {
			case w.c.reports <- r:
			default:
				w.c.t.Errorf("child reports piled up unread; dropped %q", line)
			}
		}
		w.buf = w.buf[i+1:]
	}
}

// logWriter copies a child's stderr into the test log, line by line.
type logWriter struct {
	t *testing.T

	mu sync.Mutex
	// mu protects the following fields.
	prefix string
	buf    []byte
}

func (w *logWriter) setPrefix(p string) {
	w.mu.Lock()
	w.prefix = p
	w.mu.Unlock()
}

func (w *logWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(b), nil
		}
		w.t.Logf("%s: %s", w.prefix, w.buf[:i])
		w.buf = w.buf[i+1:]
	}
}

func (w *logWriter) flush() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.buf) > 0 {
		w.t.Logf("%s: %s", w.prefix, w.buf)
		w.buf = nil
	}
}
