//go:build verbs && cgo && linux

package rdmaguest

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/daemon/doctor"
	"github.com/ntstack/ntstack/internal/daemon/monitor"
	"github.com/ntstack/ntstack/internal/daemon/proxy"
	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/internal/wire/hostauth"
	"github.com/ntstack/ntstack/socklike"
)

// The server application's ports on host a: the echo, and the client's
// goodbye (the proxies may still hold echoed bytes when the echo
// connection's EOF reaches a).
const (
	rackPort     = 80
	rackDonePort = 81
)

// TestRDMARack: the two guests as off-rack hosts of one rack, a
// (10.11.0.1) and b (10.11.0.2), with no NTB link between them, each
// running ntmon and ntproxy (in this process, as the daemons would) with
// the verbs provider on rxe0. The ntmons exchange their RDMA listeners;
// an application on b dials one on a through its ntproxy, the route
// takes RDMA and says why, and msgs messages are echoed and checked byte
// for byte across ntproxy → RDMA → ntproxy.
func TestRDMARack(t *testing.T) {
	p := params(t)
	self, _, _ := strings.Cut(p[ParamIP], "/")
	host, peer, peerIP := "a", "b", strings.TrimSuffix(self, "1")+"2"
	if strings.HasSuffix(self, ".2") {
		host, peer, peerIP = "b", "a", strings.TrimSuffix(self, "2")+"1"
	}
	stateDir := filepath.Join(os.TempDir(), "ntstack-"+host)
	keyFile, peerPin := guestKeys(t, stateDir, host, peer)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`host = %q
addresses = ["10.77.0.%d"]
state_dir = %q
[auth]
key = %q
[monitor]
listen = "%s:7470"
heartbeat = "200ms"
peer_timeout = "5s"
[proxy]
fallback = "%s:7480"
[proxy.rdma]
listen = "%s:7490"
device = "rxe0"
[[peers]]
host = %q
control = "%s:7470"
addresses = ["10.77.0.%d"]
fallback = "%s:7480"
key = %q
`, host, host[0], stateDir, keyFile, self, self, self, peer, peerIP, peer[0], peerIP, peerPin)))
	if err != nil {
		t.Fatal(err)
	}
	// ntmon doctor's RDMA check, against a real device.
	for _, r := range doctor.Run(context.Background(), doctor.Options{Config: cfg}) {
		if r.Name == "rdma" {
			metric("doctor_rdma", r.Status, "detail", fmt.Sprintf("%q", r.Detail))
			if r.Status != doctor.Pass {
				t.Errorf("doctor: rdma %s: %s (fix: %s)", r.Status, r.Detail, r.Fix)
			}
		}
	}
	m, s := startDaemons(t, cfg)
	app, err := socklike.AttachProxy(cfg.Path(config.ProxySocket), socklike.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()

	if host == "a" {
		rackServe(t, app)
		return
	}
	// b: wait until a's HELLO has told this ntmon where a takes RDMA. a is
	// another guest, still booting under TCG: its status, looked at every
	// 100 ms, is all there is to wait on, within a bound for its boot.
	deadline := time.Now().Add(90 * time.Second)
	for {
		st := m.Status(context.Background())
		if len(st.Peers) == 1 && st.Peers[0].Up && !strings.HasPrefix(st.Peers[0].RDMA, "none") {
			metric("role", "client", "peer", peer, "peer_rdma", st.Peers[0].RDMA, "own_rdma", st.RDMA)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("peer %s not up with RDMA: %+v", peer, st.Peers)
		}
		time.Sleep(100 * time.Millisecond)
	}
	var c net.Conn
	for {
		c, err = (&socklike.Dialer{Proxy: app}).Dial("tcp", fmt.Sprintf("%s:%d", peer, rackPort))
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // a's application, in the other guest, may not listen yet: only a dial tells
	}
	if err != nil {
		t.Fatalf("dial %s:%d: %v", peer, rackPort, err)
	}
	defer c.Close()
	route := c.(*socklike.Conn).Route()
	metric("rack_route", route.Path, "reason", fmt.Sprintf("%q", route.Reason))
	if route.Path != ctlapi.PathRDMA {
		t.Fatalf("route %s (%s), want rdma", route.Path, route.Reason)
	}
	// ntproxy registers the connection just after its answer to Dial.
	var snap ctlapi.Snapshot
	if !waitfor.Until(func() bool {
		snap = s.Snapshot()
		return len(snap.Conns) == 1 && snap.Conns[0].Path == ctlapi.PathRDMA
	}) {
		t.Fatalf("ntproxy's connections: %+v, want one over rdma", snap.Conns)
	}
	st := m.Status(context.Background())
	var b strings.Builder
	monitor.WriteStatus(&b, &st)
	t.Logf("ntmon status on b:\n%s", b.String())
	pipelined(t, c, rackMsgs, c.(*socklike.Conn).CloseWrite)
	metric("rack_msgs_over_rdma", rackMsgs)
	// Tell a that every echo has arrived: its daemons may stop.
	done, err := (&socklike.Dialer{Proxy: app}).Dial("tcp", fmt.Sprintf("%s:%d", peer, rackDonePort))
	if err != nil {
		t.Fatalf("goodbye to %s: %v", peer, err)
	}
	done.Close()
}

