package socklike

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/appproto"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/internal/wire/errcode"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/qos"
)

// EnvProxy names the environment variable that puts the package in
// attached mode: the path of the host's ntproxy socket (its state_dir's
// ntproxy.sock). A Dialer without an Endpoint, and Listen, use it.
const EnvProxy = "NTSTACK_PROXY"

// errNoDirectPath: direct mode was asked for a host reachable only off
// the NTB fabric (it wraps ErrNoPath).
var errNoDirectPath = fmt.Errorf("direct mode impossible: %w", ErrNoPath)

// codeErr turns a daemon's coded answer into an error of this package.
func codeErr(code errcode.Code, msg string) error {
	var base error
	switch code {
	case errcode.CodeDenied:
		base = ErrDenied
	case errcode.CodeNoPath:
		base = ErrNoPath
	case errcode.CodeUnknown:
		base = ErrUnknownHost
	case errcode.CodeRefused:
		base = syscall.ECONNREFUSED
	case errcode.CodePortInUse:
		base = syscall.EADDRINUSE
	case errcode.CodeQuota:
		base = qos.ErrQuota
	case errcode.CodeNoDirect:
		base = errNoDirectPath
	case errcode.CodeVersion:
		base = ErrVersion
	case errcode.CodeTimeout:
		base = os.ErrDeadlineExceeded
	default:
		base = ErrProxy
	}
	return fmt.Errorf("%w: %s", base, msg)
}

// Proxy is an application's attachment to its host's ntproxy (attached
// mode). Connections reach any host of the rack by name or virtual
// address: another application on this host over shared memory, a rack
// peer over its NTB link. The application shares memory only with its own
// ntproxy, never with another application or the fabric.
//
// If ntproxy goes away, every connection fails (wrapping ErrProxyGone)
// within milliseconds, and the next Dial attaches again; Listeners
// re-register by themselves once ntproxy is back.
type Proxy struct {
	path string
	cfg  transport.Config
	name string
	pool bool // Listen and Dialers without Pool ask for shared-pool mode ($NTSTACK_POOL)
	// linkIdle is how long side 0 keeps a direct link with no
	// connection (negative: not at all; directlink.go).
	linkIdle time.Duration

	mu sync.Mutex
	// mu protects the following fields.
	cur         *attachment
	closed      bool
	nextPort    int                             // ports of this side of the memory link, for listeners
	directs     map[string]*directConn          // direct connections by stream name, for their fallback
	dialLinks   map[string][]*directLink        // side 0's direct links by address dialed, oldest first
	acceptLinks map[string]*directLink          // side 1's direct links by name
	starts      map[string]chan *transport.Conn // side 1's links opening, awaiting the proxied path to begin on (directstart.go)
}

// attachment is one Hello/Welcome session with ntproxy.
type attachment struct {
	unix *net.UnixConn
	ep   *transport.Endpoint
	pool *sharedPool // nil: ntproxy has shared-pool mode off
	id   uint64
	done chan struct{} // closed when ntproxy goes or the Proxy closes
}

func (a *attachment) alive() bool {
	select {
	case <-a.done:
		return false
	default:
		return true
	}
}

// AttachProxy attaches to the ntproxy serving on the Unix socket path.
// cfg configures this side of the memory link (SpinBudget matters; the
// fabric fields are ignored).
func AttachProxy(path string, cfg Config) (*Proxy, error) {
	name := "pid-" + strconv.Itoa(os.Getpid())
	if len(os.Args) > 0 {
		name = fmt.Sprintf("%s[%d]", baseName(os.Args[0]), os.Getpid())
	}
	p := &Proxy{path: path, cfg: cfg.engine(), name: name, nextPort: 1024, linkIdle: cmp.Or(cfg.DirectIdle, defaultLinkIdle)}
	if _, err := p.attachment(); err != nil {
		return nil, err
	}
	return p, nil
}

func baseName(s string) string {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '/' {
			return s[i+1:]
		}
	}
	return s
}

var (
	defaultOnce  sync.Once
	defaultProxy *Proxy
	defaultErr   error
)

// DefaultProxy returns the process's attachment to the ntproxy named by
// $NTSTACK_PROXY, attaching on first use.
func DefaultProxy() (*Proxy, error) {
	defaultOnce.Do(func() {
		path := os.Getenv(EnvProxy)
		if path == "" {
			defaultErr = fmt.Errorf("attached mode: $%s is not set (the path of ntproxy's socket)", EnvProxy)
			return
		}
		defaultProxy, defaultErr = AttachProxy(path, Config{})
		if defaultErr == nil {
			defaultProxy.pool = os.Getenv(EnvPool) == "1"
		}
	})
	return defaultProxy, defaultErr
}

