package monitor

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/internal/wire/hostauth"
	"github.com/ntstack/ntstack/internal/wire/hostauth/hostauthtest"
)

// Test timing: heartbeats fast enough that a test waits little, a peer
// timeout long enough that a loaded -race run on two vCPUs never misses
// ten heartbeats in a row.
const (
	testHeartbeat   = 50 * time.Millisecond
	testPeerTimeout = 750 * time.Millisecond
	// waitFor bounds the deadlines of test connections; it is a hang
	// guard, not a performance assertion.
	waitFor = 15 * time.Second
)

// testRack is the rack CA every test host's key is signed by: a config
// from baseConfig trusts its peers through it, without pins.
var testRack *hostauthtest.Rack

func TestMain(m *testing.M) {
	var err error
	if testRack, err = hostauthtest.NewRack(""); err != nil {
		fmt.Fprintln(os.Stderr, "rack CA:", err)
		os.Exit(1)
	}
	code := m.Run()
	testRack.Remove()
	os.Exit(code)
}

// stateDir makes a short state directory: Unix socket paths are limited
// to 108 bytes, and t.TempDir's names can be long.
func stateDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "ntmon")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// baseConfig is a host config built in code, with test timings and an
// ephemeral metrics port.
func baseConfig(t *testing.T, host string) *config.Config {
	t.Helper()
	return &config.Config{
		Host:      host,
		Addresses: []string{"10.77.0." + host},
		StateDir:  stateDir(t),
		Monitor: config.Monitor{
			Metrics:     "127.0.0.1:0",
			Heartbeat:   config.Duration{Duration: testHeartbeat},
			PeerTimeout: config.Duration{Duration: testPeerTimeout},
		},
		Proxy: config.Proxy{Window: 1 << 20, Partitions: 2, AppWindow: 1 << 20, MaxAppsPerUID: 8},
		Auth:  config.Auth{Key: testRack.Key(t, host), CA: testRack.CAFile},
	}
}

// listen binds an ephemeral loopback port for a Monitor's peers.
func listen(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return ln
}

// testLogger sends a Monitor's log to the test log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// node is one running Monitor with a client on its API socket.
type node struct {
	m      *Monitor
	cfg    *config.Config
	client *ctlapi.Client
}

// start runs a Monitor on cfg with ln as its peer listener, closed at
// the end of the test.
func start(t *testing.T, cfg *config.Config, ln net.Listener) *node {
	return startWith(t, cfg, ln, Options{})
}

// startWith is start with o's RDMA capability.
func startWith(t *testing.T, cfg *config.Config, ln net.Listener, o Options) *node {
	t.Helper()
	m, err := New(cfg, Options{Logger: testLogger(t), Version: "test", PeerListener: ln, BackoffMin: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond, RDMA: o.RDMA})
	require.NoError(t, err)
	require.NoError(t, m.Start())
	n := &node{m: m, cfg: cfg, client: ctlapi.NewClient(m.SocketPath())}
	t.Cleanup(func() {
		n.client.Close()
		require.NoError(t, m.Close())
	})
	return n
}

func (n *node) status(t *testing.T) ctlapi.Status {
	t.Helper()
	var st ctlapi.Status
	require.NoError(t, n.client.Call(context.Background(), ctlapi.PathStatus, nil, &st))
	return st
}

func (n *node) peer(t *testing.T, host string) ctlapi.PeerStatus {
	t.Helper()
	for _, p := range n.status(t).Peers {
		if p.Host == host {
			return p
		}
	}
	t.Fatalf("%s has no peer %s", n.cfg.Host, host)
	return ctlapi.PeerStatus{}
}

// waitPeer polls n's status until peer host is up (or down).
func (n *node) waitPeer(t *testing.T, host string, up bool) ctlapi.PeerStatus {
	t.Helper()
	var p ctlapi.PeerStatus
	if !waitfor.Until(func() bool {
		p = n.peer(t, host)
		return p.Up == up
	}) {
		t.Fatalf("%s: peer %s never became up=%v (last: %+v)", n.cfg.Host, host, up, p)
	}
	return p
}

func (n *node) resolve(t *testing.T, uid int, target string, port int) (ctlapi.Route, error) {
	t.Helper()
	var rt ctlapi.Route
	err := n.client.Call(context.Background(), ctlapi.PathResolve, ctlapi.ResolveRequest{UID: uid, Target: target, Port: port}, &rt)
	return rt, err
}

// dialer reports which host dialed n's live session with peer host ("" if
// none is up).
func (n *node) dialer(host string) string {
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	if s := n.m.peers[host].sess; s != nil {
		return s.dialer
	}
	return ""
}

// fakeProxy serves a canned snapshot on cfg's ntproxy admin socket.
func fakeProxy(t *testing.T, cfg *config.Config, snap ctlapi.Snapshot) {
	t.Helper()
	require.NoError(t, os.MkdirAll(cfg.StateDir, 0o755))
	ln, err := net.Listen("unix", cfg.Path(config.AdminSocket))
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+ctlapi.PathSnapshot, func(w http.ResponseWriter, _ *http.Request) {
		ctlapi.Reply(w, snap, nil)
	})
	srv := &http.Server{Handler: mux}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
}

