package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ntstack/ntstack/internal/prim/proc"
)

// The server process and the client talk over the server's standard input
// and output, one line each way:
//
//	server → client  "READY <addr>"    once, when listening
//	client → server  "cpu"             report your CPU time
//	server → client  "cpu <ns>"        user+system CPU time so far
//
// End of standard input tells the server to close everything and exit.

// serve is the server process: it listens on o.transport, serves o.mode on
// every connection it accepts, and answers control requests on stdin until
// stdin ends.
func serve(o *options, stdin io.Reader, stdout io.Writer) error {
	t, ok := transports[o.transport]
	if !ok {
		return fmt.Errorf("unknown transport %q", o.transport)
	}
	m, ok := modeNamed(o.mode)
	if !ok {
		return fmt.Errorf("unknown mode %q", o.mode)
	}
	if o.gomaxprocs > 0 {
		runtime.GOMAXPROCS(o.gomaxprocs)
	}
	if o.cpu >= 0 {
		if err := proc.SetAffinity([]int{o.cpu}); err != nil {
			return err
		}
	}
	stop, err := startCapture(o.cpuprofile, o.trace) // named by the client
	if err != nil {
		return err
	}
	defer stop()
	ln, addr, err := t.listen(o)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	s := &server{ln: ln, o: o, serve: m.serve, conns: make(map[net.Conn]struct{})}
	s.wg.Add(1)
	go s.runAccept()

	_, err = fmt.Fprintf(stdout, "READY %s\n", addr)
	if err == nil {
		err = control(stdin, stdout)
	}
	return errors.Join(err, s.shutdown())
}

// control answers the client's requests until stdin ends.
func control(stdin io.Reader, stdout io.Writer) error {
	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		if sc.Text() != "cpu" {
			return fmt.Errorf("control: unknown request %q", sc.Text())
		}
		cpu, err := proc.CPUTime()
		if err != nil {
			return fmt.Errorf("control: %w", err)
		}
		if _, err := fmt.Fprintf(stdout, "cpu %d\n", cpu.Nanoseconds()); err != nil {
			return fmt.Errorf("control: %w", err)
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("control: %w", err)
	}
	return nil
}

// server runs one mode on every connection a listener accepts.
type server struct {
	ln    net.Listener
	o     *options
	serve func(net.Conn, *options) error
	wg    sync.WaitGroup // runAccept and one per connection

	// mu protects the following fields.
	mu      sync.Mutex
	conns   map[net.Conn]struct{} // open connections
	closing bool                  // shutdown has begun; later errors are its echo
	errs    []error
}

func (s *server) runAccept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			s.fail(fmt.Errorf("accept: %w", err))
			return
		}
		s.mu.Lock()
		if s.closing {
			s.mu.Unlock()
			c.Close()
			return
		}
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Go(func() {
			if err := s.serve(c, s.o); err != nil {
				s.fail(err)
			}
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
			c.Close()
		})
	}
}

// fail records a connection's or the listener's error, unless shutdown
// caused it.
func (s *server) fail(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closing {
		s.errs = append(s.errs, err)
	}
}

// shutdown closes the listener and every open connection, waits for their
// goroutines and returns the errors they met before shutdown began.
func (s *server) shutdown() error {
	s.mu.Lock()
	s.closing = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	lnErr := s.ln.Close()
	s.wg.Wait()
	if lnErr != nil {
		lnErr = fmt.Errorf("close listener: %w", lnErr)
	}
	return errors.Join(append(s.errs, lnErr)...)
}

// hangTimeout is how long past its deadline a measurement (or a server's
// start or stop) may run before ntbench declares it hung, kills the server
// and reports an error rather than waiting forever. Tests shorten it.
var hangTimeout = 30 * time.Second

// serverProc is the client's handle on a running server process.
type serverProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	addr   string // from the READY line
}

// startServer starts a server process with args and waits until it is
// listening. Its standard error goes to stderr.
func startServer(args []string, stderr io.Writer) (*serverProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("start server: %w", err)
	}
	cmd := exec.Command(self, args...)
	cmd.Stderr = stderr
	cmd.SysProcAttr = proc.KillWithParent()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("start server: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("start server: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start server: %w", err)
	}
	s := &serverProc{cmd: cmd, stdin: stdin, stdout: bufio.NewReader(stdout)}
	watchdog := time.AfterFunc(hangTimeout, s.kill)
	line, err := s.stdout.ReadString('\n')
	watchdog.Stop()
	addr, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "READY ")
	if err != nil || !ok {
		return nil, errors.Join(fmt.Errorf("server did not report READY (got %q): %w", line, err), s.stop())
	}
	s.addr = addr
	return s, nil
}

// cpuTime asks the server for the CPU time it has used so far.
func (s *serverProc) cpuTime() (time.Duration, error) {
	if _, err := io.WriteString(s.stdin, "cpu\n"); err != nil {
		return 0, fmt.Errorf("ask server for its cpu time: %w", err)
	}
	line, err := s.stdout.ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("read server cpu time: %w", err)
	}
	v, _ := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "cpu ")
	ns, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read server cpu time from %q: %w", line, err)
	}
	return time.Duration(ns), nil
}

// kill ends the server at once. It is safe to call at any time and more
// than once.
func (s *serverProc) kill() {
	_ = s.cmd.Process.Kill() // fails only if it has exited already
}

// stop closes the server's stdin, which makes it exit, and waits for it,
// killing it if it takes longer than hangTimeout.
func (s *serverProc) stop() error {
	s.stdin.Close()
	watchdog := time.AfterFunc(hangTimeout, s.kill)
	err := s.cmd.Wait()
	if !watchdog.Stop() {
		return fmt.Errorf("server did not exit within %v of its stdin closing; killed it", hangTimeout)
	}
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	return nil
}
