//go:build integration

package test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/tools/rack"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/socklike"
)

// Local boundaries (issue 40): another local user, as uid 65534, against
// the daemons of an emulated rack. The test binary runs as root; it
// re-executes a copy of itself as the other user, which runs a role and
// checks what the daemons refuse it (its failure is the test's).

// trustEnv holds a trust role's parameters (JSON trustParams).
const trustEnv = "NTSTACK_TEST_TRUST"

// nobody is the other local user.
var nobody = &syscall.Credential{Uid: 65534, Gid: 65534, Groups: []uint32{}}

func init() {
	roles["localuser"] = roleLocalUser
	roles["flooder"] = roleFlooder
}

// trustParams are the parameters of the trust roles.
type trustParams struct {
	Monitor  string // ntmon's local API socket
	Proxy    string // ntproxy's application socket
	RootPort int    // a port root holds (localuser)
	RootPID  int    // the pid holding it
	Echo     string // an echo server's rack address (localuser)
	// Privileged: the role has CAP_NET_BIND_SERVICE, and takes ports
	// below 1024 (localuser).
	Privileged bool
	Flood      int // connections to hold on Proxy without a hello (flooder)
}

var (
	selfCopiesMu sync.Mutex
	selfCopies   = map[*testing.T]string{}
)

// otherUserBinary is a copy of the test binary that another user may
// execute (the build directory is root's alone), one per test, removed
// when it ends.
func otherUserBinary(t *testing.T) string {
	t.Helper()
	selfCopiesMu.Lock()
	defer selfCopiesMu.Unlock()
	if path, ok := selfCopies[t]; ok {
		return path
	}
	self, err := os.Executable()
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", "ntstack-trust-")
	require.NoError(t, err)
	t.Cleanup(func() {
		os.RemoveAll(dir)
		selfCopiesMu.Lock()
		delete(selfCopies, t)
		selfCopiesMu.Unlock()
	})
	require.NoError(t, os.Chmod(dir, 0o755))
	b, err := os.ReadFile(self)
	require.NoError(t, err)
	path := filepath.Join(dir, "ntstack-test")
	require.NoError(t, os.WriteFile(path, b, 0o755))
	selfCopies[t] = path
	return path
}

// startAs starts a copy of the test binary as cred, with the ambient
// capabilities caps, running role with p; like startChild, it dies with
// the test and cleanup reaps it.
func startAs(t *testing.T, role string, p trustParams, cred *syscall.Credential, caps []uintptr) *child {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("running a child as another user needs root")
	}
	params, err := json.Marshal(p)
	require.NoError(t, err)
	cmd := exec.Command(otherUserBinary(t), "-test.run=^$")
	cmd.Env = append(os.Environ(), roleEnv+"="+role, paramsEnv+"={}", trustEnv+"="+string(params))
	cmd.Dir = "/"
	cmd.SysProcAttr = proc.KillWithParent()
	cmd.SysProcAttr.Credential = cred
	cmd.SysProcAttr.AmbientCaps = caps
	c := &child{t: t, cmd: cmd, reports: make(chan report, 64), done: make(chan struct{})}
	c.stderr = &logWriter{t: t, prefix: "child " + role}
	cmd.Stderr = c.stderr
	cmd.Stdout = &reportWriter{c: c}
	c.stdin, err = cmd.StdinPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c.stderr.setPrefix(fmt.Sprintf("child %s[%d] uid %d", role, cmd.Process.Pid, cred.Uid))
	go func() {
		c.waitErr = cmd.Wait()
		c.stderr.flush()
		close(c.done)
	}()
	t.Cleanup(func() {
		c.stdin.Close()
		c.cmd.Process.Kill()
		<-c.done
	})
	return c
}

func trustParamsFromEnv() (trustParams, error) {
	var p trustParams
	if err := json.Unmarshal([]byte(os.Getenv(trustEnv)), &p); err != nil {
		return p, fmt.Errorf("%s: %w", trustEnv, err)
	}
	return p, nil
}

// wantCode checks that err carries code.
func wantCode(what string, err error, code ctlapi.Code) error {
	if got := ctlapi.CodeOf(err); got != code {
		return fmt.Errorf("%s: got %v (%v), want %v", what, got, err, code)
	}
	return nil
}

