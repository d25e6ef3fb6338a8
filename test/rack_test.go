//go:build integration

package test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/tools/rack"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/socklike"
)

var (
	binOnce sync.Once
	binDir  string
	binErr  error
)

// daemonTagsEnv holds build tags for the daemons: make test builds them
// with "verbs", as an RDMA host would run them.
const daemonTagsEnv = "NTSTACK_DAEMON_TAGS"

// daemons builds ntmon and ntproxy once per test binary.
func daemons(t *testing.T) string {
	t.Helper()
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "ntstack-bin-")
		if binErr != nil {
			return
		}
		out, err := exec.Command("go", "build", "-tags", os.Getenv(daemonTagsEnv), "-o", binDir+"/", "../cmd/ntmon", "../cmd/ntproxy", "../cmd/ntrack").CombinedOutput()
		if err != nil {
			binErr = fmt.Errorf("build daemons: %v\n%s", err, out)
		}
	})
	require.NoError(t, binErr)
	return binDir
}

// startRack starts an emulated rack running the real daemons and waits
// until every host's ntmon sees every peer up.
func startRack(t *testing.T, spec rack.Spec) *rack.Rack {
	t.Helper()
	if err := rack.Supported(); err != nil {
		t.Skipf("emulated rack: %v", err)
	}
	if spec.Daemons == nil {
		spec.BinDir = daemons(t)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := rack.Start(ctx, spec)
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			for _, h := range spec.Hosts {
				for _, d := range []string{"ntmon", "ntproxy"} {
					b, _ := os.ReadFile(r.Host(h).LogPath(d))
					t.Logf("%s %s log:\n%s", h, d, lastLines(string(b), 40))
				}
			}
		}
		require.NoError(t, r.Close())
	})
	for _, h := range spec.Hosts {
		waitPeersUp(t, r.Host(h))
	}
	return r
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

func status(h *rack.Host) (ctlapi.Status, error) {
	c := ctlapi.NewClient(h.Config.Path(config.MonitorSocket))
	defer c.Close()
	var st ctlapi.Status
	err := c.Call(context.Background(), ctlapi.PathStatus, nil, &st)
	return st, err
}

func waitPeersUp(t *testing.T, h *rack.Host) {
	t.Helper()
	require.Eventually(t, func() bool {
		st, err := status(h)
		if err != nil || len(st.Peers) != len(h.Config.Peers) {
			return false
		}
		for _, p := range st.Peers {
			if !p.Up {
				return false
			}
		}
		return true
	}, 20*time.Second, 20*time.Millisecond, "%s: peers not up", h.Name)
}

func snapshot(t *testing.T, h *rack.Host) ctlapi.Snapshot {
	t.Helper()
	c := ctlapi.NewClient(h.Config.Path(config.AdminSocket))
	defer c.Close()
	var s ctlapi.Snapshot
	require.NoError(t, c.Call(context.Background(), ctlapi.PathSnapshot, nil, &s))
	return s
}

// attachTo attaches the test process, as one application, to h's ntproxy.
func attachTo(t *testing.T, h *rack.Host) *socklike.Proxy {
	t.Helper()
	p, err := socklike.AttachProxy(h.Config.Path(config.ProxySocket), socklike.Config{})
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

// serveEcho echoes every connection accepted on ln until ln closes.
func serveEcho(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			io.Copy(c, c)
		}()
	}
}

// echoCheck writes n seeded bytes and checks that the echo is identical.
func echoCheck(c net.Conn, seed uint64, n int) error {
	msg := make([]byte, n)
	rng := rand.New(rand.NewPCG(seed, 7))
	for i := range msg {
		msg[i] = byte(rng.Uint32())
	}
	errc := make(chan error, 1)
	go func() { _, err := c.Write(msg); errc <- err }()
	got := make([]byte, n)
	if _, err := io.ReadFull(c, got); err != nil {
		return err
	}
	if err := <-errc; err != nil {
		return err
	}
	if !bytes.Equal(msg, got) {
		return errors.New("echoed bytes differ")
	}
	return nil
}

