package monitor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/accept"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/internal/wire/hostauth"
)

// Defaults for zero Options fields.
const (
	DefaultBackoffMin   = 100 * time.Millisecond
	DefaultBackoffMax   = time.Second
	DefaultProxyTimeout = time.Second
	// maxHandshakes bounds inbound connections that have not finished
	// their HELLO exchange, and maxHandshakesPerIP those of one remote
	// address (a peer has one at a time); more are closed at once.
	maxHandshakes      = 64
	maxHandshakesPerIP = 4
)

// DefaultCaps are the capabilities a Monitor advertises unless
// Options.Caps says otherwise.
var DefaultCaps = []string{"ntb", "tcp"}

// Options tune a Monitor. The zero value is ready to use.
type Options struct {
	// Logger receives the daemon's log; nil means slog.Default().
	Logger *slog.Logger
	// Version is the build's version, reported in status ("" = "dev").
	Version string
	// Caps are the capabilities advertised to peers (nil = DefaultCaps,
	// and "rdma" while RDMA.Addr is set).
	Caps []string
	// RDMA is whether this host's ntproxy takes RDMA connections: at
	// RDMA.Addr, or not, for the reason RDMA.Why. The zero value: not,
	// for want of a proxy.rdma.listen (cmd/ntmon probes the device).
	RDMA RDMA
	// PeerListener, if set, is used instead of listening on
	// cfg.Monitor.Listen; the Monitor owns and closes it. Tests bind
	// ephemeral ports first so that each Monitor's config can name the
	// others' addresses.
	PeerListener net.Listener
	// MetricsListener, if set, is used instead of cfg.Monitor.Metrics.
	MetricsListener net.Listener
	// BackoffMin and BackoffMax bound the delay between dials to a peer
	// (doubling from min to max; defaults 100 ms and 1 s).
	BackoffMin, BackoffMax time.Duration
	// ProxyTimeout bounds how long status and a metrics scrape wait for
	// ntproxy's snapshot (default 1 s).
	ProxyTimeout time.Duration
}

// RDMA is a host's RDMA capability, as its HELLO tells its peers.
type RDMA struct {
	Addr string // its ntproxy's RDMA listener ("" = none)
	Why  string // why there is none
}

// Monitor is one host's ntmon. See the package documentation.
type Monitor struct {
	cfg         *config.Config
	opts        Options
	log         *slog.Logger
	heartbeat   time.Duration
	peerTimeout time.Duration
	proxy       *ctlapi.Client
	auth        *hostauth.Auth // nil: insecure, peers not authenticated
	ports       *portTable
	started     time.Time

	peerLn    net.Listener // nil when the host accepts no peers
	apiLn     net.Listener
	apiPath   string
	metricsLn net.Listener // nil when metrics are off
	api       *http.Server
	metrics   *http.Server

	ctx        context.Context // cancelled by Close
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	handshakes chan struct{} // semaphore of inbound handshakes
	done       chan struct{} // closed when Close has finished
	closeOnce  sync.Once
	closeErr   error

	// mu protects the following fields.
	mu      sync.Mutex
	peers   map[string]*peerState // by host name, one per cfg.Peers entry
	conns   map[net.Conn]struct{} // every open peer connection
	running bool                  // Start has run
	closed  bool                  // Close has begun
}

