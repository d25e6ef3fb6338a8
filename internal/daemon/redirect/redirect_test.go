//go:build linux

package redirect

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
)

// The test binary re-executed with helperEnv set is a client started
// inside the test cgroup: it dials helperAddrEnv and prints what it got.
const (
	helperEnv     = "NTREDIRECT_TEST_HELPER" // "tcp" or "udp"
	helperAddrEnv = "NTREDIRECT_TEST_ADDR"
)

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "tcp":
		os.Exit(helperTCP(os.Getenv(helperAddrEnv)))
	case "udp":
		os.Exit(helperUDP(os.Getenv(helperAddrEnv)))
	default:
		fmt.Fprintf(os.Stderr, "unknown %s=%q\n", helperEnv, os.Getenv(helperEnv))
		os.Exit(2)
	}
}

// helperTCP prints the byte the server at addr writes first.
func helperTCP(addr string) int {
	id, err := readID(addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Print(id)
	return 0
}

// helperUDP connects a UDP socket to addr and sends "u".
func helperUDP(addr string) int {
	c, err := net.Dial("udp", addr)
	if err == nil {
		_, err = c.Write([]byte("u"))
		c.Close()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

func readID(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 1)
	if _, err := io.ReadFull(c, b); err != nil {
		return "", fmt.Errorf("read from %s: %w", addr, err)
	}
	return string(b), nil
}

// testCgroup is a fresh child cgroup of the cgroup2 mount, removed when the
// test ends, and a descriptor of it for starting processes inside.
type testCgroup struct {
	path string
	dir  *os.File
}

func newTestCgroup(t *testing.T) *testCgroup {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("not root: creating cgroups and loading BPF programs need root")
	}
	mount := cgroup2Mount(t)
	path, err := os.MkdirTemp(mount, "ntredirect-test-")
	if err != nil {
		t.Fatalf("create cgroup: %v", err)
	}
	dir, err := os.Open(path)
	if err != nil {
		os.Remove(path)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		dir.Close()
		// A reaped child may still be leaving the cgroup for a moment.
		var err error
		waitfor.Until(func() bool {
			err = os.Remove(path)
			return err == nil || !errors.Is(err, syscall.EBUSY)
		})
		if err != nil {
			t.Errorf("remove cgroup: %v", err)
		}
	})
	return &testCgroup{path: path, dir: dir}
}

// cgroup2Mount returns where cgroup2 is mounted, from /proc/mounts.
func cgroup2Mount(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("/proc/mounts")
	if err != nil {
		t.Skipf("no cgroup2: cannot read /proc/mounts: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[2] == "cgroup2" {
			return f[1]
		}
	}
	t.Skip("no cgroup2 file system in /proc/mounts")
	return ""
}

// command returns cmd set to start inside the cgroup.
func (cg *testCgroup) command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.dir.Fd())}
	return cmd
}

// dial runs the helper inside the cgroup with mode "tcp" or "udp" against
// addr and returns what it printed.
func (cg *testCgroup) dial(t *testing.T, mode string, addr netip.AddrPort) string {
	t.Helper()
	cmd := cg.command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, helperAddrEnv+"="+addr.String(),
		"GORACE=atexit_sleep_ms=0") // a -race helper would otherwise linger 1s at exit
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper in cgroup dialling %s %v: %v: %s", mode, addr, err, stderr.String())
	}
	return string(out)
}

// attach attaches a Redirect to cg, skipping the test if the kernel cannot.
func attach(t *testing.T, cg *testCgroup) *Redirect {
	t.Helper()
	r, err := Attach(cg.path)
	if errors.Is(err, ErrNotSupported) {
		t.Skipf("cgroup connect redirection unavailable here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil {
			t.Error(err)
		}
	})
	return r
}

// idServer listens on addr and writes id to every connection it accepts.
func idServer(t *testing.T, addr, id string) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(id))
			c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

func wantCount(t *testing.T, r *Redirect, from netip.AddrPort, want uint64) {
	t.Helper()
	got, err := r.Count(from)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Errorf("count of rule %v = %d, want %d", from, got, want)
	}
}