// roleLocalUser is another local user trying what it must not: release
// root's reservation, reserve port 22 posing as root, take a port below
// 1024 through ntproxy, see root's applications and traffic. It checks
// that every attempt fails, that it gets what is its own, and then holds
// its application, listener and reservation until its stdin closes.
func roleLocalUser(ctl *childCtl, _ childParams) error {
	p, err := trustParamsFromEnv()
	if err != nil {
		return err
	}
	me := os.Getuid()
	ctx := context.Background()
	mon := ctlapi.NewClient(p.Monitor)
	defer mon.Close()
	px, err := socklike.AttachProxy(p.Proxy, socklike.Config{})
	if err != nil {
		return fmt.Errorf("attach as uid %d: %w", me, err)
	}
	defer px.Close()

	if p.Privileged {
		// CAP_NET_BIND_SERVICE without root: the kernel's rule lets it in.
		ln, err := (&socklike.ListenConfig{Proxy: px}).Listen(context.Background(), "tcp", ":24")
		if err != nil {
			return fmt.Errorf("listen on port 24 with CAP_NET_BIND_SERVICE: %w", err)
		}
		defer ln.Close()
		if err := mon.Call(ctx, ctlapi.PathListen, ctlapi.ListenRequest{Port: 25}, nil); err != nil {
			return fmt.Errorf("reserve port 25 with CAP_NET_BIND_SERVICE: %w", err)
		}
		ctl.emit(report{Ready: true})
		<-ctl.quit
		return nil
	}

	// Root's reservation stays root's, whatever pid the body claims.
	for _, pid := range []int{0, p.RootPID} {
		err := mon.Call(ctx, ctlapi.PathUnlisten, ctlapi.ListenRequest{UID: 0, PID: pid, Port: p.RootPort}, nil)
		if err := wantCode(fmt.Sprintf("unlisten root's port %d claiming pid %d", p.RootPort, pid), err, ctlapi.CodeDenied); err != nil {
			return err
		}
	}
	// Port 22 as "pid 1, uid 0".
	err = mon.Call(ctx, ctlapi.PathListen, ctlapi.ListenRequest{UID: 0, PID: 1, Port: 22}, nil)
	if err := wantCode("reserve port 22 as pid 1 of uid 0", err, ctlapi.CodeDenied); err != nil {
		return err
	}
	// A port above 1023, reserved as itself whatever the body says.
	if err := mon.Call(ctx, ctlapi.PathListen, ctlapi.ListenRequest{UID: 0, PID: 1, Port: 7301}, nil); err != nil {
		return fmt.Errorf("reserve port 7301: %w", err)
	}
	// Through ntproxy: no port below 1024, its own above.
	if ln, err := (&socklike.ListenConfig{Proxy: px}).Listen(context.Background(), "tcp", ":23"); err == nil {
		ln.Close()
		return errors.New("listened on port 23 through ntproxy as uid 65534")
	} else if !strings.Contains(err.Error(), "CAP_NET_BIND_SERVICE") {
		return fmt.Errorf("listen on port 23: %v, want a refusal naming CAP_NET_BIND_SERVICE", err)
	}
	ln, err := (&socklike.ListenConfig{Proxy: px}).Listen(context.Background(), "tcp", ":7300")
	if err != nil {
		return fmt.Errorf("listen on port 7300: %w", err)
	}
	defer ln.Close()
	// Traffic of its own.
	c, err := (&socklike.Dialer{Proxy: px}).Dial("tcp", p.Echo)
	if err != nil {
		return fmt.Errorf("dial %s: %w", p.Echo, err)
	}
	defer c.Close()
	if err := echoCheck(c, 3, 8192); err != nil {
		return err
	}

	// Status: its own part, and nothing of root's.
	var st ctlapi.Status
	if err := mon.Call(ctx, ctlapi.PathStatus, nil, &st); err != nil {
		return fmt.Errorf("status: %w", err)
	}
	var ports []int
	for _, e := range st.Listening {
		if e.UID != me {
			return fmt.Errorf("status shows uid %d reservation %+v", me, e)
		}
		ports = append(ports, e.Port)
	}
	if !slices.Contains(ports, 7300) || !slices.Contains(ports, 7301) {
		return fmt.Errorf("status shows reservations %v, want 7300 and 7301", ports)
	}
	if st.Proxy == nil {
		return fmt.Errorf("status without ntproxy's part: %s", st.ProxyErr)
	}
	own := map[uint64]bool{}
	for _, a := range st.Proxy.Apps {
		if a.UID != me {
			return fmt.Errorf("status shows uid %d application %+v", me, a)
		}
		own[a.ID] = true
	}
	if len(own) == 0 {
		return errors.New("status shows none of its applications")
	}
	var traffic uint64
	for _, cs := range st.Proxy.Conns {
		if !own[cs.App] {
			return fmt.Errorf("status shows uid %d another user's connection %+v", me, cs)
		}
		traffic += cs.BytesTX
	}
	if traffic == 0 {
		return fmt.Errorf("status shows none of its own traffic: %+v", st.Proxy.Conns)
	}
	for _, l := range st.Proxy.Links {
		for _, part := range l.Partitions {
			if part.BytesTX != 0 || part.BytesRX != 0 || part.Conns != 0 {
				return fmt.Errorf("status shows link %s's traffic, every user's: %+v", l.Name, part)
			}
		}
	}
	if !strings.Contains(st.Scope, fmt.Sprintf("uid %d only", me)) {
		return fmt.Errorf("status scope %q does not say it is uid %d's part", st.Scope, me)
	}
	if st.Proxy.Gateway != nil {
		return fmt.Errorf("status shows the gateway: %+v", st.Proxy.Gateway)
	}
	ctl.logf("uid %d: every refusal as expected; status shows its %d application(s) and reservations %v", me, len(own), ports)
	ctl.emit(report{Ready: true})
	<-ctl.quit
	return nil
}