// rackMsgs are the messages the rack test echoes (under TCG a few
// hundred take seconds).
const rackMsgs = 500

// rackServe is a's application: it echoes one connection to rackPort
// until its EOF, closes its direction and waits for the client's goodbye.
func rackServe(t *testing.T, app *socklike.Proxy) {
	ln, err := (&socklike.ListenConfig{Proxy: app}).Listen(context.Background(), "tcp", fmt.Sprintf(":%d", rackPort))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	bye, err := (&socklike.ListenConfig{Proxy: app}).Listen(context.Background(), "tcp", fmt.Sprintf(":%d", rackDonePort))
	if err != nil {
		t.Fatal(err)
	}
	defer bye.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	route := c.(*socklike.Conn).Route()
	n, err := io.Copy(c, c)
	if err != nil {
		t.Fatalf("echo after %d bytes: %v", n, err)
	}
	metric("role", "rack_server", "path", route.Path, "echoed_bytes", n)
	if err := c.(*socklike.Conn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the echo: %v, want io.EOF", err)
	}
	done, err := bye.Accept()
	if err != nil {
		t.Fatalf("the client's goodbye: %v", err)
	}
	done.Close()
	if route.Path != ctlapi.PathRDMA {
		t.Fatalf("accepted over %s (%s), want rdma", route.Path, route.Reason)
	}
}

// guestKeys writes host's key into dir and returns its file and peer's
// pin. The two guests share nothing but the kernel command line, so each
// host's key comes from a seed both derive from the host's name: a test
// fixture, never how a deployment makes keys (ntmon keygen).
func guestKeys(t *testing.T, dir, host, peer string) (keyFile, peerPin string) {
	key := func(h string) ([]byte, string) {
		seed := sha256.Sum256([]byte("ntstack rdmaguest test key of " + h))
		b, pin, err := hostauth.NewKey(h, ed25519.NewKeyFromSeed(seed[:]))
		if err != nil {
			t.Fatal(err)
		}
		return b, pin
	}
	b, _ := key(host)
	_, peerPin = key(peer)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	keyFile = filepath.Join(dir, "host.key")
	if err := os.WriteFile(keyFile, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return keyFile, peerPin
}

// startDaemons runs cfg's ntmon and ntproxy, with the verbs provider,
// until the test ends.
func startDaemons(t *testing.T, cfg *config.Config) (*monitor.Monitor, *proxy.Server) {
	auth, err := cfg.HostAuth()
	if err != nil {
		t.Fatal(err)
	}
	v, err := proxy.OpenRDMA(cfg.Proxy.RDMA, auth)
	if err != nil {
		t.Fatalf("RDMA in the guest: %v", err)
	}
	t.Cleanup(func() { v.Close() })
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	m, err := monitor.New(cfg, monitor.Options{Logger: log, RDMA: monitor.RDMA{Addr: cfg.Proxy.RDMA.Listen}})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	s, err := proxy.New(cfg, proxy.Options{Control: proxy.NewMonitorControl(m.SocketPath()), RDMA: v, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.ListenAndServe() }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil {
			t.Errorf("ntproxy: %v", err)
		}
	})
	// Wait for a connection, not for the file: bind creates it before
	// listen, and a dial in between is refused (seen once in CI).
	waitfor.True(t, "ntproxy's socket to take a connection", func() bool {
		c, err := net.Dial("unix", cfg.Path(config.ProxySocket))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return m, s
}
