package rack_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/tools/rack"
)

// roleEnv selects what a re-executed test binary does instead of testing.
const roleEnv = "NTSTACK_RACK_TEST_ROLE"

func TestMain(m *testing.M) {
	switch role := os.Getenv(roleEnv); role {
	case "":
		os.Exit(m.Run())
	case "daemon":
		os.Exit(runDaemon(os.Args[1:]))
	case "dial":
		os.Exit(runDial(os.Args[1:]))
	case "orphan":
		os.Exit(runOrphan())
	default:
		fmt.Fprintf(os.Stderr, "unknown role %q\n", role)
		os.Exit(2)
	}
}

// standIns are daemons played by this test binary (runDaemon): "ntmon"
// listens on monitor.listen and ntmon.sock, "ntproxy" on the host's
// fallback port and ntproxy.sock.
func standIns(t testing.TB) []rack.Daemon {
	exe, err := os.Executable()
	require.NoError(t, err)
	mk := func(name, socket string) rack.Daemon {
		return rack.Daemon{
			Name:   name,
			Env:    []string{roleEnv + "=daemon"},
			Socket: socket,
			Argv: func(h *rack.Host) []string {
				return []string{exe, "-config", h.ConfigPath, "-daemon", name}
			},
		}
	}
	return []rack.Daemon{mk("ntmon", config.MonitorSocket), mk("ntproxy", config.ProxySocket)}
}

// runDaemon is a stand-in daemon: it loads its config, writes the config's
// path to <state dir>/<daemon>.started and answers every connection, on
// TCP and on its Unix socket, with "<host> <daemon> <pid>".
func runDaemon(args []string) int {
	fs := flag.NewFlagSet("daemon", flag.ContinueOnError)
	cfgPath := fs.String("config", "", "config file")
	daemon := fs.String("daemon", "", "ntmon or ntproxy")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "stand-in %s: %v\n", *daemon, err)
		return 1
	}
	c, err := config.Load(*cfgPath)
	if err != nil {
		return fail(err)
	}
	tcpAddr, socket := c.Monitor.Listen, config.MonitorSocket
	if *daemon == "ntproxy" {
		ip, _, _ := net.SplitHostPort(c.Monitor.Listen)
		tcpAddr, socket = net.JoinHostPort(ip, fmt.Sprint(rack.FallbackPort)), config.ProxySocket
	}
	tl, err := net.Listen("tcp", tcpAddr)
	if err != nil {
		return fail(err)
	}
	os.Remove(c.Path(socket))
	ul, err := net.Listen("unix", c.Path(socket))
	if err != nil {
		return fail(err)
	}
	if err := os.WriteFile(c.Path(*daemon+".started"), []byte(*cfgPath+"\n"), 0o644); err != nil {
		return fail(err)
	}
	fmt.Printf("%s listening on %s and %s\n", *daemon, tcpAddr, c.Path(socket))
	hello := fmt.Sprintf("%s %s %d\n", c.Host, *daemon, os.Getpid())
	for _, l := range []net.Listener{tl, ul} {
		go func() {
			for {
				conn, err := l.Accept()
				if err != nil {
					return
				}
				conn.Write([]byte(hello))
				conn.Close()
			}
		}()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	<-sig
	fmt.Printf("%s: SIGTERM\n", *daemon)
	return 0
}

// runDial dials each TCP address and prints "<addr> <first line>".
func runDial(addrs []string) int {
	code := 0
	for _, a := range addrs {
		line, err := hello(a)
		if err != nil {
			fmt.Printf("%s error %v\n", a, err)
			code = 1
			continue
		}
		fmt.Printf("%s %s\n", a, line)
	}
	return code
}

