package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/prim/spingate"
	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/appproto"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/ntb/shm"
)

// app is an attached application.
type app struct {
	id     uint64
	cred   proc.Cred
	name   string
	unix   *net.UnixConn
	memfd  *os.File
	dev    *shm.Device
	ep     *transport.Endpoint
	svc    map[int]*transport.Listener // on ep: the service ports, listening before the Welcome
	pool   *appPool                    // its shared buffer pool (nil: shared-pool mode off)
	memory int64                       // bytes of shared memory granted: its link and direct links
	direct int64                       // bytes of direct links, against proxy.direct_quota
	wg     sync.WaitGroup              // its request and splice goroutines

	// Guarded by Server.mu.
	conns map[uint64]*pconn
	lns   map[int]*listener
	gone  bool
}

// linkBytes is the shared memory a memory link of window bytes per side
// takes: two windows and a page of registers and header.
func linkBytes(window int) int64 { return int64(2*window + 4096) }

// runApp attaches the application on c and serves it until it goes;
// identified ends c's pending time once the attach exchange is over.
func (s *Server) runApp(c *net.UnixConn, identified func()) {
	a, err := s.attach(c)
	identified()
	if err != nil {
		s.logf("attach refused: %v", err)
		c.Close()
		return
	}
	s.logf("app %d (%s, pid %d, uid %d) attached", a.id, a.name, a.cred.PID, a.cred.UID)
	for port, ln := range a.svc {
		a.wg.Add(1)
		go s.runService(a, ln, port)
	}
	// The socket carries nothing after the Welcome: a byte, EOF or an
	// error all mean the application is gone (or broke the protocol).
	var b [1]byte
	_, err = c.Read(b[:])
	s.logf("app %d detached: %v", a.id, errOrEOF(err))
	s.detach(a)
}

func errOrEOF(err error) error {
	if err == nil {
		return errors.New("unexpected data on the attach socket")
	}
	return err
}

// attach runs the Hello/Welcome exchange and sets up the memory link.
func (s *Server) attach(c *net.UnixConn) (_ *app, err error) {
	cred, err := proc.PeerCred(c)
	if err != nil {
		return nil, err
	}
	refuse := func(code ctlapi.Code, format string, args ...any) error {
		e := ctlapi.Errorf(code, format, args...)
		c.Write(appproto.Welcome{Version: appproto.Version, Code: code, Message: e.Message}.Encode())
		return fmt.Errorf("pid %d uid %d: %w", cred.PID, cred.UID, e)
	}
	c.SetDeadline(time.Now().Add(helloTimeout))
	buf := make([]byte, appproto.MaxDatagram)
	n, err := c.Read(buf)
	if err != nil {
		return nil, fmt.Errorf("pid %d: read hello: %w", cred.PID, err)
	}
	h, err := appproto.DecodeHello(buf[:n])
	if err != nil {
		return nil, refuse(ctlapi.CodeBadRequest, "%v", err)
	}
	if h.Version != appproto.Version {
		return nil, refuse(ctlapi.CodeVersion, "application speaks attach protocol %d, ntproxy %d", h.Version, appproto.Version)
	}
	a := &app{
		id:     s.nextID.Add(1),
		cred:   cred,
		name:   h.Name,
		unix:   c,
		memory: linkBytes(s.cfg.Proxy.AppWindow),
		conns:  map[uint64]*pconn{},
		lns:    map[int]*listener{},
	}
	defer func() {
		if err != nil {
			a.release()
		}
	}()
	// Over quota, refused before any memory is made; register checks
	// again, with the table, for attaches racing this one.
	s.mu.Lock()
	err = s.chargeLocked(cred.UID, a.memory, "a memory link")
	s.mu.Unlock()
	if err != nil {
		return nil, refuse(ctlapi.CodeOf(err), "%s", errMessage(err))
	}
	if a.memfd, err = shm.NewMemLink(fmt.Sprintf("app-%d", a.id)); err != nil {
		return nil, refuse(ctlapi.CodeInternal, "%v", err)
	}
	// The application sleeps reading a pipe, which this end rings: in the
	// runtime's poller, so its sleeping link holds no P that its other
	// goroutines (a direct link's session, its sockets) wait for, as a
	// futex wait would. This end waits by futex (its goroutines spin).
	bellRead, bellRing, err := os.Pipe()
	if err != nil {
		return nil, refuse(ctlapi.CodeInternal, "doorbell pipe: %v", err)
	}
	defer bellRead.Close()
	defer bellRing.Close()
	o := shm.Options{WindowSize: s.cfg.Proxy.AppWindow, Side: shm.Side0, HeartbeatTimeout: appproto.LinkHeartbeatTimeout, Bell: shm.Bell{Ring: bellRing}}
	if a.dev, err = shm.OpenFile(a.memfd, fmt.Sprintf("app-%d", a.id), o); err != nil {
		return nil, refuse(ctlapi.CodeInternal, "%v", err)
	}
	// Sized now: the application must not shrink it under our mapping.
	if err := proc.SealSize(a.memfd); err != nil {
		return nil, refuse(ctlapi.CodeInternal, "%v", err)
	}
	if a.ep, err = transport.Attach(a.dev, s.appCfg); err != nil {
		return nil, refuse(ctlapi.CodeInternal, "%v", err)
	}
	// The service ports listen before the Welcome: the application may
	// dial them as soon as it has it.
	a.svc = map[int]*transport.Listener{}
	for _, port := range []int{appproto.PortDial, appproto.PortListen} {
		if a.svc[port], err = a.ep.Listen(port); err != nil {
			return nil, refuse(ctlapi.CodeInternal, "listen on service port %d: %v", port, err)
		}
	}
	files := []*os.File{a.memfd, bellRead}
	w := appproto.Welcome{Version: appproto.Version, AppID: a.id, Window: uint32(s.cfg.Proxy.AppWindow)}
	if s.cfg.Proxy.PoolSlots > 0 {
		if a.pool, err = newAppPool(fmt.Sprintf("app-%d-pool", a.id), s.cfg.Proxy.PoolSlots, s.cfg.Proxy.PoolRing, s.poolPoller); err != nil {
			return nil, refuse(ctlapi.CodeInternal, "%v", err)
		}
		files = append(files, a.pool.f)
		w.PoolSlots, w.PoolRing = uint32(s.cfg.Proxy.PoolSlots), uint32(s.cfg.Proxy.PoolRing)
	}
	if err := s.register(a); err != nil {
		return nil, refuse(ctlapi.CodeOf(err), "%s", errMessage(err))
	}
	if err := proc.SendFiles(c, w.Encode(), files...); err != nil {
		s.unregister(a)
		return nil, err
	}
	c.SetDeadline(time.Time{})
	return a, nil
}