// New checks cfg and binds the peer listener, the local API socket and the
// metrics listener. It starts no goroutine: call Start or Run. On error
// everything New bound is released, including the listeners in opts.
func New(cfg *config.Config, opts Options) (m *Monitor, err error) {
	var cleanup []io.Closer
	defer func() {
		if err != nil {
			for _, c := range cleanup {
				_ = c.Close()
			}
		}
	}()
	if opts.PeerListener != nil {
		cleanup = append(cleanup, opts.PeerListener)
	}
	if opts.MetricsListener != nil {
		cleanup = append(cleanup, opts.MetricsListener)
	}
	if cfg == nil {
		return nil, errors.New("new monitor: nil config")
	}
	m = &Monitor{
		cfg:         cfg,
		opts:        opts,
		log:         opts.Logger,
		heartbeat:   cfg.Monitor.Heartbeat.Duration,
		peerTimeout: cfg.Monitor.PeerTimeout.Duration,
		ports:       newPortTable(),
		started:     time.Now(),
		handshakes:  make(chan struct{}, maxHandshakes),
		done:        make(chan struct{}),
		peers:       make(map[string]*peerState),
		conns:       make(map[net.Conn]struct{}),
	}
	if m.log == nil {
		m.log = slog.Default()
	}
	m.log = m.log.With("host", cfg.Host)
	if m.auth, err = cfg.HostAuth(); err != nil {
		return nil, fmt.Errorf("new monitor: %w", err)
	}
	if m.auth == nil {
		m.log.Warn(cfg.InsecureWarning())
	}
	if m.opts.Version == "" {
		m.opts.Version = "dev"
	}
	if m.opts.RDMA.Addr == "" && m.opts.RDMA.Why == "" {
		m.opts.RDMA.Why = "proxy.rdma.listen not configured"
	}
	if m.opts.Caps == nil {
		m.opts.Caps = DefaultCaps
		if m.opts.RDMA.Addr != "" {
			m.opts.Caps = append(slices.Clone(DefaultCaps), "rdma")
		}
	}
	if m.opts.BackoffMin <= 0 {
		m.opts.BackoffMin = DefaultBackoffMin
	}
	if m.opts.BackoffMax < m.opts.BackoffMin {
		m.opts.BackoffMax = max(DefaultBackoffMax, m.opts.BackoffMin)
	}
	if m.opts.ProxyTimeout <= 0 {
		m.opts.ProxyTimeout = DefaultProxyTimeout
	}
	if m.heartbeat <= 0 {
		m.heartbeat = config.DefaultHeartbeat
	}
	if m.peerTimeout <= 0 {
		m.peerTimeout = config.DefaultPeerTimeout
	}
	if m.peerTimeout <= m.heartbeat {
		return nil, fmt.Errorf("new monitor: peer_timeout %v must exceed heartbeat %v", m.peerTimeout, m.heartbeat)
	}
	for _, p := range cfg.Peers {
		if _, dup := m.peers[p.Host]; dup {
			return nil, fmt.Errorf("new monitor: peer %s listed twice", p.Host)
		}
		m.peers[p.Host] = &peerState{cfg: p, why: "no session yet", since: m.started, changed: make(chan struct{})}
	}

	m.peerLn = opts.PeerListener
	if m.peerLn == nil && cfg.Monitor.Listen != "" {
		if m.peerLn, err = net.Listen("tcp", cfg.Monitor.Listen); err != nil {
			return nil, fmt.Errorf("new monitor: listen for peers: %w", err)
		}
		cleanup = append(cleanup, m.peerLn)
	}
	m.metricsLn = opts.MetricsListener
	if m.metricsLn == nil && cfg.Monitor.Metrics != "" {
		if m.metricsLn, err = net.Listen("tcp", cfg.Monitor.Metrics); err != nil {
			return nil, fmt.Errorf("new monitor: listen for metrics: %w", err)
		}
		cleanup = append(cleanup, m.metricsLn)
	}
	m.apiPath = cfg.Path(config.MonitorSocket)
	if m.apiLn, err = listenUnix(m.apiPath); err != nil {
		return nil, fmt.Errorf("new monitor: %w", err)
	}
	cleanup = append(cleanup, m.apiLn)
	m.apiLn = m.wrapAPIListener(m.apiLn)
	if m.metricsLn != nil {
		m.metricsLn = accept.Wrap(m.metricsLn, accept.Options{What: "metrics " + m.metricsLn.Addr().String(), Logf: m.logf, PerSource: maxMetricsConnsPerIP})
	}

	m.proxy = ctlapi.NewClient(cfg.Path(config.AdminSocket))
	// The timeouts end the connections of callers that stall: each one
	// counts against its uid's (or IP's) bound while open.
	m.api = &http.Server{Handler: m.apiHandler(), ConnContext: connContext,
		ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	if m.metricsLn != nil {
		m.metrics = &http.Server{Handler: m.metricsHandler(),
			ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second, IdleTimeout: time.Minute}
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	return m, nil
}

// listenUnix listens on the socket at path for the local API: it creates
// the directory, replaces a stale socket file (one nobody answers on) and
// opens the socket to every local user (0666): each request is answered
// for its connection's SO_PEERCRED identity (caller.go).
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("listen %s: exists and is not a socket", path)
		}
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			_ = c.Close()
			return nil, fmt.Errorf("listen %s: another ntmon is serving it", path)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("listen %s: remove stale socket: %w", path, err)
		}
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o666); err != nil {
		_ = ln.Close()
		return nil, fmt.Errorf("listen %s: chmod: %w", path, err)
	}
	return ln, nil
}