// hello dials addr and returns the first line it sends.
func hello(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// orphanReport is what runOrphan leaves behind.
type orphanReport struct {
	Name, FabricDir, StateRoot string
	Pids                       []int // daemons (parent-death signal) and a stray process (none)
}

// runOrphan starts a rack, and a process in one of its namespaces that
// has no parent-death signal, then exits without closing the rack, as a
// crashed test would.
func runOrphan() int {
	fail := func(err error) int {
		fmt.Fprintf(os.Stderr, "orphan: %v\n", err)
		return 1
	}
	r, err := rack.Start(context.Background(), rack.Spec{Hosts: []string{"a", "b"}, Daemons: standIns(nil)})
	if err != nil {
		return fail(err)
	}
	stray := r.Exec("b", "sleep", "600")
	stray.SysProcAttr = nil
	if err := stray.Start(); err != nil {
		return fail(err)
	}
	rep := orphanReport{Name: r.Name(), FabricDir: r.FabricDir(), StateRoot: r.StateRoot()}
	for _, h := range r.Hosts() {
		rep.Pids = append(rep.Pids, r.Pid(h.Name, "ntmon"), r.Pid(h.Name, "ntproxy"))
	}
	rep.Pids = append(rep.Pids, stray.Process.Pid)
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		return fail(err)
	}
	return 0
}

// ipOut runs ip and returns its output.
func ipOut(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	require.NoError(t, err, "ip %v: %s", args, out)
	return string(out)
}

// requireNoTrace checks that no namespace or link of the rack is left.
func requireNoTrace(t *testing.T, name string) {
	t.Helper()
	for _, line := range strings.Split(ipOut(t, "netns", "list"), "\n") {
		require.False(t, strings.HasPrefix(line, name+"-"), "namespace left: %s", line)
	}
	for _, line := range strings.Split(ipOut(t, "-o", "link", "show"), "\n") {
		require.NotContains(t, line, " "+name+"-", "link left")
	}
}

// gone reports whether pid has ended (a zombie counts as ended).
func gone(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	_, after, _ := strings.Cut(string(b), ") ")
	return strings.HasPrefix(after, "Z")
}

