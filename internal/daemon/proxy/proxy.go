// Package proxy is ntproxy, the data-plane daemon of a host, as a library.
//
// A Server owns the host's NTB links (one transport.Endpoint per rack peer)
// and serves every local application. An application attaches over a Unix
// socket (internal/wire/appproto): the Server checks its credentials, gives it a
// private memory link (an emulated NTB link in a memfd) and from then on
// carries its connections: a dial goes to another application on this host
// over shared memory, or to a rack peer's proxy over the NTB link; a listen
// takes connections from both. The Server copies bytes between the
// application's connection and the other side ("proxy" mode: applications
// never touch the fabric windows, so one cannot read another's traffic).
// In shared-pool mode (pool.go) a connection to a rack peer moves its
// bytes through a slot of a pool the application shares with the Server
// alone, which its leg sends from and receives into; in direct mode
// (direct.go) the two proxies grant the connection a link of its own and
// leave the data path.
//
// An application that exits or crashes loses its Unix socket; the Server
// then closes its connections and listeners and frees its memory link and
// its pool (once every slot is back).
//
// Concurrency: all methods are safe for concurrent use. Lifetime: Close
// stops everything and waits for the goroutines; it is idempotent.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/accept"
	"github.com/ntstack/ntstack/internal/prim/pool"
	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/internal/wire/hostauth"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/qos"
	"github.com/ntstack/ntstack/rdma"
)

// Timeouts of the setup steps; data transfer has none.
const (
	helloTimeout   = 5 * time.Second
	requestTimeout = 5 * time.Second
	dialTimeout    = 10 * time.Second
)

// Bounds of connections accepted but not yet through their handshake:
// an application's attach exchange (per uid), a peer proxy's open on the
// fallback listener (per remote IP; a failover moves many legs at once).
// More are closed at once.
const (
	maxPendingPerUID = 32
	maxPendingPerIP  = 64
)

// Options configure a Server beyond the host configuration.
type Options struct {
	// Control answers routes, admissions and ports (default: StaticControl).
	Control Control
	// Logf receives events (default: none).
	Logf func(format string, args ...any)
	// Gateway reports the TCP gateway's services for the snapshot (nil:
	// no gateway).
	Gateway func() []ctlapi.GatewayStat
	// Trunks reports the TCP gateway's trunks for the snapshot (nil: no
	// gateway).
	Trunks func() []ctlapi.TrunkStat
	// RDMA carries legs to and from hosts that ntmon routes over RDMA;
	// ListenAndServe listens with it on proxy.rdma.listen. nil: no RDMA
	// path (see OpenRDMA).
	RDMA rdma.Provider
}

// Server is a host's ntproxy.
type Server struct {
	cfg    *config.Config
	ctl    Control
	logf   func(string, ...any)
	gwStat func() []ctlapi.GatewayStat
	trunks func() []ctlapi.TrunkStat
	rdma   rdma.Provider  // nil: none
	auth   *hostauth.Auth // nil: auth.insecure, peers not authenticated
	appCfg transport.Config
	links  map[string]*rackLink // by peer host; fixed after New
	// poolPoller spins for the shared-pool legs' waits, all
	// applications' at once (see appPool).
	poolPoller *pool.Poller
	ctx        context.Context
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	nextID     atomic.Uint64
	// pathSwitches counts legs' transport changes.
	pathSwitches atomic.Uint64

	mu sync.Mutex
	// mu protects the following fields.
	apps      map[uint64]*app
	listeners map[int]*listener // by port
	conns     map[uint64]*pconn
	legs      map[legKey]*leg
	socks     []net.Listener
	closed    bool
	leased    chan struct{} // closed when a direct lease is recorded (awaitHolder), if anyone waits
}

// rackLink is the NTB link to one rack peer.
type rackLink struct {
	peer   config.Peer
	ep     *transport.Endpoint
	everUp atomic.Bool // the link has been up since New (runLinkWatch)
}

// forwarderSpinYield is the spin yield (transport.Config.SpinYield) of
// ntproxy's endpoints: its goroutines hand every message on to each other
// (a leg's receiver to the deliverer, the pump to the sender), so a spinner
// must let them in often, and so must a bulk Read on a link
// (Config.HandOff, set on the links only: see there).
const forwarderSpinYield = 16

// rackUserTimeout is how long a rack link's connections wait for their
// link to come back before they fail and their legs move to the fallback
// path: long enough for the session to restart over a link that stayed
// up, short beside the legs' own resume.
const rackUserTimeout = 20 * time.Millisecond