// roleFlooder opens p.Flood connections to ntproxy's application socket
// and holds them, saying nothing, until its stdin closes.
func roleFlooder(ctl *childCtl, _ childParams) error {
	p, err := trustParamsFromEnv()
	if err != nil {
		return err
	}
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	failed := 0
	for range p.Flood {
		c, err := net.Dial("unix", p.Proxy)
		if err != nil {
			failed++
			continue
		}
		held = append(held, c)
	}
	ctl.logf("uid %d: %d connections to %s open, %d refused", os.Getuid(), len(held), p.Proxy, failed)
	ctl.emit(report{Ready: true})
	<-ctl.quit
	return nil
}

// TestLocalTrust: a non-root local user cannot release another user's
// reservation, reserve a port below 1024 posing as root, take one through
// ntproxy, or see another user's applications and traffic in status;
// root can do all of it, and a non-root process with CAP_NET_BIND_SERVICE
// takes ports below 1024, as the kernel's rule.
func TestLocalTrust(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("another local user needs a root test binary to start it")
	}
	r := startRack(t, rack.Spec{Hosts: []string{"a", "b"}})
	a, b := r.Host("a"), r.Host("b")
	srvB := attachTo(t, b)
	lnB, err := (&socklike.ListenConfig{Proxy: srvB}).Listen(context.Background(), "tcp", ":7200")
	require.NoError(t, err)
	defer lnB.Close()
	go serveEcho(lnB)

	// Root: a reservation, a port below 1024, traffic.
	root := attachTo(t, a)
	ln, err := (&socklike.ListenConfig{Proxy: root}).Listen(context.Background(), "tcp", ":7100")
	require.NoError(t, err)
	defer ln.Close()
	go serveEcho(ln)
	ln80, err := (&socklike.ListenConfig{Proxy: root}).Listen(context.Background(), "tcp", ":80")
	require.NoError(t, err, "root takes a port below 1024")
	defer ln80.Close()
	c, err := (&socklike.Dialer{Proxy: root}).Dial("tcp", "b:7200")
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, echoCheck(c, 1, 8192))

	other := startAs(t, "localuser", trustParams{
		Monitor: a.Config.Path(config.MonitorSocket), Proxy: a.Config.Path(config.ProxySocket),
		RootPort: 7100, RootPID: os.Getpid(), Echo: "b:7200",
	}, nobody, nil)
	require.True(t, other.next(60*time.Second).Ready)

	// Root sees every user's reservations, applications and traffic.
	st, err := status(a)
	require.NoError(t, err)
	held := map[int]int{}
	for _, e := range st.Listening {
		held[e.Port] = e.UID
	}
	require.Equal(t, 0, held[7100], "root's reservation stays")
	require.Equal(t, 0, held[80])
	require.Equal(t, 65534, held[7300])
	require.Equal(t, 65534, held[7301])
	require.NotNil(t, st.Proxy, st.ProxyErr)
	require.Empty(t, st.Scope, "root's view is everything")
	apps := map[uint64]int{}
	for _, ap := range st.Proxy.Apps {
		apps[ap.ID] = ap.UID
	}
	traffic := map[int]uint64{}
	for _, cs := range st.Proxy.Conns {
		traffic[apps[cs.App]] += cs.BytesTX
	}
	require.NotZero(t, traffic[0], "root's traffic: %+v", st.Proxy.Conns)
	require.NotZero(t, traffic[65534], "the other user's traffic, to root: %+v", st.Proxy.Conns)

	// Root releases another user's reservation.
	mon := ctlapi.NewClient(a.Config.Path(config.MonitorSocket))
	defer mon.Close()
	require.NoError(t, mon.Call(context.Background(), ctlapi.PathUnlisten, ctlapi.ListenRequest{Port: 7301}, nil))
	other.finish(30 * time.Second)

	// The kernel's rule: CAP_NET_BIND_SERVICE without root suffices.
	capable := startAs(t, "localuser", trustParams{
		Monitor: a.Config.Path(config.MonitorSocket), Proxy: a.Config.Path(config.ProxySocket), Privileged: true,
	}, nobody, []uintptr{proc.CapNetBindService})
	require.True(t, capable.next(60*time.Second).Ready)
	st, err = status(a)
	require.NoError(t, err)
	held = map[int]int{}
	for _, e := range st.Listening {
		held[e.Port] = e.UID
	}
	require.Equal(t, 65534, held[24])
	require.Equal(t, 65534, held[25])
	capable.finish(30 * time.Second)
}

