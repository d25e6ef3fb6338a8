// Package gateway is ntproxy's TCP gateway: it carries the connections of
// unmodified TCP programs — redis-server and redis-benchmark, nginx and
// wrk — over the fabric.
//
//	host a                                             host b
//	client ──TCP──▶ forward 127.0.0.1:16379            export :6379 ──TCP──▶ server
//	                  │ socklike Dial "b:6379"           ▲ socklike Listen :6379
//	                  └──────── NTB link (direct or proxied) ─┘
//
// A forward is a local TCP listener: each accepted connection is dialed,
// through the host's ntproxy, to a rack address. An export is a rack
// listener: each connection it accepts is carried to a local TCP server.
// Bytes are copied between the two sides with half closes passed on, so
// request/response protocols and streams both work unchanged.
//
// The gateway is an application of its own ntproxy (socklike attached
// mode): routing, access control, ports and reclaim are ntproxy's, and its
// connections show in `ntmon status` like any other. ntproxy serves it from
// a child process, so that its TCP sockets stay out of ntproxy
// (process.go: Process, ServeStats). In trunk mode (the
// default; trunk.go) the gateways of two hosts share one link of their
// own and every connection a forward carries between them is a
// connection on it, the proxies off the data path; `ntmon status` shows
// the trunk's control connection, the gateway's counters each carried
// one. In direct mode each forwarded connection gets a link of its own.
//
// With gateway.redirect_cgroup set, a cgroup/connect4 and connect6 eBPF
// program (internal/daemon/redirect) rewrites connects from that cgroup's
// processes to a forward's rack addresses — every virtual address of the
// forward's host, at its port — to the forward's listen address: the
// client needs no configuration change at all.
//
// Concurrency: Stats is safe at any time. Lifetime: Run serves until its
// context ends, then closes its listeners and every carried connection.
package gateway

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/daemon/redirect"
	"github.com/ntstack/ntstack/internal/prim/accept"
	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/socklike"
)

// copyBuf is the copy buffer of one direction of a carried connection: a
// socklike record, so a bulk transfer moves one record per call.
const copyBuf = socklike.DefaultMTU

// dialTimeout bounds the setup of one carried connection.
const dialTimeout = 10 * time.Second

// Gateway serves a host's forwards and exports.
type Gateway struct {
	cfg      *config.Config
	proxy    *socklike.Proxy
	logf     func(string, ...any)
	services []*service
	redirect *redirect.Redirect // nil without gateway.redirect_cgroup

	wg  sync.WaitGroup
	ctx context.Context // Run's

	mu sync.Mutex
	// mu protects the following fields.
	conns   map[*carried]struct{}
	trunks  map[string]*trunk // opened by this gateway's forwards, by host
	served  map[string]*trunk // opened by peers to reach the exports, by host
	closing bool              // Run is ending: carry nothing more
	ready   chan struct{}     // closed once every listener is up
}

// service is one forward or export with its counters.
type service struct {
	stat ctlapi.GatewayStat // the fixed fields; Gateway.mu guards Listen
	port int                // an export's rack port
	// redirected are the rack addresses the eBPF redirect sends here
	// (guarded by Gateway.mu).
	redirected []netip.AddrPort

	active, total, failed atomic.Int64
	trunked               atomic.Int64  // carried on a trunk (trunk.go)
	bytesIn, bytesOut     atomic.Uint64 // from the TCP side, to the TCP side
	lastErr               atomic.Pointer[string]
}

// carried is one connection the gateway carries.
type carried struct {
	tcp, fabric net.Conn
	once        sync.Once
}

func (c *carried) close() {
	c.once.Do(func() {
		c.tcp.Close()
		c.fabric.Close()
	})
}

// abort ends the connection as a TCP reset does, for a side that failed
// rather than finished (reset by its peer, a link lost): the TCP peer gets
// RST, and the fabric connection is aborted (socklike's Abort, the
// engine's on a trunk): the far gateway's calls fail with ECONNRESET, and
// it resets its TCP side too.
func (c *carried) abort() {
	c.once.Do(func() {
		if t, ok := c.tcp.(*net.TCPConn); ok {
			t.SetLinger(0)
		}
		c.tcp.Close()
		if a, ok := c.fabric.(interface{ Abort() error }); ok {
			a.Abort()
		} else {
			c.fabric.Close()
		}
	})
}