// register adds a to the table, within its user's quota.
func (s *Server) register(a *app) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ctlapi.Errorf(ctlapi.CodeUnavail, "ntproxy is shutting down")
	}
	n := 0
	for _, b := range s.apps {
		if b.cred.UID == a.cred.UID {
			n++
		}
	}
	if n >= s.cfg.Proxy.MaxAppsPerUID {
		return ctlapi.Errorf(ctlapi.CodeQuota, "uid %d has %d applications attached, the limit (proxy.max_apps_per_uid)", a.cred.UID, n)
	}
	if err := s.chargeLocked(a.cred.UID, a.memory, "a memory link"); err != nil {
		return err
	}
	s.apps[a.id] = a
	return nil
}

// chargeLocked checks that uid's applications may be granted cost more
// bytes of window memory (what for, in words) within quota.memory. The
// caller adds cost to an app's memory under the same hold of s.mu.
func (s *Server) chargeLocked(uid int, cost int64, what string) error {
	limit := s.cfg.Quota.MemoryOf(uid)
	if limit == config.NoLimit {
		return nil
	}
	var used int64
	for _, b := range s.apps {
		if b.cred.UID == uid {
			used += b.memory
		}
	}
	if used+cost > limit {
		return ctlapi.Errorf(ctlapi.CodeQuota, "%s of %d bytes would bring uid %d's window memory to %d bytes, over its quota of %d (quota.memory)", what, cost, uid, used+cost, limit)
	}
	return nil
}

func (s *Server) unregister(a *app) {
	s.mu.Lock()
	delete(s.apps, a.id)
	s.mu.Unlock()
}

// release frees what attach set up.
func (a *app) release() error {
	if a.ep != nil {
		a.ep.Close()
	}
	if a.dev != nil {
		a.dev.Close()
	}
	if a.memfd != nil {
		a.memfd.Close()
	}
	if a.pool != nil {
		return a.pool.close()
	}
	return nil
}