func TestRack(t *testing.T) {
	hosts := []string{"a", "b", "c"}
	acl := []config.Rule{{Action: "deny", Direction: "in", Host: "a", Port: 22}}
	r := rack.StartForTest(t, rack.Spec{
		Hosts:   hosts,
		Daemons: standIns(t),
		Window:  1 << 20,
		ACL:     map[string][]config.Rule{"c": acl},
	})
	name := r.Name()
	exe, err := os.Executable()
	require.NoError(t, err)
	dial := func(host string, addrs ...string) (string, error) {
		cmd := r.Exec(host, exe, addrs...)
		cmd.Env = append(cmd.Env, roleEnv+"=dial")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	control := func(h string) string { return netip.AddrPortFrom(r.Host(h).IP, rack.ControlPort).String() }
	fallback := func(h string) string { return netip.AddrPortFrom(r.Host(h).IP, rack.FallbackPort).String() }

	t.Run("addresses", func(t *testing.T) {
		for _, hn := range hosts {
			h := r.Host(hn)
			require.Equal(t, name+"-"+hn, h.Netns)
			out := ipOut(t, "-n", h.Netns, "-4", "-o", "addr", "show")
			require.Contains(t, out, fmt.Sprintf("eth0    inet %s/24 ", h.IP))
			require.Contains(t, out, "lo    inet 127.0.0.1/8 ")
			require.True(t, r.Subnet().Contains(h.IP))
		}
		require.Contains(t, ipOut(t, "-o", "link", "show", "master", r.Bridge()), name+"-v2@")
	})

	t.Run("configs", func(t *testing.T) {
		for _, hn := range hosts {
			h := r.Host(hn)
			c, err := config.Load(h.ConfigPath)
			require.NoError(t, err)
			require.Equal(t, h.Config, c)
			require.Equal(t, hn, c.Host)
			require.Equal(t, []string{h.Address}, c.Addresses)
			require.Equal(t, h.StateDir, c.StateDir)
			require.Equal(t, filepath.Join(r.StateRoot(), hn), c.StateDir)
			require.Equal(t, control(hn), c.Monitor.Listen)
			require.Equal(t, netip.AddrPortFrom(h.IP, rack.MetricsPort).String(), c.Monitor.Metrics)
			require.Equal(t, r.FabricDir(), c.Proxy.FabricDir)
			require.Equal(t, 1<<20, c.Proxy.Window)
			require.Len(t, c.Peers, 2)
			for _, p := range c.Peers {
				require.NotEqual(t, hn, p.Host)
				pair := []string{hn, p.Host}
				if pair[1] < pair[0] {
					pair[0], pair[1] = pair[1], pair[0]
				}
				require.Equal(t, name+"-"+pair[0]+"-"+pair[1], p.Link)
				require.Equal(t, control(p.Host), p.Control)
				require.Equal(t, fallback(p.Host), p.Fallback)
				require.Equal(t, []string{r.Host(p.Host).Address}, p.Addresses)
			}
			if hn == "c" {
				require.Equal(t, acl, c.ACL)
			} else {
				require.Empty(t, c.ACL)
			}
			for _, d := range []string{"ntmon", "ntproxy"} {
				b, err := os.ReadFile(c.Path(d + ".started"))
				require.NoError(t, err)
				require.Equal(t, h.ConfigPath+"\n", string(b), "%s on %s got another config", d, hn)
			}
		}
	})

	t.Run("reach", func(t *testing.T) {
		out, err := dial("a", control("b"), control("c"), fallback("b"), fallback("c"))
		require.NoError(t, err, out)
		for _, want := range []string{control("b") + " b ntmon ", control("c") + " c ntmon ", fallback("b") + " b ntproxy ", fallback("c") + " c ntproxy "} {
			require.Contains(t, out, want)
		}
	})

	t.Run("enter", func(t *testing.T) {
		var ln net.Listener
		err := r.Enter("a", func() error {
			addrs, err := net.InterfaceAddrs()
			if err != nil {
				return err
			}
			var seen []string
			for _, a := range addrs {
				seen = append(seen, a.String())
			}
			if !strings.Contains(strings.Join(seen, " "), r.Host("a").IP.String()+"/24") {
				return fmt.Errorf("addresses in a's namespace: %v", seen)
			}
			line, err := hello(control("b"))
			if err != nil || !strings.HasPrefix(line, "b ntmon ") {
				return fmt.Errorf("hello from b: %q, %v", line, err)
			}
			ln, err = net.Listen("tcp", netip.AddrPortFrom(r.Host("a").IP, 0).String())
			return err
		})
		require.NoError(t, err)
		defer ln.Close()
		// The listener stays in a's namespace after Enter returned.
		go func() {
			c, err := ln.Accept()
			if err == nil {
				c.Write([]byte("a entered\n"))
				c.Close()
			}
		}()
		out, err := dial("b", ln.Addr().String())
		require.NoError(t, err, out)
		require.Contains(t, out, " a entered")

		require.ErrorContains(t, r.Enter("nosuch", func() error { return nil }), `no host "nosuch"`)
		require.PanicsWithValue(t, "boom", func() { r.Enter("a", func() error { panic("boom") }) })
	})

	t.Run("exec", func(t *testing.T) {
		out, err := r.Exec("b", "sh", "-c", "echo $"+rack.ProxyEnv).Output()
		require.NoError(t, err)
		require.Equal(t, r.Host("b").Config.Path(config.ProxySocket)+"\n", string(out))
		require.ErrorContains(t, r.Exec("nosuch", "true").Run(), `no host "nosuch"`)
	})

	t.Run("kill restart", func(t *testing.T) {
		old := r.Pid("b", "ntmon")
		require.NotZero(t, old)
		require.NoError(t, r.Kill("b", "ntmon"))
		require.Zero(t, r.Pid("b", "ntmon"))
		require.True(t, gone(old))
		require.NoError(t, r.Kill("b", "ntmon"), "killing a dead daemon")
		out, err := dial("a", control("b"))
		require.Error(t, err, out)
		require.Contains(t, out, "connection refused")
		require.Error(t, r.WaitSocket("b", config.MonitorSocket, 100*time.Millisecond))

		require.NoError(t, r.Restart("b", "ntmon"))
		require.NoError(t, r.WaitSocket("b", config.MonitorSocket, time.Second))
		now := r.Pid("b", "ntmon")
		require.NotZero(t, now)
		require.NotEqual(t, old, now)
		out, err = dial("a", control("b"))
		require.NoError(t, err, out)
		require.Contains(t, out, fmt.Sprintf("b ntmon %d", now))

		require.NoError(t, r.Restart("c", "ntproxy"), "restart of a running daemon")
		out, err = dial("a", fallback("c"))
		require.NoError(t, err, out)

		b, err := os.ReadFile(r.Host("b").LogPath("ntmon"))
		require.NoError(t, err)
		require.Equal(t, 2, strings.Count(string(b), "rack: start "), "log:\n%s", b)
		require.Contains(t, string(b), "exited: signal: killed")
		require.ErrorContains(t, r.Kill("b", "nosuch"), "no such daemon")
	})

	t.Run("close", func(t *testing.T) {
		stray := r.Exec("c", "sleep", "600")
		require.NoError(t, stray.Start())
		var pids []int
		for _, hn := range hosts {
			for _, d := range []string{"ntmon", "ntproxy"} {
				pid := r.Pid(hn, d)
				if pid == 0 {
					b, _ := os.ReadFile(r.Host(hn).LogPath(d))
					t.Fatalf("%s on %s not running; log:\n%s", d, hn, b)
				}
				pids = append(pids, pid)
			}
		}
		start := time.Now()
		require.NoError(t, r.Close())
		t.Logf("close took %v", time.Since(start))
		require.NoError(t, r.Close(), "second Close")

		var ee *exec.ExitError
		require.ErrorAs(t, stray.Wait(), &ee)
		require.Equal(t, syscall.SIGKILL, ee.Sys().(syscall.WaitStatus).Signal())
		for _, pid := range pids {
			require.NotZero(t, pid)
			require.True(t, gone(pid), "pid %d survived Close", pid)
		}
		requireNoTrace(t, name)
		for _, dir := range []string{r.FabricDir(), r.StateRoot()} {
			_, err := os.Stat(dir)
			require.ErrorIs(t, err, os.ErrNotExist)
		}
		b, _ := os.ReadFile(r.Host("a").LogPath("ntmon"))
		require.Empty(t, b, "state removed")
		require.ErrorContains(t, r.Restart("a", "ntmon"), "rack closed")
	})
}

// TestCleanupAfterCrash leaves a rack behind in a child process that exits
// without Close, and removes it with Cleanup.
func TestCleanupAfterCrash(t *testing.T) {
	if err := rack.Supported(); err != nil {
		t.Skipf("skip: %v", err)
	}
	exe, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), roleEnv+"=orphan")
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	require.NoError(t, err)
	var rep orphanReport
	require.NoError(t, json.Unmarshal(out, &rep), "%s", out)
	t.Cleanup(func() { rack.Cleanup(rep.Name) })

	require.Contains(t, ipOut(t, "netns", "list"), rep.Name+"-a")
	require.Contains(t, ipOut(t, "-o", "link", "show"), rep.Name+"-br")
	require.DirExists(t, rep.FabricDir)
	require.DirExists(t, rep.StateRoot)
	daemons, stray := rep.Pids[:len(rep.Pids)-1], rep.Pids[len(rep.Pids)-1]
	waitfor.True(t, "the daemons to end with the process that started them", func() bool {
		for _, pid := range daemons {
			if !gone(pid) {
				return false
			}
		}
		return true
	})
	require.False(t, gone(stray))

	require.NoError(t, rack.Cleanup(rep.Name))
	requireNoTrace(t, rep.Name)
	waitfor.True(t, "Cleanup to end the stray process", func() bool { return gone(stray) })
	require.NoDirExists(t, rep.FabricDir)
	require.NoDirExists(t, rep.StateRoot)
	require.NoError(t, rack.Cleanup(rep.Name), "nothing left to clean")
}

func TestStartUnsupportedOrBadSpec(t *testing.T) {
	_, err := rack.Start(t.Context(), rack.Spec{Hosts: []string{"a", "a"}})
	require.ErrorContains(t, err, `host "a" listed twice`)
	require.False(t, errors.Is(err, rack.ErrNotSupported))
	require.ErrorIs(t, &rack.NotSupportedError{Reason: "x"}, rack.ErrNotSupported)
	require.Error(t, rack.Cleanup("eth"+"0-"))
	require.Error(t, rack.Cleanup(""))
}