// attachment returns the live attachment, attaching anew if the last one
// died.
func (p *Proxy) attachment() (*attachment, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, net.ErrClosed
	}
	if p.cur != nil && p.cur.alive() {
		return p.cur, nil
	}
	a, err := p.attachLocked()
	if err != nil {
		return nil, err
	}
	p.cur = a
	return a, nil
}

func (p *Proxy) attachLocked() (_ *attachment, err error) {
	fail := func(err error) error { return fmt.Errorf("attach to ntproxy at %s: %w", p.path, err) }
	uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: p.path, Net: "unix"})
	if err != nil {
		return nil, fail(fmt.Errorf("%w: %v", ErrProxyGone, err))
	}
	defer func() {
		if err != nil {
			uc.Close()
		}
	}()
	uc.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := uc.Write(appproto.Hello{Version: appproto.Version, Name: p.name}.Encode()); err != nil {
		return nil, fail(err)
	}
	buf := make([]byte, appproto.MaxDatagram)
	n, files, err := proc.RecvFiles(uc, buf, "ntproxy-link", "ntproxy-bell", "ntproxy-pool")
	if err != nil {
		return nil, fail(err)
	}
	for _, f := range files {
		defer f.Close() // the Device and the pool's mapping hold their own references
	}
	var f *os.File
	if len(files) > 0 {
		f = files[0]
	}
	w, err := appproto.DecodeWelcome(buf[:n])
	if err != nil {
		return nil, fail(err)
	}
	if w.Code != errcode.OK {
		return nil, fail(codeErr(w.Code, w.Message))
	}
	if f == nil || len(files) < 2 {
		return nil, fail(errors.New("welcome came without the memory link and its bell"))
	}
	dev, err := shm.OpenFile(f, fmt.Sprintf("app-%d", w.AppID), shm.Options{WindowSize: int(w.Window), Side: shm.Side1, HeartbeatTimeout: appproto.LinkHeartbeatTimeout,
		Bell: shm.Bell{Read: files[1]}})
	if err != nil {
		return nil, fail(err)
	}
	ep, err := transport.Attach(dev, p.cfg)
	if err != nil {
		dev.Close()
		return nil, fail(err)
	}
	ep.TakeDevice()
	a := &attachment{unix: uc, ep: ep, id: w.AppID, done: make(chan struct{})}
	if w.PoolSlots > 0 {
		if len(files) < 3 {
			ep.Close()
			return nil, fail(errors.New("welcome announced a shared pool but came without it"))
		}
		if a.pool, err = mapPool(files[2], int(w.PoolSlots), int(w.PoolRing)); err != nil {
			ep.Close()
			return nil, fail(err)
		}
	}
	uc.SetDeadline(time.Time{})
	if ln, err := ep.Listen(appproto.PortContinue); err == nil {
		go p.runContinue(ln) // ends with the attachment's endpoint
	}
	go a.runWatch()
	return a, nil
}

// runWatch waits for the attach socket to close (ntproxy went away, or
// Close) and then ends the attachment's connections.
func (a *attachment) runWatch() {
	var b [1]byte
	a.unix.Read(b[:])
	close(a.done)
	a.unix.Close()
	a.ep.CloseWith(ErrProxyGone)
	if a.pool != nil {
		a.pool.failAll(ErrProxyGone)
		a.pool.release(nil)
	}
}

// Close detaches: every connection and listener of the Proxy ends.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	a := p.cur
	p.mu.Unlock()
	p.retireLinks()
	if a != nil {
		if a.pool != nil {
			// Before ntproxy, seeing the socket close, resets them.
			a.pool.failAll(ErrProxyGone)
		}
		a.unix.Close()
		<-a.done
	}
	return nil
}

// dialOpts are a Dialer's per-connection choices.
type dialOpts struct {
	class      qos.Class
	direct     bool
	settle     bool // direct: fall back to proxy mode when refused for want of quota or of a direct path
	pool       bool // shared-pool mode, where ntproxy can
	transports []string
	cont       string // a direct link whose connection this one carries on (direct.go)
}