// New opens the NTB links of cfg's peers. It does not serve applications
// until Serve.
func New(cfg *config.Config, o Options) (_ *Server, err error) {
	s := &Server{
		cfg:        cfg,
		ctl:        o.Control,
		logf:       o.Logf,
		gwStat:     o.Gateway,
		trunks:     o.Trunks,
		rdma:       o.RDMA,
		links:      map[string]*rackLink{},
		apps:       map[uint64]*app{},
		listeners:  map[int]*listener{},
		conns:      map[uint64]*pconn{},
		legs:       map[legKey]*leg{},
		poolPoller: pool.NewPoller(),
	}
	if s.ctl == nil {
		s.ctl = &StaticControl{Config: cfg}
	}
	if cfg.Proxy.DirectWindow == 0 || cfg.Proxy.DirectQuota == 0 {
		return nil, fmt.Errorf("proxy: configuration without defaults (use config.Load or config.Parse)")
	}
	if s.logf == nil {
		s.logf = func(string, ...any) {}
	}
	if s.auth, err = cfg.HostAuth(); err != nil {
		return nil, fmt.Errorf("proxy: %w", err)
	}
	if s.auth == nil {
		s.logf("%s", cfg.InsecureWarning())
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	// The fabric waits of ntproxy's legs spin as a fabric-only process's
	// until it carries data over sockets: its TCP gateway (cmd/ntproxy)
	// or a fallback leg (connect, serveFallback) makes the process one
	// with sockets for good (spingate), and from then on they leave a P to
	// the runtime's poller, the pool legs' too (pool.Slot.Wait). Its
	// control and admin sockets do not: their requests are rare and
	// wait at most a spin budget.
	s.appCfg = transport.Config{SpinBudget: cfg.Proxy.SpinBudget.Duration, SpinYield: forwarderSpinYield}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	for _, p := range cfg.Peers {
		if p.Link == "" {
			continue
		}
		ep, err := transport.Open(p.Link, transport.Config{
			SpinBudget: cfg.Proxy.SpinBudget.Duration,
			SpinYield:  forwarderSpinYield,
			HandOff:    true,
			// A full leg frame is one record. The MTU is above
			// DefaultMTU, so the link cuts no bulk record into pieces
			// beside small messages (transport.Config.MTU): with pieces
			// a lone large file ran 25-35 % slower, its partition taken
			// for one that carries small messages (docs/perf-log.md,
			// 2026-12-03).
			MTU:        legMaxPayload + legHdr,
			Partitions: cfg.Proxy.Partitions,
			// A leg moves to the next path itself (leg.go): its transport
			// connection waits for the link only through a session
			// restart, not an outage.
			UserTimeout: rackUserTimeout,
			// A peer ntproxy that is attached but not heard from is waited
			// for, as long as an application's connection would wait:
			// one merely starved of CPU costs neither a leg's move nor a
			// dial over the link (a direct dial has no other path), and a
			// fallback leg would end at that same process.
			SilentTimeout: transport.DefaultUserTimeout,
			// FutexWait: a wake-up through the runtime's poller costs
			// ntproxy more than the futex wait does (see shm's bell).
			// Side: fixed per host pair, see linkSide.
			Fabric: shm.Options{Dir: cfg.Proxy.FabricDir, WindowSize: cfg.Proxy.Window, HeartbeatTimeout: cfg.Proxy.LinkTimeout.Duration, FutexWait: true,
				Side: linkSide(cfg.Host, p.Host), Logf: func(format string, args ...any) {
					s.logf("link %s: "+format, append([]any{p.Link}, args...)...)
				}},
			Logf: func(format string, args ...any) {
				s.logf("link %s: "+format, append([]any{p.Link}, args...)...)
			},
		})
		if err != nil {
			return nil, fmt.Errorf("open link %s to %s: %w", p.Link, p.Host, err)
		}
		link := &rackLink{peer: p, ep: ep}
		s.links[p.Host] = link
		ln, err := ep.Listen(resumePort)
		if err != nil {
			return nil, fmt.Errorf("link %s: resume port %d: %w", p.Link, resumePort, err)
		}
		s.wg.Add(2)
		go s.runResumeAccept(link, ln)
		go s.runLinkWatch(link)
	}
	return s, nil
}

// ListenAndServe serves applications on cfg's proxy socket, the snapshot
// API on its admin socket and, if configured, peers' proxies on its TCP
// fallback address and its RDMA listener, until Close. It returns nil
// when Close ends it, even a Close that comes before it serves.
func (s *Server) ListenAndServe() error {
	if err := os.MkdirAll(s.cfg.StateDir, 0o755); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	apps, err := listenUnix(s.cfg.Path(config.ProxySocket), 0o666)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	admin, err := listenUnix(s.cfg.Path(config.AdminSocket), 0o600) // root: it injects faults
	if err != nil {
		apps.Close()
		return fmt.Errorf("serve: %w", err)
	}
	serve := []func() error{func() error { return s.Serve(apps) }, func() error { return s.ServeAdmin(admin) }}
	opened := []net.Listener{apps, admin}
	fail := func(err error) error {
		for _, ln := range opened {
			ln.Close()
		}
		return fmt.Errorf("serve: %w", err)
	}
	if s.cfg.Proxy.Fallback != "" {
		tcp, err := net.Listen("tcp", s.cfg.Proxy.Fallback)
		if err != nil {
			return fail(fmt.Errorf("fallback: %w", err))
		}
		opened = append(opened, tcp)
		serve = append(serve, func() error { return s.serveFallback(tcp, ctlapi.PathTCP) })
	}
	if s.rdma != nil && s.cfg.Proxy.RDMA.Listen != "" {
		rl, err := s.rdma.Listen(s.cfg.Proxy.RDMA.Listen)
		if err != nil {
			return fail(fmt.Errorf("rdma: %w", err))
		}
		serve = append(serve, func() error { return s.serveFallback(rl, ctlapi.PathRDMA) })
	}
	errc := make(chan error, len(serve))
	for _, f := range serve {
		go func() {
			err := f()
			if errors.Is(err, net.ErrClosed) && s.isClosed() {
				err = nil // Close came before this goroutine began to serve
			}
			errc <- err
		}()
	}
	err = <-errc
	s.Close()
	errs := []error{err}
	for range len(serve) - 1 {
		errs = append(errs, <-errc)
	}
	return errors.Join(errs...)
}

// listenUnix listens on path with the given permissions, removing a stale
// socket file first.
func listenUnix(path string, mode os.FileMode) (*net.UnixListener, error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, mode); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// track registers a listener for Close; false if the Server is closed.
func (s *Server) track(ln net.Listener) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.socks = append(s.socks, ln)
	return true
}