// New prepares the gateway of cfg's host, whose connections go through p.
// logf receives events (nil: none).
func New(cfg *config.Config, p *socklike.Proxy, logf func(string, ...any)) (*Gateway, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	g := &Gateway{cfg: cfg, proxy: p, logf: logf, ctx: context.Background(), ready: make(chan struct{}),
		conns: map[*carried]struct{}{}, trunks: map[string]*trunk{}, served: map[string]*trunk{}}
	for _, f := range cfg.Gateway.Forward {
		g.services = append(g.services, &service{stat: ctlapi.GatewayStat{Kind: "forward", Listen: f.Listen, To: f.To, Mode: cfg.Gateway.Mode}})
	}
	if cfg.Gateway.RedirectCgroup != "" {
		r, err := redirect.Attach(cfg.Gateway.RedirectCgroup)
		if err != nil {
			return nil, fmt.Errorf("gateway: redirect: %w", err)
		}
		g.redirect = r
	}
	for _, e := range cfg.Gateway.Export {
		g.services = append(g.services, &service{port: e.Port, stat: ctlapi.GatewayStat{Kind: "export", Listen: ":" + strconv.Itoa(e.Port), To: e.Target}})
	}
	return g, nil
}

// Ready is closed once every forward and export listens.
func (g *Gateway) Ready() <-chan struct{} { return g.ready }

// Run listens on every forward and export and carries their connections
// until ctx ends. It fails at once if a listener cannot be set up.
func (g *Gateway) Run(ctx context.Context) (err error) {
	g.ctx = ctx
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
		if g.redirect != nil {
			err = errors.Join(err, g.redirect.Close())
		}
	}()
	for _, svc := range g.services {
		var ln net.Listener
		var err error
		if svc.stat.Kind == "forward" {
			ln, err = net.Listen("tcp", svc.stat.Listen)
		} else {
			lc := socklike.ListenConfig{Proxy: g.proxy}
			ln, err = lc.Listen(context.Background(), "ntb", svc.stat.Listen)
		}
		if err != nil {
			return fmt.Errorf("gateway %s %s: %w", svc.stat.Kind, svc.stat.Listen, err)
		}
		lns = append(lns, ln)
		if svc.stat.Kind == "forward" {
			g.mu.Lock()
			svc.stat.Listen = ln.Addr().String() // the port, if the configuration left it to the kernel
			g.mu.Unlock()
			if err := g.redirectTo(svc, ln.Addr()); err != nil {
				return err
			}
		}
		g.logf("gateway: %s %s -> %s", svc.stat.Kind, svc.stat.Listen, svc.stat.To)
	}
	// The exports' trunk port, if any. Without it the peers' forwards
	// carry their connections as in direct mode, so it failing stops
	// nothing.
	var trunkLn net.Listener
	if len(lns) > len(g.cfg.Gateway.Forward) {
		lc := socklike.ListenConfig{Proxy: g.proxy}
		var lerr error
		if trunkLn, lerr = lc.Listen(context.Background(), "ntb", ":"+strconv.Itoa(config.GatewayTrunkPort)); lerr != nil {
			g.logf("gateway: no trunks for the peers (their forwards dial a link per connection): trunk port %d: %v", config.GatewayTrunkPort, lerr)
			trunkLn = nil
		} else {
			defer trunkLn.Close()
		}
	}
	close(g.ready)
	// The accept loops count in wg too, so that a connection they accept
	// while Run stops is added before wg reaches zero.
	errc := make(chan error, len(lns)+1)
	g.wg.Add(len(lns))
	for i, ln := range lns {
		go func() {
			defer g.wg.Done()
			errc <- g.serve(ctx, ln, g.services[i])
		}()
	}
	if trunkLn != nil {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			errc <- g.serveTrunks(ctx, trunkLn)
		}()
	}
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	for _, ln := range lns {
		ln.Close()
	}
	lns = nil
	if trunkLn != nil {
		trunkLn.Close()
	}
	g.mu.Lock()
	g.closing = true
	for c := range g.conns {
		c.close()
	}
	var trunks []*trunk
	for _, m := range []map[string]*trunk{g.trunks, g.served} {
		for _, t := range m {
			trunks = append(trunks, t)
		}
	}
	g.mu.Unlock()
	for _, t := range trunks {
		t.end()
	}
	g.wg.Wait()
	return err
}