// dialAny is dial, in shared-pool mode if o.pool.
func (p *Proxy) dialAny(ctx context.Context, address string, o dialOpts) (*Conn, error) {
	if !o.pool || o.direct {
		return p.dial(ctx, address, o)
	}
	return p.dialOnce(ctx, address, o)
}

// dial dials address; with o.settle a direct dial refused for want of
// quota or of a direct path is dialed again in proxy mode.
func (p *Proxy) dial(ctx context.Context, address string, o dialOpts) (*Conn, error) {
	o.pool = false
	c, err := p.dialOnce(ctx, address, o)
	if err == nil || !o.direct || !o.settle || !(errors.Is(err, qos.ErrQuota) || errors.Is(err, errNoDirectPath)) {
		return c, err
	}
	o.direct = false
	c, perr := p.dialOnce(ctx, address, o)
	if perr != nil {
		return nil, perr
	}
	var oe *net.OpError
	why := err
	if errors.As(err, &oe) {
		why = oe.Err
	}
	c.route.Reason = fmt.Sprintf("direct mode refused (%v); through the proxies: %s", why, c.route.Reason)
	return c, nil
}

// dialOnce asks ntproxy for a connection to address in o's mode; in
// direct mode, a stream on a live direct link to address that carries no
// open connection if there is one, else (or if that is refused) a link
// of its own.
func (p *Proxy) dialOnce(ctx context.Context, address string, o dialOpts) (*Conn, error) {
	if o.direct && o.cont == "" {
		if l, k := p.reuse(address); l != nil {
			c, err := p.dialOn(ctx, address, o, l, k)
			if err == nil {
				return c, nil
			}
			l.retire()
			l.drop()
			if ctx.Err() != nil {
				return nil, err
			}
		}
	}
	return p.dialOn(ctx, address, o, nil, 0)
}

// dialOn is dialOnce, in direct mode as stream k of link l if l is set.
func (p *Proxy) dialOn(ctx context.Context, address string, o dialOpts, l *directLink, k int) (*Conn, error) {
	class, direct := o.class, o.direct
	opErr := func(err error) error { return &net.OpError{Op: "dial", Net: "ntb", Addr: strAddr(address), Err: err} }
	host, ps, err := net.SplitHostPort(address)
	port, perr := strconv.Atoi(ps)
	if err != nil || perr != nil || port < 1 || port > 65535 {
		return nil, opErr(fmt.Errorf("address %q: want host:port with port 1..65535", address))
	}
	a, err := p.attachment()
	if err != nil {
		return nil, opErr(err)
	}
	c, err := a.ep.DialContext(ctx, appproto.PortDial)
	if err != nil {
		return nil, opErr(err)
	}
	var reply appproto.DialReply
	req := appproto.DialRequest{Target: host, Port: port, Priority: int(class), Direct: direct, Early: direct && l == nil, Pool: o.pool && a.pool != nil, Transports: o.transports, Continue: o.cont}
	if l != nil {
		req.Reuse, req.Stream = l.name, k
	}
	err = exchange(ctx, c, req, &reply)
	if err == nil && reply.Code != errcode.OK {
		err = codeErr(reply.Code, reply.Error)
	}
	if err == nil && direct != (reply.Direct != nil) {
		err = fmt.Errorf("%w: direct mode asked %v, granted %v", ErrProxy, direct, reply.Direct != nil)
	}
	if err == nil && reply.Pool != nil && !o.pool {
		err = fmt.Errorf("%w: a pool slot granted unasked", ErrProxy)
	}
	if err == nil && reply.Pending && !req.Early {
		err = fmt.Errorf("%w: a pending reply to a dial that asked for none", ErrProxy)
	}
	if err == nil && l != nil && (reply.Direct.Name != l.name || reply.Direct.Stream != k) {
		err = fmt.Errorf("%w: stream %d of direct link %s asked, %+v granted", ErrProxy, k, l.name, *reply.Direct)
	}
	if err != nil {
		c.Close()
		return nil, opErr(err)
	}
	if reply.Pool != nil {
		pc, err := p.openPool(a, reply.Pool, c, reply.Local, reply.Remote, Route{Path: reply.Path, Mode: "proxy", Reason: reply.Reason})
		if err != nil {
			return nil, opErr(err)
		}
		return pc, nil
	}
	if o.pool && a.pool == nil {
		reply.Reason = "shared pool refused (ntproxy has shared-pool mode off); through the memory link: " + reply.Reason
	}
	local, remote, route := parseAddr(reply.Local), parseAddr(reply.Remote), Route{Path: reply.Path, Mode: "proxy", Reason: reply.Reason}
	if !direct {
		return newConn(c, local, remote, route), nil
	}
	// c stays open as the lease on the link until dc closes (and for
	// stream 0, as the link's, until the link closes).
	var dc *Conn
	switch {
	case l != nil:
		dc, err = p.dialStream(ctx, l, k, c)
	case reply.Pending && reply.Path == ctlapi.PathNTB:
		dc, err = p.startDirect(ctx, reply.Direct, c, address, class, Route{Path: reply.Path, Mode: "direct", Reason: reply.Reason})
	default:
		dc, err = p.openDirect(ctx, reply.Direct, 0, c, reply.Pending, address)
	}
	if err != nil {
		c.Close()
		return nil, opErr(err)
	}
	route.Mode = "direct"
	dc.local, dc.remote, dc.route = local, remote, route
	dc.d.start(address)
	return dc, nil
}