// detach closes everything of a's and frees its memory link.
func (s *Server) detach(a *app) {
	s.mu.Lock()
	if a.gone {
		s.mu.Unlock()
		return
	}
	a.gone = true
	delete(s.apps, a.id)
	lns := make([]*listener, 0, len(a.lns))
	for _, l := range a.lns {
		lns = append(lns, l)
	}
	conns := make([]*pconn, 0, len(a.conns))
	for _, pc := range a.conns {
		conns = append(conns, pc)
	}
	s.mu.Unlock()
	for _, l := range lns {
		s.unlisten(l)
	}
	for _, pc := range conns {
		pc.close()
	}
	if a.pool != nil {
		a.pool.kickAll() // slots held for the application's close take a.gone instead
	}
	a.unix.Close()
	a.ep.Close() // ends the service goroutines' Accept; nothing touches the link after
	a.wg.Wait()
	if err := a.release(); err != nil {
		s.logf("app %d: %v", a.id, err)
	}
}

// runService accepts requests on one of the proxy's service ports.
func (s *Server) runService(a *app, ln *transport.Listener, port int) {
	defer a.wg.Done()
	for {
		c, err := ln.AcceptConn()
		if err != nil {
			return
		}
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			switch port {
			case appproto.PortDial:
				s.serveDial(a, c)
			case appproto.PortListen:
				s.serveListen(a, c)
			}
		}()
	}
}

// serveDial carries out one DialRequest and then the connection.
func (s *Server) serveDial(a *app, c *transport.Conn) {
	c.SetDeadline(time.Now().Add(requestTimeout))
	var req appproto.DialRequest
	if err := appproto.ReadFrame(c, &req); err != nil {
		s.logf("app %d: dial request: %v", a.id, err)
		c.Close()
		return
	}
	if req.Direct {
		s.serveDirect(a, c, req)
		return
	}
	if req.Continue != "" && !s.holdsDirect(a, req.Continue) {
		appproto.WriteFrame(c, appproto.DialReply{Code: ctlapi.CodeBadRequest, Error: fmt.Sprintf("app %d holds no direct link %q to continue", a.id, req.Continue)})
		c.Close()
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, dialTimeout)
	pc, other, err := s.dial(ctx, a, req)
	cancel()
	if err != nil {
		appproto.WriteFrame(c, appproto.DialReply{Code: ctlapi.CodeOf(err), Error: errMessage(err)})
		c.Close()
		return
	}
	c.SetDeadline(time.Time{})
	reply := appproto.DialReply{Local: pc.local, Remote: pc.remote, Path: pc.path, Reason: pc.reason}
	if pc.slot != nil {
		reply.Pool = &appproto.PoolGrant{Slot: pc.slot.index}
	}
	if err := appproto.WriteFrame(c, reply); err != nil {
		pc.abandonSlot(s, a)
		other.Close()
		c.Close()
		return
	}
	if pc.leggy() {
		peer, _ := s.cfg.Peer(hostOf(pc.remote))
		s.runLeg(a, s.newLeg(pc, c, peer, legKey{s.cfg.Host, pc.id}, true, other, pc.path, pc.peerLim))
		return
	}
	s.splice(a, pc, c, other)
}

func hostOf(hostport string) string {
	h, _, _ := net.SplitHostPort(hostport)
	return h
}

func errMessage(err error) string {
	var e *ctlapi.Error
	if errors.As(err, &e) {
		return e.Message
	}
	return err.Error()
}