// redirectTo has the eBPF redirect send connects to svc's rack addresses
// (every virtual address of its host, at its port) to addr.
func (g *Gateway) redirectTo(svc *service, addr net.Addr) error {
	if g.redirect == nil {
		return nil
	}
	to, err := netip.ParseAddrPort(addr.String())
	if err != nil {
		return fmt.Errorf("gateway: redirect to %s: %w", addr, err)
	}
	if to.Addr().IsUnspecified() { // a wildcard listen: loopback reaches it
		to = netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), to.Port())
	}
	host, port, _ := net.SplitHostPort(svc.stat.To)
	name, _ := g.cfg.HostOf(host)
	addrs := []string{host}
	if p, ok := g.cfg.Peer(name); ok {
		addrs = append(addrs, p.Addresses...)
	}
	var set []netip.AddrPort
	for _, a := range addrs {
		from, err := netip.ParseAddrPort(net.JoinHostPort(a, port))
		if err != nil {
			continue // a host name: programs connect to addresses
		}
		if err := g.redirect.Set(from, to); err != nil {
			return fmt.Errorf("gateway: redirect %s to %s: %w", from, to, err)
		}
		set = append(set, from)
		g.logf("gateway: connects from %s to %s go to %s", g.redirect.Cgroup(), from, to)
	}
	g.mu.Lock()
	svc.redirected = set
	g.mu.Unlock()
	return nil
}

// Bounds of a forward's connections still being set up (the gateway
// dialing their other side, at most dialTimeout), per remote IP. Clients
// of a forward are mostly on this host (one IP), so the bound leaves room
// for a benchmark's burst of connections; more are closed at once.
const maxPendingPerIP = 256

// serve accepts on ln until it closes. Accept errors (descriptors running
// out, say) are retried with backoff, never returned.
func (g *Gateway) serve(ctx context.Context, ln net.Listener, svc *service) error {
	what := fmt.Sprintf("gateway %s %s", svc.stat.Kind, svc.stat.Listen)
	retry := accept.Retry{What: what, Logf: g.logf}
	pending := accept.NewLimiter(what, maxPendingPerIP, g.logf)
	for {
		c, ok := accept.Next(&retry, ctx.Done(), ln.Accept)
		if !ok {
			return nil
		}
		ip, err := accept.RemoteIP(c)
		if err != nil {
			c.Close()
			continue
		}
		release, ok := pending.Take(ip)
		if !ok {
			c.Close()
			continue
		}
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.carry(ctx, svc, c, release)
		}()
	}
}

// carry connects c's other side and copies between them; connected ends
// c's pending time once the other side is dialed (or not).
func (g *Gateway) carry(ctx context.Context, svc *service, c net.Conn, connected func()) {
	svc.total.Add(1)
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	other, err := g.dial(dctx, svc)
	cancel()
	connected()
	if err != nil {
		// Counted before the close, which the client sees.
		svc.failed.Add(1)
		msg := err.Error()
		svc.lastErr.Store(&msg)
		c.Close()
		g.logf("gateway: %s %s -> %s: %v", svc.stat.Kind, svc.stat.Listen, svc.stat.To, err)
		return
	}
	cc := &carried{fabric: other, tcp: c}
	if svc.stat.Kind == "export" {
		cc.fabric, cc.tcp = c, other
	}
	g.mu.Lock()
	if g.closing {
		g.mu.Unlock()
		cc.close()
		return
	}
	g.conns[cc] = struct{}{}
	g.mu.Unlock()
	svc.active.Add(1)
	defer func() {
		svc.active.Add(-1)
		g.mu.Lock()
		delete(g.conns, cc)
		g.mu.Unlock()
	}()
	done := make(chan struct{})
	go func() {
		defer close(done)
		pipe(cc, cc.fabric, cc.tcp, &svc.bytesOut)
	}()
	pipe(cc, cc.tcp, cc.fabric, &svc.bytesIn)
	<-done
	cc.close()
}