// TestRack3 runs three hosts, every pair joined by an emulated NTB link,
// each with ntmon and ntproxy: every pair exchanges verified data through
// the daemons, two applications share a link at once, an ACL denial is a
// clear error and `ntmon status` shows every connection with its path.
func TestRack3(t *testing.T) {
	uid := 0
	r := startRack(t, rack.Spec{
		Hosts: []string{"a", "b", "c"},
		ACL: map[string][]config.Rule{
			"a": {{Action: "deny", Direction: "out", UID: &uid, Host: "c", Port: 6379}},
			"b": {{Action: "deny", Direction: "in", Host: "c", Port: 7000}},
		},
	})
	hosts := []string{"a", "b", "c"}
	apps := map[string]*socklike.Proxy{}
	for _, h := range hosts {
		apps[h] = attachTo(t, r.Host(h))
		ln, err := (&socklike.ListenConfig{Proxy: apps[h]}).Listen(context.Background(), "tcp", ":7000")
		require.NoError(t, err)
		t.Cleanup(func() { ln.Close() })
		go serveEcho(ln)
	}

	// Every ordered pair, and each host to itself, concurrently.
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i, from := range hosts {
		for j, to := range hosts {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := (&socklike.Dialer{Proxy: apps[from]}).Dial("tcp", r.Host(to).Address+":7000")
				if err != nil {
					if from == "c" && to == "b" {
						return // b denies c, checked below
					}
					errs <- fmt.Errorf("%s -> %s: %w", from, to, err)
					return
				}
				defer c.Close()
				want := map[bool]string{true: ctlapi.PathSHM, false: ctlapi.PathNTB}[from == to]
				if got := c.(*socklike.Conn).Route(); got.Path != want {
					errs <- fmt.Errorf("%s -> %s: path %q (%s), want %q", from, to, got.Path, got.Reason, want)
				}
				for k, n := range []int{1, 4096, 1 << 20} {
					if err := echoCheck(c, uint64(100*i+10*j+k), n); err != nil {
						errs <- fmt.Errorf("%s -> %s, %d bytes: %w", from, to, n, err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	// Two applications on a share the link to b, at the same time.
	second := attachTo(t, r.Host("a"))
	var conns []net.Conn
	for _, p := range []*socklike.Proxy{apps["a"], second} {
		c, err := (&socklike.Dialer{Proxy: p}).Dial("tcp", "b:7000")
		require.NoError(t, err)
		conns = append(conns, c)
	}
	var share sync.WaitGroup
	for i, c := range conns {
		share.Add(1)
		go func() {
			defer share.Done()
			for k := range 20 {
				if err := echoCheck(c, uint64(1000*i+k), 64<<10); err != nil {
					t.Errorf("shared link, app %d: %v", i, err)
					return
				}
			}
		}()
	}
	share.Wait()

	// ntmon status lists both connections and their path.
	out, err := exec.Command(filepath.Join(binDir, "ntmon"), "status", "-config", r.Host("a").ConfigPath).CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Logf("ntmon status on a:\n%s", out)
	require.Equal(t, 2, strings.Count(string(out), "b:7000"), "both connections to b:7000 listed")
	require.Contains(t, string(out), "ntb")
	require.Contains(t, string(out), r.Host("b").Config.Peers[0].Link[:3], "links are listed")
	// Prometheus metrics on a's monitor.metrics address (inside its
	// namespace) carry the connections with their path.
	metrics := scrape(t, r, "a")
	require.Contains(t, metrics, `ntstack_peer_up{peer="b"} 1`)
	require.Regexp(t, `ntstack_conn_tx_bytes_total\{[^}]*path="ntb"[^}]*\} [1-9]`, metrics)
	require.Regexp(t, `ntstack_conn_drops_total\{[^}]*\} 0`, metrics)
	for _, c := range conns {
		c.Close()
	}

	// ACL: a's outbound rule for root to c:6379, b's inbound rule for c.
	ln, err := (&socklike.ListenConfig{Proxy: apps["c"]}).Listen(context.Background(), "tcp", ":6379")
	require.NoError(t, err)
	defer ln.Close()
	_, err = (&socklike.Dialer{Proxy: apps["a"]}).Dial("tcp", "c:6379")
	require.ErrorIs(t, err, socklike.ErrDenied)
	require.ErrorContains(t, err, "acl rule 0")
	t.Logf("denied as expected: %v", err)
	_, err = (&socklike.Dialer{Proxy: apps["c"]}).Dial("tcp", "b:7000")
	require.ErrorIs(t, err, socklike.ErrDenied)
	t.Logf("denied as expected: %v", err)
}

// TestRackOffRack: host c has no NTB link, so connections to it leave over
// TCP between the proxies; they say so and why, carry verified data, and
// pass the standard library's conformance suite like the NTB path.
func TestRackOffRack(t *testing.T) {
	r := startRack(t, rack.Spec{Hosts: []string{"a", "b", "c"}, OffRack: []string{"c"}})
	srv := attachTo(t, r.Host("c"))
	ln, err := (&socklike.ListenConfig{Proxy: srv}).Listen(context.Background(), "tcp", ":7000")
	require.NoError(t, err)
	defer ln.Close()
	go serveEcho(ln)
	cli := attachTo(t, r.Host("a"))
	c, err := (&socklike.Dialer{Proxy: cli}).Dial("tcp", r.Host("c").Address+":7000")
	require.NoError(t, err)
	route := c.(*socklike.Conn).Route()
	t.Logf("a -> c: path %s: %s", route.Path, route.Reason)
	require.Equal(t, ctlapi.PathTCP, route.Path)
	require.Contains(t, route.Reason, "no NTB link to c; no RDMA on this host: verbs provider: ")
	for k, n := range []int{1, 4096, 1 << 20, 8 << 20} {
		require.NoError(t, echoCheck(c, uint64(k), n))
	}
	require.NoError(t, c.Close())

	// Restricted to the NTB and RDMA, c is out of reach, and the error says why.
	d := &socklike.Dialer{Proxy: cli, Transports: []string{"ntb", "rdma"}}
	_, err = d.Dial("tcp", "c:7000")
	require.ErrorIs(t, err, socklike.ErrNoPath)
	require.ErrorContains(t, err, "no NTB link to c; no RDMA on this host: verbs provider: ")
	require.ErrorContains(t, err, "; tcp not asked for by the connection")
	t.Logf("restricted dial: %v", err)

	conf, err := (&socklike.ListenConfig{Proxy: srv}).Listen(context.Background(), "tcp", ":7001")
	require.NoError(t, err)
	defer conf.Close()
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
		accepted := make(chan net.Conn, 1)
		go func() {
			if c, err := conf.Accept(); err == nil {
				accepted <- c
			}
		}()
		c1, err := (&socklike.Dialer{Proxy: cli}).Dial("tcp", "c:7001")
		if err != nil {
			return nil, nil, nil, err
		}
		select {
		case c2 := <-accepted:
			return c1, c2, func() { c1.Close(); c2.Close() }, nil
		case <-time.After(10 * time.Second):
			c1.Close()
			return nil, nil, nil, errors.New("accept timed out")
		}
	})
}

// scrape fetches host's Prometheus metrics from inside its namespace.
func scrape(t *testing.T, r *rack.Rack, host string) string {
	t.Helper()
	h := r.Host(host)
	var c net.Conn
	require.NoError(t, r.Enter(host, func() (err error) {
		c, err = net.Dial("tcp", h.Config.Monitor.Metrics) // the socket is made in the namespace
		return err
	}))
	defer c.Close()
	_, err := fmt.Fprintf(c, "GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n", h.Config.Monitor.Metrics)
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return string(b)
}