// dial connects a's request to its destination and returns the proxied
// connection's record and the far side's connection.
func (s *Server) dial(ctx context.Context, a *app, req appproto.DialRequest) (_ *pconn, _ net.Conn, err error) {
	class, err := validClass(req.Priority)
	if err != nil {
		return nil, nil, err
	}
	if req.Port < 1 || req.Port > 65535 {
		return nil, nil, ctlapi.Errorf(ctlapi.CodeBadRequest, "port %d outside 1..65535", req.Port)
	}
	route, err := s.ctl.Resolve(ctx, ctlapi.ResolveRequest{UID: a.cred.UID, Target: req.Target, Port: req.Port, Transports: req.Transports})
	if err != nil {
		return nil, nil, err
	}
	picked := route.Path
	if route, err = s.followLink(ctx, route); err != nil {
		s.logf("dial %s:%d: %v", route.Host, req.Port, err)
		return nil, nil, err
	}
	pc := &pconn{id: s.nextID.Add(1), app: a.id, dir: "out", path: route.Path, reason: route.Reason, link: route.Link, partition: -1, hops: route.Hops, cont: req.Continue}
	if pc.secret, err = newLegSecret(); err != nil {
		return nil, nil, ctlapi.Errorf(ctlapi.CodeInternal, "resume secret: %v", err)
	}
	pc.remote = hostPort(route.Host, req.Port)
	if pc.cont != "" {
		pc.reason = continueReason(pc.cont, pc.reason)
		defer func() {
			if err == nil {
				s.logf("connection %d: direct link %s continues through the proxies over %s", pc.id, pc.cont, pc.path)
			}
		}()
	}
	if route.Path != picked {
		s.logf("connection %d to %s: %s", pc.id, route.Host, route.Reason)
	}
	if req.Pool {
		s.tryPool(a, pc)
		defer func() {
			if err != nil {
				pc.dropSlot()
			}
		}()
	}
	switch route.Path {
	case ctlapi.PathSHM:
		pc.local = hostPort(s.cfg.Host, int(pc.id%50000)+10000)
		l := s.listenerOn(req.Port)
		if l == nil {
			return nil, nil, ctlapi.Errorf(ctlapi.CodeRefused, "nobody listens on %s", pc.remote)
		}
		other, err := s.handoff(ctx, l, appproto.Incoming{Local: pc.remote, Remote: pc.local, Path: route.Path, Reason: route.Reason}, pc)
		return pc, other, err
	case ctlapi.PathNTB:
		link := s.links[route.Host]
		if link == nil {
			return nil, nil, ctlapi.Errorf(ctlapi.CodeNoPath, "ntmon routes %s over NTB link %s, which this ntproxy does not have", route.Host, route.Link)
		}
		fc, err := dialNTB(ctx, link, req.Port, class)
		if err != nil {
			next, ok := passNTB(route, err.Error())
			if !linkFailed(err) || !ok {
				return nil, nil, fabricErr(route.Host, req.Port, err)
			}
			pc.path, pc.reason, pc.link = next.Path, next.Reason, ""
			s.logf("connection %d to %s: %s", pc.id, route.Host, next.Reason)
			return s.dialOffRackOpen(ctx, next, pc, req.Port)
		}
		pc.partition = fc.Partition()
		if pc.peerLim, err = s.rackOpen(fc, route.Host, pc.rackOpen(req.Port)); err != nil {
			fc.Close()
			return nil, nil, err
		}
		pc.local = hostPort(s.cfg.Host, fc.LocalAddr().(transport.Addr).Port)
		return pc, fc, nil
	case ctlapi.PathRDMA, ctlapi.PathTCP:
		return s.dialOffRackOpen(ctx, route, pc, req.Port)
	default:
		return nil, nil, ctlapi.Errorf(ctlapi.CodeNoPath, "%s is reachable only over %s (%s), which this ntproxy does not speak", route.Host, route.Path, route.Reason)
	}
}

// dialOffRackOpen connects pc to port of route's host over route's path,
// RDMA or TCP (dialOffRack), and opens the connection there.
func (s *Server) dialOffRackOpen(ctx context.Context, route ctlapi.Route, pc *pconn, port int) (*pconn, net.Conn, error) {
	c, err := s.dialOffRack(ctx, route, pc)
	if err != nil {
		return nil, nil, err
	}
	pc.local = c.LocalAddr().String()
	if pc.peerLim, err = s.rackOpen(c, route.Host, pc.rackOpen(port)); err != nil {
		c.Close()
		return nil, nil, err
	}
	return pc, c, nil
}