// dial opens the other side of a connection accepted by svc.
func (g *Gateway) dial(ctx context.Context, svc *service) (net.Conn, error) {
	if svc.stat.Kind == "export" {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", svc.stat.To)
	}
	if g.cfg.Gateway.Mode != config.GatewayProxy { // "" is the default, trunk
		if g.cfg.Gateway.Mode != config.GatewayDirect {
			if c, ok := g.dialTrunk(ctx, svc); ok {
				return c, nil
			}
		}
		d := socklike.Dialer{Proxy: g.proxy, Direct: true}
		return d.DialContext(ctx, "ntb", svc.stat.To)
	}
	d := socklike.Dialer{Proxy: g.proxy}
	return d.DialContext(ctx, "ntb", svc.stat.To)
}

// pipe copies src to dst until src ends; it passes EOF on as a half close
// and any other end (a reset, a failed write) as a reset of the whole
// connection (abort). A socket onto a trunk's connection is read straight
// into the trunk's ring (fillPipe).
func pipe(cc *carried, dst, src net.Conn, n *atomic.Uint64) {
	if fc, ok := dst.(*transport.Conn); ok {
		if sc, ok := src.(syscall.Conn); ok {
			if rc, err := sc.SyscallConn(); err == nil && fillPipe(cc, fc, rc, n) {
				return
			}
		}
	}
	buf := make([]byte, copyBuf)
	for {
		k, err := src.Read(buf)
		if k > 0 {
			if _, werr := dst.Write(buf[:k]); werr != nil {
				cc.abort()
				return
			}
			n.Add(uint64(k))
		}
		if err != nil {
			pipeEnd(cc, dst, err)
			return
		}
	}
}

// fillMax is the most one ReadSocket of fillPipe moves: a few records a
// call, between which the byte count moves on.
const fillMax = 4 * copyBuf

// fillPipe is pipe from a socket to a connection that reads it into its
// ring itself (transport.Conn.ReadSocket), which saves the copy through a
// buffer: 4 % of the machine's CPU under wrk's 1 MiB responses. It
// reports false, having moved nothing, if dst cannot.
func fillPipe(cc *carried, dst *transport.Conn, rc syscall.RawConn, n *atomic.Uint64) bool {
	for {
		k, err := dst.ReadSocket(rc, fillMax)
		if errors.Is(err, errors.ErrUnsupported) {
			return false
		}
		n.Add(uint64(k))
		if err != nil {
			pipeEnd(cc, dst, err)
			return true
		}
	}
}

// pipeEnd ends pipe's copy to dst on err: EOF as a half close, anything
// else as an abort.
func pipeEnd(cc *carried, dst net.Conn, err error) {
	cw, ok := dst.(interface{ CloseWrite() error })
	switch {
	case !errors.Is(err, io.EOF):
		cc.abort()
	case !ok || cw.CloseWrite() != nil:
		cc.close()
	}
}

// Stats returns each service's counters.
func (g *Gateway) Stats() []ctlapi.GatewayStat {
	out := make([]ctlapi.GatewayStat, 0, len(g.services))
	for _, svc := range g.services {
		g.mu.Lock()
		st, redirected := svc.stat, svc.redirected
		g.mu.Unlock()
		st.Active = svc.active.Load()
		st.Total = svc.total.Load()
		st.Failed = svc.failed.Load()
		st.BytesIn = svc.bytesIn.Load()
		st.BytesOut = svc.bytesOut.Load()
		if e := svc.lastErr.Load(); e != nil {
			st.LastError = *e
		}
		for _, from := range redirected {
			if n, err := g.redirect.Count(from); err == nil {
				st.Redirects += n
			}
		}
		out = append(out, st)
	}
	return out
}