// testRedirectTCP proves a rule A → B sends the cgroup's connects to A to
// B, counts them, leaves processes outside the cgroup alone and stops
// once the Redirect is closed.
func testRedirectTCP(t *testing.T, loopback string) {
	cg := newTestCgroup(t)
	r := attach(t, cg)
	a := idServer(t, net.JoinHostPort(loopback, "0"), "A")
	b := idServer(t, net.JoinHostPort(loopback, "0"), "B")

	if got := cg.dial(t, "tcp", a); got != "A" {
		t.Fatalf("without a rule, helper in cgroup dialling A reached %q", got)
	}
	if err := r.Set(a, b); err != nil {
		t.Fatal(err)
	}
	wantCount(t, r, a, 0)
	if got := cg.dial(t, "tcp", a); got != "B" {
		t.Errorf("with rule A→B, helper in cgroup dialling A reached %q, want B", got)
	}
	wantCount(t, r, a, 1)
	if got, err := readID(a.String()); err != nil || got != "A" {
		t.Errorf("test process outside the cgroup dialling A reached %q (%v), want A", got, err)
	}
	wantCount(t, r, a, 1)
	counts, err := r.Counts()
	if err != nil {
		t.Fatal(err)
	}
	if len(counts) != 1 || counts[a] != 1 {
		t.Errorf("Counts() = %v, want map[%v:1]", counts, a)
	}

	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if got := cg.dial(t, "tcp", a); got != "A" {
		t.Errorf("after Close, helper in cgroup dialling A reached %q, want A", got)
	}
	if _, err := r.Count(a); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Count after Close: %v, want os.ErrClosed", err)
	}
}

func TestRedirectTCP4(t *testing.T) { testRedirectTCP(t, "127.0.0.1") }

func TestRedirectTCP6(t *testing.T) {
	requireIPv6Loopback(t)
	testRedirectTCP(t, "::1")
}

func requireIPv6Loopback(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback ::1 on this machine: %v", err)
	}
	ln.Close()
}

func TestDelete(t *testing.T) {
	cg := newTestCgroup(t)
	r := attach(t, cg)
	a := idServer(t, "127.0.0.1:0", "A")
	b := idServer(t, "127.0.0.1:0", "B")
	if err := r.Set(a, b); err != nil {
		t.Fatal(err)
	}
	if err := r.Delete(a); err != nil {
		t.Fatal(err)
	}
	if got := cg.dial(t, "tcp", a); got != "A" {
		t.Errorf("after Delete, helper in cgroup dialling A reached %q, want A", got)
	}
	if err := r.Delete(a); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("second Delete: %v, want os.ErrNotExist", err)
	}
	if _, err := r.Count(a); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Count of a deleted rule: %v, want os.ErrNotExist", err)
	}
	if err := r.Set(a, netip.MustParseAddrPort("[::1]:1")); err == nil {
		t.Error("Set of an IPv4 → IPv6 rule succeeded")
	}
}

// TestUDPUntouched proves a rule matching a UDP socket's connect does not
// redirect it: the programs check for SOCK_STREAM.
func TestUDPUntouched(t *testing.T) {
	cg := newTestCgroup(t)
	r := attach(t, cg)
	listen := func() (*net.UDPConn, netip.AddrPort) {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, c.LocalAddr().(*net.UDPAddr).AddrPort()
	}
	ua, a := listen()
	ub, b := listen()
	if err := r.Set(a, b); err != nil {
		t.Fatal(err)
	}
	cg.dial(t, "udp", a)

	buf := make([]byte, 16)
	ua.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := ua.Read(buf); err != nil || string(buf[:n]) != "u" {
		t.Errorf("A received %q, %v; want the helper's datagram", buf[:n], err)
	}
	ub.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if n, err := ub.Read(buf); err == nil {
		t.Errorf("B received %q; the UDP connect was redirected", buf[:n])
	}
	wantCount(t, r, a, 0)
}