// dialOffRack connects to the peer proxy's listener on route's path, RDMA
// or TCP; if that fails it tries the route's later off-rack hops (RDMA
// before TCP), noting in pc why it took the one it took.
func (s *Server) dialOffRack(ctx context.Context, route ctlapi.Route, pc *pconn) (net.Conn, error) {
	start := slices.IndexFunc(route.Hops, func(h ctlapi.Hop) bool { return h.Path == route.Path })
	hops := []ctlapi.Hop{{Path: route.Path, Addr: route.Addr}}
	if start >= 0 {
		hops = append(hops, route.Hops[start+1:]...)
	}
	var failed []string
	for _, h := range hops {
		if h.Path == ctlapi.PathNTB {
			continue
		}
		c, err := s.connect(ctx, route.Host, h)
		if err != nil {
			failed = append(failed, fmt.Sprintf("%s to %s failed: %v", h.Path, h.Addr, err))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		if len(failed) > 0 {
			pc.path = h.Path
			pc.reason = fmt.Sprintf("%s; %s: %s %s", route.Reason, strings.Join(failed, "; "), strings.ToUpper(h.Path), h.Addr)
			s.logf("connection %d to %s: %s", pc.id, route.Host, pc.reason)
		}
		return c, nil
	}
	return nil, ctlapi.Errorf(ctlapi.CodeNoPath, "connect to %s: %s", route.Host, strings.Join(failed, "; "))
}

// connect opens a transport to host's proxy at its RDMA or TCP listener.
// Over TCP, with a host key, the transport is TLS 1.3 authenticated both
// ways: the far end must prove to be host, and it learns this host from
// its certificate.
func (s *Server) connect(ctx context.Context, host string, h ctlapi.Hop) (net.Conn, error) {
	switch h.Path {
	case ctlapi.PathRDMA:
		if s.rdma == nil {
			return nil, errors.New("this ntproxy has no RDMA provider (built without -tags verbs, or proxy.rdma unusable; ntproxy's log says which)")
		}
		return s.rdma.DialHost(ctx, h.Addr, host)
	case ctlapi.PathTCP:
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", h.Addr)
		if err == nil {
			spingate.Sockets() // a leg's data now waits in the poller too
		}
		if err != nil || s.auth == nil {
			return c, err
		}
		tc := tls.Client(c, s.auth.ClientConfig(host))
		if err := tc.HandshakeContext(ctx); err != nil {
			c.Close()
			return nil, fmt.Errorf("tls handshake with %s: %w", host, err)
		}
		return tc, nil
	}
	return nil, fmt.Errorf("no transport %q", h.Path)
}

// rackOpen is the RackOpen of pc's leg to port: it takes frames up to
// legMaxPayload.
func (pc *pconn) rackOpen(port int) appproto.RackOpen {
	return appproto.RackOpen{Port: port, Token: pc.id, Window: pc.rxWindow(), Frame: legMaxPayload, Secret: pc.secret, Continue: pc.cont}
}

// rackOpen introduces a connection (open, From filled in here) to the peer
// proxy at its far end and waits for its verdict; it returns what the
// peer said of its leg's window and frames.
func (s *Server) rackOpen(c net.Conn, host string, open appproto.RackOpen) (legLimits, error) {
	return s.rackOpenThen(c, host, open, nil)
}

// rackOpenThen is rackOpen that calls sent, if set, once the open is on
// its way: what it does overlaps the far side's work. Its error ends the
// open.
func (s *Server) rackOpenThen(c net.Conn, host string, open appproto.RackOpen, sent func() error) (legLimits, error) {
	open.From = s.cfg.Host
	port := open.Port
	c.SetDeadline(time.Now().Add(requestTimeout))
	var reply appproto.DialReply
	err := appproto.WriteFrame(c, open)
	if err == nil && sent != nil {
		if err = sent(); err != nil {
			return legLimits{}, err
		}
	}
	if err == nil {
		err = appproto.ReadFrame(c, &reply)
	}
	if err == nil && reply.Code != ctlapi.OK {
		err = &ctlapi.Error{Code: reply.Code, Message: fmt.Sprintf("%s: %s", host, reply.Error)}
	}
	if err != nil {
		return legLimits{}, fabricErr(host, port, err)
	}
	c.SetDeadline(time.Time{})
	return legLimits{reply.Window, reply.Frame}, nil
}

// fabricErr gives a failed connect over a rack link its code.
func fabricErr(host string, port int, err error) error {
	var e *ctlapi.Error
	switch {
	case errors.As(err, &e):
		return err
	case errors.Is(err, syscall.ECONNREFUSED):
		return ctlapi.Errorf(ctlapi.CodeRefused, "nobody listens on %s: %v", hostPort(host, port), err)
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded):
		return ctlapi.Errorf(ctlapi.CodeTimeout, "connect to %s: %v", hostPort(host, port), err)
	case errors.Is(err, transport.ErrLinkDown):
		return ctlapi.Errorf(ctlapi.CodeNoPath, "connect to %s: %v", hostPort(host, port), err)
	}
	return ctlapi.Errorf(ctlapi.CodeInternal, "connect to %s: %v", hostPort(host, port), err)
}

// Snapshot helpers need the app table under the lock.
func (s *Server) appStats() []ctlapi.AppStat {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]ctlapi.AppStat, 0, len(s.apps))
	for _, a := range s.apps {
		mem := a.memory
		if a.pool != nil {
			mem += a.pool.inUse()
		}
		out = append(out, ctlapi.AppStat{ID: a.id, PID: a.cred.PID, UID: a.cred.UID, Name: a.name, Conns: len(a.conns), Memory: mem})
	}
	return out
}