// openPool returns the connection of a granted pool slot; req, the
// request's connection on the memory link, has done its part.
func (p *Proxy) openPool(a *attachment, g *appproto.PoolGrant, req *transport.Conn, local, remote string, route Route) (*Conn, error) {
	req.Close()
	if a.pool == nil {
		return nil, fmt.Errorf("%w: a pool slot granted without a pool", ErrProxy)
	}
	l, r := parseAddr(local), parseAddr(remote)
	pc, err := a.pool.open(g.Slot, cmp.Or(p.cfg.SpinBudget, DefaultSpinBudget), l, r)
	if err != nil {
		return nil, err
	}
	route.Mode = "pool"
	return &Conn{pc: pc, local: l, remote: r, route: route}, nil
}

// exchange writes one request frame on c and reads the reply, within ctx.
func exchange(ctx context.Context, c *transport.Conn, req, reply any) error {
	return within(ctx, c, func() error {
		err := appproto.WriteFrame(c, req)
		if err == nil {
			err = appproto.ReadFrame(c, reply)
		}
		return err
	})
}

// await reads one reply frame from c, within ctx.
func await(ctx context.Context, c *transport.Conn, reply any) error {
	return within(ctx, c, func() error { return appproto.ReadFrame(c, reply) })
}

// within runs f, which reads and writes c, with c's deadline at ctx's.
func within(ctx context.Context, c *transport.Conn, f func() error) error {
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	err := f()
	if err != nil && ctx.Err() != nil {
		err = dialErr(ctx.Err())
	}
	c.SetDeadline(time.Time{})
	return err
}

// dialErr maps a context error as the standard library's dialer does.
func dialErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return os.ErrDeadlineExceeded
	}
	return err
}

type strAddr string

func (a strAddr) Network() string { return "ntb" }
func (a strAddr) String() string  { return string(a) }

func parseAddr(s string) Addr {
	host, ps, err := net.SplitHostPort(s)
	if err != nil {
		return Addr{Host: s}
	}
	port, _ := strconv.Atoi(ps)
	return Addr{Host: host, Port: port}
}

// proxyListener is a listener held by ntproxy on the application's behalf.
type proxyListener struct {
	p       *Proxy
	pool    bool
	acceptq chan *Conn
	done    chan struct{}
	once    sync.Once

	mu sync.Mutex
	// mu protects the following fields.
	addr Addr
	a    *attachment
	ln   *transport.Listener // on this side of the memory link
	req  *transport.Conn     // the listen request; closing it ends the listen
}

// listen listens on address's port through ntproxy, in shared-pool mode
// if pool.
func (p *Proxy) listen(address string, pool bool) (*proxyListener, error) {
	opErr := func(err error) error { return &net.OpError{Op: "listen", Net: "ntb", Addr: strAddr(address), Err: err} }
	_, ps, err := net.SplitHostPort(address)
	port, perr := strconv.Atoi(ps)
	if err != nil || perr != nil || port < 0 || port > 65535 {
		return nil, opErr(fmt.Errorf("address %q: want host:port with port 0..65535", address))
	}
	l := &proxyListener{p: p, pool: pool, acceptq: make(chan *Conn, 64), done: make(chan struct{}), addr: Addr{Port: port}}
	if err := l.register(); err != nil {
		return nil, opErr(err)
	}
	go l.runAccept()
	return l, nil
}