// Serve attaches applications connecting to ln until ln or the Server
// closes. Accept errors (descriptors running out, say) are retried with
// backoff, never returned; each uid has at most maxPendingPerUID
// connections between accept and the end of its attach exchange (bounded
// by helloTimeout), so one user's flood leaves the others room.
func (s *Server) Serve(ln *net.UnixListener) error {
	if !s.track(ln) {
		ln.Close()
		return net.ErrClosed
	}
	what := "application socket " + ln.Addr().String()
	retry := accept.Retry{What: what, Logf: s.logf}
	pending := accept.NewLimiter(what, maxPendingPerUID, s.logf)
	for {
		c, ok := accept.Next(&retry, s.ctx.Done(), ln.AcceptUnix)
		if !ok {
			return nil
		}
		cred, err := proc.PeerCred(c)
		if err != nil {
			s.logf("attach refused: %v", err)
			c.Close()
			continue
		}
		release, ok := pending.Take(strconv.Itoa(cred.UID))
		if !ok {
			c.Close()
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.runApp(c, release)
		}()
	}
}

// Close detaches every application, closes every link and waits.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	socks := s.socks
	apps := make([]*app, 0, len(s.apps))
	for _, a := range s.apps {
		apps = append(apps, a)
	}
	s.mu.Unlock()
	s.cancel()
	var errs []error
	for _, ln := range socks {
		ln.Close()
	}
	for _, a := range apps {
		a.unix.Close() // its runApp tears it down
	}
	s.wg.Wait()
	for _, l := range s.links {
		errs = append(errs, l.ep.Close())
	}
	return errors.Join(errs...)
}

func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

func validClass(p int) (qos.Class, error) {
	c := qos.Class(p)
	if p < 0 || !c.Valid() {
		return 0, ctlapi.Errorf(ctlapi.CodeBadRequest, "priority %d outside 0..%d", p, qos.Lowest)
	}
	return c, nil
}

// runResumeAccept takes legs moving onto a rack link.
func (s *Server) runResumeAccept(link *rackLink, ln *transport.Listener) {
	defer s.wg.Done()
	go func() {
		<-s.ctx.Done()
		ln.Close()
	}()
	for {
		fc, err := ln.AcceptConn()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveInbound(fc, inbound{from: link.peer.Host, path: ctlapi.PathNTB, link: link.peer.Link, partition: fc.Partition(), via: "over NTB link " + link.peer.Link})
		}()
	}
}