// TestCurl proves an unmodified binary is redirected: curl in the cgroup
// fetching from A gets B's page, over an AF_INET socket and over a
// dual-stack AF_INET6 socket dialling the IPv4-mapped address (connect6
// matching the IPv4 rule).
func TestCurl(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl not installed")
	}
	cg := newTestCgroup(t)
	r := attach(t, cg)
	a := httpServer(t, "A")
	b := httpServer(t, "B")
	if err := r.Set(a, b); err != nil {
		t.Fatal(err)
	}
	get := func(t *testing.T, url string) string {
		cmd := cg.command(curl, "-sS", "-g", "--noproxy", "*", "--max-time", "5", url)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("curl %s: %v: %s", url, err, out)
		}
		return string(out)
	}
	t.Run("ipv4", func(t *testing.T) {
		if got := get(t, fmt.Sprintf("http://%v/", a)); got != "B" {
			t.Errorf("curl in cgroup fetching from A got %q, want B", got)
		}
		wantCount(t, r, a, 1)
	})
	t.Run("ipv4-mapped", func(t *testing.T) {
		requireIPv6Loopback(t)
		if got := get(t, fmt.Sprintf("http://[::ffff:%v]:%d/", a.Addr(), a.Port())); got != "B" {
			t.Errorf("curl in cgroup fetching from ::ffff:A got %q, want B", got)
		}
		wantCount(t, r, a, 2)
	})
}

// httpServer serves body on 127.0.0.1.
func httpServer(t *testing.T, body string) netip.AddrPort {
	t.Helper()
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, body)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).AddrPort()
}

func TestAttachNotCgroup2(t *testing.T) {
	if _, err := Attach(t.TempDir()); !errors.Is(err, ErrNotSupported) {
		t.Errorf("Attach(a plain directory): %v, want ErrNotSupported", err)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	if _, err := Attach(missing); !errors.Is(err, os.ErrNotExist) || errors.Is(err, ErrNotSupported) {
		t.Errorf("Attach(%s): %v, want os.ErrNotExist only", missing, err)
	}
}

// TestCloseNoLeak proves Attach and Close leave no descriptor or goroutine
// behind, and that Close is idempotent.
func TestCloseNoLeak(t *testing.T) {
	cg := newTestCgroup(t)
	// Warm up: cilium/ebpf probes kernel features once per process.
	r := attach(t, cg)
	r.Close()

	fds, goroutines := countFDs(t), runtime.NumGoroutine()
	r, err := Attach(cg.path)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Set(netip.MustParseAddrPort("10.77.0.2:6379"), netip.MustParseAddrPort("127.0.0.1:16379")); err != nil {
		t.Fatal(err)
	}
	if n := attachedCount(t, cg); n != 2 {
		t.Errorf("%d programs attached to the cgroup, want 2 (connect4, connect6)", n)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := r.Set(netip.MustParseAddrPort("10.77.0.2:6379"), netip.MustParseAddrPort("127.0.0.1:16379")); !errors.Is(err, os.ErrClosed) {
		t.Errorf("Set after Close: %v, want os.ErrClosed", err)
	}
	if got := countFDs(t); got != fds {
		t.Errorf("%d descriptors open before Attach, %d after Close", fds, got)
	}
	// A leak shows as more goroutines; fewer is one of an earlier test's
	// (or the runtime's) ending meanwhile, as seen in CI.
	waitfor.Until(func() bool { return runtime.NumGoroutine() <= goroutines })
	if got := runtime.NumGoroutine(); got > goroutines {
		t.Errorf("%d goroutines before Attach, %d after Close", goroutines, got)
	}
	if n := attachedCount(t, cg); n != 0 {
		t.Errorf("%d programs still attached to the cgroup after Close", n)
	}
}

func countFDs(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// attachedCount returns how many programs are attached to cg at the
// connect4 and connect6 hooks (BPF_PROG_QUERY).
func attachedCount(t *testing.T, cg *testCgroup) int {
	t.Helper()
	n := 0
	for _, at := range []ebpf.AttachType{ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupInet6Connect} {
		res, err := link.QueryPrograms(link.QueryOptions{Target: int(cg.dir.Fd()), Attach: at})
		if err != nil {
			t.Fatalf("query %v programs: %v", at, err)
		}
		n += len(res.Programs)
	}
	return n
}