// Security says how this host's peer channels are protected, for status:
// the insecure warning, or the authentication in force.
func (m *Monitor) Security() string {
	if m.auth == nil {
		return m.cfg.InsecureWarning()
	}
	if m.cfg.Auth.CA != "" {
		return "peers authenticated: TLS 1.3, pinned host keys or rack CA " + m.cfg.Auth.CA + "; key " + m.auth.Pin()
	}
	return "peers authenticated: TLS 1.3, pinned host keys; key " + m.auth.Pin()
}

// PeerAddr is the address peers reach this Monitor on (nil: none).
func (m *Monitor) PeerAddr() net.Addr {
	if m.peerLn == nil {
		return nil
	}
	return m.peerLn.Addr()
}

// MetricsAddr is the address of the metrics endpoint (nil: disabled).
func (m *Monitor) MetricsAddr() net.Addr {
	if m.metricsLn == nil {
		return nil
	}
	return m.metricsLn.Addr()
}

// SocketPath is the local API's Unix socket.
func (m *Monitor) SocketPath() string { return m.apiPath }

// Start starts the Monitor's goroutines and returns. It fails after Close
// and does nothing the second time.
func (m *Monitor) Start() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errors.New("start monitor: closed")
	}
	if m.running {
		return nil
	}
	m.running = true
	m.log.Info("ntmon starting", "version", m.opts.Version, "protocol", ProtocolVersion,
		"peers", len(m.cfg.Peers), "listen", addrString(m.PeerAddr()), "socket", m.apiPath,
		"metrics", addrString(m.MetricsAddr()))
	if m.peerLn != nil {
		m.wg.Add(1)
		go m.runAccept()
	}
	for _, p := range m.cfg.Peers {
		if p.Control == "" {
			continue
		}
		m.wg.Add(1)
		go m.runDialer(m.peers[p.Host])
	}
	m.wg.Add(1)
	go m.runServer("local API", m.api, m.apiLn)
	if m.metrics != nil {
		m.wg.Add(1)
		go m.runServer("metrics", m.metrics, m.metricsLn)
	}
	return nil
}

// Run starts the Monitor, blocks until ctx is done or Close is called, and
// returns Close's result.
func (m *Monitor) Run(ctx context.Context) error {
	if err := m.Start(); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case <-m.ctx.Done():
	}
	return m.Close()
}

// Close says goodbye to every peer, closes every listener and connection,
// removes the API socket, and waits for every goroutine. It is idempotent
// and safe to call concurrently; all calls return the first call's result.
func (m *Monitor) Close() error {
	m.closeOnce.Do(func() {
		m.cancel()
		m.mu.Lock()
		m.closed = true
		var live []*session
		for _, p := range m.peers {
			if p.sess != nil {
				live = append(live, p.sess)
			}
		}
		m.mu.Unlock()
		var errs []error
		closeLn := func(what string, ln net.Listener) {
			if ln == nil {
				return
			}
			if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
				errs = append(errs, fmt.Errorf("close %s listener: %w", what, err))
			}
		}
		// Refuse redials first, so that peers see the goodbye, not a reset.
		closeLn("peer", m.peerLn)
		for _, s := range live {
			s.bye(fmt.Sprintf("ntmon on %s is shutting down", m.cfg.Host))
		}
		// Server.Close closes the listeners Serve got; closing them here too
		// covers a Monitor that was never started.
		if err := m.api.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("close local API: %w", err))
		}
		closeLn("local API", m.apiLn)
		if m.metrics != nil {
			if err := m.metrics.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
				errs = append(errs, fmt.Errorf("close metrics: %w", err))
			}
		}
		closeLn("metrics", m.metricsLn)
		m.mu.Lock()
		conns := make([]net.Conn, 0, len(m.conns))
		for c := range m.conns {
			conns = append(conns, c)
		}
		m.mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
		m.wg.Wait()
		m.proxy.Close()
		m.closeErr = errors.Join(errs...)
		m.log.Info("ntmon stopped")
		close(m.done)
	})
	<-m.done
	return m.closeErr
}

func (m *Monitor) runServer(what string, srv *http.Server, ln net.Listener) {
	defer m.wg.Done()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		m.log.Error("serve "+what, "err", err)
	}
}

// track registers a peer connection so that Close can close it; it
// reports false (and the caller must close conn) once Close has begun.
func (m *Monitor) track(c net.Conn) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.conns[c] = struct{}{}
	return true
}

func (m *Monitor) untrack(c net.Conn) {
	m.mu.Lock()
	delete(m.conns, c)
	m.mu.Unlock()
	_ = c.Close()
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}

// sleepCtx waits d or until ctx is done; it reports whether d passed.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