// register asks ntproxy for the listen on the current attachment.
func (l *proxyListener) register() (err error) {
	a, err := l.p.attachment()
	if err != nil {
		return err
	}
	l.p.mu.Lock()
	l.p.nextPort++
	if l.p.nextPort > 65535 {
		l.p.nextPort = 1025
	}
	appPort := l.p.nextPort
	l.p.mu.Unlock()
	ln, err := a.ep.Listen(appPort)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			ln.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := a.ep.DialContext(ctx, appproto.PortListen)
	if err != nil {
		return err
	}
	l.mu.Lock()
	port := l.addr.Port
	l.mu.Unlock()
	var reply appproto.ListenReply
	err = exchange(ctx, req, appproto.ListenRequest{Port: port, AppPort: appPort, Pool: l.pool && a.pool != nil}, &reply)
	if err == nil && reply.Code != errcode.OK {
		err = codeErr(reply.Code, reply.Error)
	}
	if err != nil {
		req.Close()
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.done: // closed meanwhile
		req.Close()
		return net.ErrClosed
	default:
	}
	l.addr = Addr{Host: "", Port: reply.Port}
	l.a, l.ln, l.req = a, ln, req
	return nil
}

// runAccept takes connections ntproxy hands over and, if ntproxy goes
// away, registers the listen again once it is back.
func (l *proxyListener) runAccept() {
	for {
		l.mu.Lock()
		ln, a := l.ln, l.a
		l.mu.Unlock()
		for {
			c, err := ln.AcceptConn()
			if err != nil {
				break
			}
			go l.introduce(a, c)
		}
		for backoff := 10 * time.Millisecond; ; backoff = min(2*backoff, time.Second) {
			select {
			case <-l.done:
				return
			case <-time.After(backoff):
			}
			if l.register() == nil {
				break
			}
		}
	}
}

// introduce reads the Incoming frame ntproxy sends first and queues c.
func (l *proxyListener) introduce(a *attachment, c *transport.Conn) {
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	var in appproto.Incoming
	if err := appproto.ReadFrame(c, &in); err != nil {
		c.Close()
		return
	}
	c.SetReadDeadline(time.Time{})
	if in.Pool != nil {
		pc, err := l.p.openPool(a, in.Pool, c, in.Local, in.Remote, Route{Path: in.Path, Mode: "proxy", Reason: in.Reason})
		if err != nil {
			return
		}
		select {
		case l.acceptq <- pc:
		case <-l.done:
			pc.Close()
		}
		return
	}
	local, remote, route := parseAddr(in.Local), parseAddr(in.Remote), Route{Path: in.Path, Mode: "proxy", Reason: in.Reason}
	conn := newConn(c, local, remote, route)
	if in.Direct != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var dc *Conn
		var err error
		if in.Direct.Stream == 0 && in.Path == ctlapi.PathNTB {
			dc, err = l.p.acceptStart(ctx, in.Direct, c, Route{Path: in.Path, Mode: "direct", Reason: in.Reason})
		} else {
			dc, err = l.p.openDirect(ctx, in.Direct, 1, c, false, "")
		}
		cancel()
		if err != nil {
			c.Close()
			return
		}
		route.Mode = "direct"
		dc.local, dc.remote, dc.route = local, remote, route
		dc.d.start("")
		conn = dc
	}
	select {
	case l.acceptq <- conn:
	case <-l.done:
		conn.Close()
	}
}

// accept waits for the next connection.
func (l *proxyListener) accept() (net.Conn, error) {
	select {
	case c := <-l.acceptq:
		return c, nil
	case <-l.done:
		return nil, &net.OpError{Op: "accept", Net: "ntb", Addr: l.addrNow(), Err: net.ErrClosed}
	}
}

// close stops listening; accepted connections carry on.
func (l *proxyListener) close() error {
	first := false
	l.once.Do(func() {
		first = true
		close(l.done)
		l.mu.Lock()
		req, ln := l.req, l.ln
		l.mu.Unlock()
		req.Close()
		ln.Close()
	})
	if !first {
		return &net.OpError{Op: "close", Net: "ntb", Addr: l.addrNow(), Err: net.ErrClosed}
	}
	for {
		select {
		case c := <-l.acceptq:
			c.Close()
		default:
			return nil
		}
	}
}

// addrNow is the listened address (its port is the one ntproxy allocated
// for a listen on port 0).
func (l *proxyListener) addrNow() net.Addr {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.addr
}