// cannedSnapshot is ntproxy's state with one NTB connection, one
// same-host connection and one fallback connection.
func cannedSnapshot(host string) ctlapi.Snapshot {
	return ctlapi.Snapshot{
		Host: host,
		Links: []ctlapi.LinkStat{{Name: "rack-a-b", Peer: "b", State: "up", Window: 1 << 20, Partitions: []ctlapi.PartitionStat{
			{Index: 0, Conns: 1, BytesTX: 1234, BytesRX: 5678, MsgsTX: 10, MsgsRX: 20},
			{Index: 1},
		}}},
		Apps: []ctlapi.AppStat{{ID: 1, PID: 4242, UID: 1000, Name: "redis-cli", Conns: 2, Memory: 1 << 20},
			{ID: 2, PID: 4343, UID: 0, Name: "nginx", Conns: 1, Memory: 1 << 20}},
		Listeners: []ctlapi.ListenStat{{App: 2, Port: 80, Backlog: 128}},
		Conns: []ctlapi.ConnStat{
			{ID: 1, App: 1, Local: "a:49152", Remote: "b:6379", Dir: "out", Path: "ntb", Mode: "pool", Reason: "rack peer b over NTB link rack-a-b; shared pool",
				Link: "rack-a-b", Partition: 0, BytesTX: 1234, BytesRX: 5678, MsgsTX: 10, MsgsRX: 20, QueueDepth: 64},
			{ID: 2, App: 1, Local: "a:49153", Remote: "a:80", Dir: "out", Path: "shm", Mode: "proxy", Reason: "same host: shared memory, never the NTB",
				BytesTX: 11, BytesRX: 22},
			{ID: 3, App: 2, Local: "a:80", Remote: "c:50000", Dir: "in", Path: "tcp", Mode: "proxy", Reason: "no NTB link to c: TCP fallback 127.0.0.1:7481",
				BytesTX: 33, BytesRX: 44},
		},
	}
}

// rawPeer dials addr as a hand-written peer would, over plain TCP.
func rawPeer(t *testing.T, addr net.Addr) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr.String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(waitFor)))
	return c
}

// tlsPeer dials addr as a hand-written peer holding keyFile would: the
// TLS handshake done, ready for its HELLO. It does not check the server.
func tlsPeer(t *testing.T, addr net.Addr, keyFile string) net.Conn {
	t.Helper()
	c := rawPeer(t, addr)
	cert, err := hostauth.LoadKey(keyFile)
	require.NoError(t, err)
	tc := tls.Client(c, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true})
	require.NoError(t, tc.Handshake())
	return tc
}

// refusedTLS checks that the daemon at addr refuses the TLS handshake of
// a peer holding keyFile: the handshake fails, or the first read after it
// does (a TLS 1.3 server checks the client's certificate after the
// client's side of the handshake is done), with no frame read.
func refusedTLS(t *testing.T, addr net.Addr, keyFile string) {
	t.Helper()
	c := rawPeer(t, addr)
	cert, err := hostauth.LoadKey(keyFile)
	require.NoError(t, err)
	tc := tls.Client(c, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true})
	if err := tc.Handshake(); err != nil {
		return
	}
	_ = WriteFrame(tc, FrameHello, Hello{Magic: Magic, Version: ProtocolVersion, Host: "b"})
	_, err = ReadFrame(tc)
	require.Error(t, err)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "connection not closed by the daemon: %v", err)
}

// closedByDaemon reads c until the daemon closes it (EOF or reset).
func closedByDaemon(t *testing.T, c net.Conn) {
	t.Helper()
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "connection not closed by the daemon: %v", err)
}

// readUntilClosed reads frames until the connection ends and returns
// them; the end must be EOF (or a reset: the daemon closed it).
func readUntilClosed(t *testing.T, c net.Conn) []Frame {
	t.Helper()
	var frames []Frame
	for {
		f, err := ReadFrame(c)
		if err != nil {
			var ne net.Error
			require.False(t, errors.As(err, &ne) && ne.Timeout(), "connection not closed by the daemon: %v", err)
			require.True(t, errors.Is(err, io.EOF) || strings.Contains(err.Error(), "reset"), "read: %v", err)
			return frames
		}
		frames = append(frames, f)
	}
}

// checkNoLeaks polls until no goroutine of a Monitor or of an HTTP server
// is left.
func checkNoLeaks(t *testing.T) {
	t.Helper()
	var leaked []string
	ok := waitfor.Until(func() bool {
		leaked = leaked[:0]
		buf := make([]byte, 4<<20)
		buf = buf[:runtime.Stack(buf, true)]
		for _, g := range strings.Split(string(buf), "\n\n") {
			if strings.Contains(g, "internal/daemon/monitor.(*") ||
				strings.Contains(g, "net/http.(*conn).serve") ||
				strings.Contains(g, "net/http.(*Server).Serve") ||
				strings.Contains(g, "net/http.(*persistConn)") {
				leaked = append(leaked, g)
			}
		}
		return len(leaked) == 0
	})
	if !ok {
		t.Fatalf("%d goroutines leaked:\n%s", len(leaked), strings.Join(leaked, "\n\n"))
	}
}

func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
	return p
}