// floodLimit is RLIMIT_NOFILE of the flooded ntproxy.
const floodLimit = 256

// TestFloodSurvives: an ntproxy with 256 descriptors survives 600
// connections held open on its TCP fallback port (from ten addresses, so
// that the per-address bound does not stop them all: it runs out of
// descriptors) and 600 on its application socket from another user; it
// neither exits nor wedges, attaches root's application while the other
// user's flood still holds, and serves a peer's dial over the fallback
// and a new application's attach and dial afterwards.
func TestFloodSurvives(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("the flood's other user needs a root test binary to start it")
	}
	bin := daemons(t)
	ds := rack.Daemons(bin)
	for i := range ds {
		if ds[i].Name != "ntproxy" {
			continue
		}
		argv := ds[i].Argv
		ds[i].Argv = func(h *rack.Host) []string {
			if h.Name != "a" {
				return argv(h)
			}
			return append([]string{"prlimit", fmt.Sprintf("--nofile=%d:%d", floodLimit, floodLimit), "--"}, argv(h)...)
		}
	}
	r := startRack(t, rack.Spec{Hosts: []string{"a", "b"}, Daemons: ds})
	a, b := r.Host("a"), r.Host("b")
	pid := r.Pid("a", "ntproxy")
	require.NotZero(t, pid)
	limits, err := os.ReadFile(fmt.Sprintf("/proc/%d/limits", pid))
	require.NoError(t, err)
	require.Regexp(t, fmt.Sprintf(`Max open files\s+%d\s+%d`, floodLimit, floodLimit), string(limits))

	srvA := attachTo(t, a)
	lnA, err := (&socklike.ListenConfig{Proxy: srvA}).Listen(context.Background(), "tcp", ":7400")
	require.NoError(t, err)
	defer lnA.Close()
	go serveEcho(lnA)
	srvB := attachTo(t, b)
	lnB, err := (&socklike.ListenConfig{Proxy: srvB}).Listen(context.Background(), "tcp", ":7500")
	require.NoError(t, err)
	defer lnB.Close()
	go serveEcho(lnB)
	cliB := attachTo(t, b)
	// overFallback dials a's listener from b over the TCP fallback.
	overFallback := func(seed uint64) error {
		d := &socklike.Dialer{Proxy: cliB, Transports: []string{"tcp"}}
		c, err := d.Dial("tcp", "a:7400")
		if err != nil {
			return err
		}
		defer c.Close()
		if p := c.(*socklike.Conn).Route().Path; p != ctlapi.PathTCP {
			return fmt.Errorf("path %s, want tcp", p)
		}
		return echoCheck(c, seed, 64<<10)
	}
	// attachAndDial is a new application on a dialing b.
	attachAndDial := func(seed uint64) error {
		p, err := socklike.AttachProxy(a.Config.Path(config.ProxySocket), socklike.Config{})
		if err != nil {
			return err
		}
		defer p.Close()
		c, err := (&socklike.Dialer{Proxy: p}).Dial("tcp", "b:7500")
		if err != nil {
			return err
		}
		defer c.Close()
		return echoCheck(c, seed, 64<<10)
	}
	require.NoError(t, overFallback(1))

	// The fallback flood, from ten addresses of a's namespace.
	const sources, flood = 10, 600
	for i := range sources {
		out, err := r.Exec("a", "ip", "addr", "add", fmt.Sprintf("10.123.0.%d/32", i+1), "dev", "lo").CombinedOutput()
		require.NoError(t, err, "%s", out)
	}
	fallback := net.JoinHostPort(a.IP.String(), fmt.Sprint(rack.FallbackPort))
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	refused := 0
	require.NoError(t, r.Enter("a", func() error {
		for i := range flood {
			d := net.Dialer{Timeout: 10 * time.Second, LocalAddr: &net.TCPAddr{IP: net.IPv4(10, 123, 0, byte(i%sources+1))}}
			c, err := d.Dial("tcp", fallback)
			if err != nil {
				refused++
				continue
			}
			held = append(held, c)
		}
		return nil
	}))
	t.Logf("fallback flood: %d connections held, %d refused", len(held), refused)

	// The application-socket flood, from another user.
	flooder := startAs(t, "flooder", trustParams{Proxy: a.Config.Path(config.ProxySocket), Flood: flood}, nobody, nil)
	require.True(t, flooder.next(60*time.Second).Ready)

	// ntproxy ran out of descriptors, said so, and kept running.
	logPath := a.LogPath("ntproxy")
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(logPath)
		return err == nil && strings.Contains(string(b), "too many open files")
	}, 60*time.Second, 20*time.Millisecond, "ntproxy on a never ran out of descriptors")

	// The fallback flood ends. The other user still holds its 600: its
	// excess was closed at once and its pending attaches do not count
	// against root's, so root's new application gets in.
	for _, c := range held {
		c.Close()
	}
	held = nil
	require.Eventually(t, func() bool {
		err := attachAndDial(4)
		if err != nil {
			t.Logf("attach and dial beside the other user's flood: %v", err)
		}
		return err == nil
	}, 60*time.Second, 50*time.Millisecond)

	// The floods end; ntproxy is the same process and serves as before.
	flooder.finish(30 * time.Second)
	require.Eventually(t, func() bool {
		err := overFallback(2)
		if err != nil {
			t.Logf("dial over the fallback after the flood: %v", err)
		}
		return err == nil
	}, 60*time.Second, 50*time.Millisecond)
	require.Eventually(t, func() bool {
		err := attachAndDial(3)
		if err != nil {
			t.Logf("attach and dial after the flood: %v", err)
		}
		return err == nil
	}, 60*time.Second, 50*time.Millisecond)
	require.Equal(t, pid, r.Pid("a", "ntproxy"), "ntproxy on a exited")
	b2, err := os.ReadFile(logPath)
	require.NoError(t, err)
	t.Logf("ntproxy on a, its accept errors:\n%s", grepLines(string(b2), "accept on"))
	// The listener that saw the shortage accepts again.
	require.Contains(t, string(b2), "accepting again")
}

// grepLines returns the lines of s that contain sub (at most 20).
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && len(out) < 20 {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
