package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ntstack/ntstack/internal/prim/accept"
	"github.com/ntstack/ntstack/internal/prim/spingate"
	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/appproto"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// Listen backlogs: the default and the most an application may ask for.
const (
	defaultBacklog = 128
	maxBacklog     = 4096
)

// listener is an application's listen: connections to port, from this
// host or any rack peer, are handed to the application's appPort.
type listener struct {
	app     *app
	port    int
	appPort int
	backlog int
	pool    bool          // hand rack connections over in shared-pool mode
	slots   chan struct{} // handoffs in progress, at most backlog
	req     *transport.Conn
	rack    []rackListener
	once    sync.Once
}

// serveListen carries out one ListenRequest and holds the listen until the
// application closes the request's connection.
func (s *Server) serveListen(a *app, c *transport.Conn) {
	c.SetDeadline(time.Now().Add(requestTimeout))
	var req appproto.ListenRequest
	if err := appproto.ReadFrame(c, &req); err != nil {
		s.logf("app %d: listen request: %v", a.id, err)
		c.Close()
		return
	}
	l, err := s.listen(a, c, req)
	if err != nil {
		appproto.WriteFrame(c, appproto.ListenReply{Code: ctlapi.CodeOf(err), Error: errMessage(err)})
		c.Close()
		return
	}
	c.SetDeadline(time.Time{})
	if err := appproto.WriteFrame(c, appproto.ListenReply{Port: l.port}); err != nil {
		s.unlisten(l)
		return
	}
	s.logf("app %d listens on port %d (backlog %d)", a.id, l.port, l.backlog)
	var b [1]byte
	_, err = c.Read(b[:]) // returns when the application closes the listener or goes
	s.logf("app %d: listen on port %d ends: %v", a.id, l.port, errOrEOF(err))
	s.unlisten(l)
}

func (s *Server) listen(a *app, c *transport.Conn, req appproto.ListenRequest) (_ *listener, err error) {
	if req.AppPort < 1 || req.AppPort > 65535 {
		return nil, ctlapi.Errorf(ctlapi.CodeBadRequest, "app port %d outside 1..65535", req.AppPort)
	}
	if req.Backlog < 0 || req.Backlog > maxBacklog {
		return nil, ctlapi.Errorf(ctlapi.CodeBadRequest, "backlog %d outside 0..%d", req.Backlog, maxBacklog)
	}
	if req.Backlog == 0 {
		req.Backlog = defaultBacklog
	}
	ctx, cancel := context.WithTimeout(s.ctx, requestTimeout)
	defer cancel()
	port, err := s.ctl.Reserve(ctx, ctlapi.ListenRequest{UID: a.cred.UID, PID: a.cred.PID, Port: req.Port})
	if err != nil {
		return nil, err
	}
	l := &listener{app: a, port: port, appPort: req.AppPort, backlog: req.Backlog, pool: req.Pool, slots: make(chan struct{}, req.Backlog), req: c}
	defer func() {
		if err != nil {
			l.closeRack()
			s.ctl.Release(context.Background(), port)
		}
	}()
	for _, link := range s.links {
		ln, err := link.ep.Listen(port)
		if err != nil {
			return nil, ctlapi.Errorf(ctlapi.CodePortInUse, "listen on port %d of link %s: %v", port, link.peer.Link, err)
		}
		l.rack = append(l.rack, rackListener{link, ln})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if a.gone {
		return nil, ctlapi.Errorf(ctlapi.CodeUnavail, "application detached")
	}
	if prev := s.listeners[port]; prev != nil {
		return nil, ctlapi.Errorf(ctlapi.CodePortInUse, "port %d is listened on by pid %d", port, prev.app.cred.PID)
	}
	s.listeners[port] = l
	a.lns[port] = l
	for _, r := range l.rack {
		s.wg.Add(1)
		go s.runRackAccept(l, r.link, r.ln)
	}
	return l, nil
}

// rackListener is a listener's socket on one rack link.
type rackListener struct {
	link *rackLink
	ln   *transport.Listener
}

func (l *listener) closeRack() {
	for _, r := range l.rack {
		r.ln.Close()
	}
}

// unlisten ends l: no new connections; established ones carry on.
func (s *Server) unlisten(l *listener) {
	l.once.Do(func() {
		s.mu.Lock()
		if s.listeners[l.port] == l {
			delete(s.listeners, l.port)
		}
		delete(l.app.lns, l.port)
		s.mu.Unlock()
		l.closeRack()
		l.req.Close()
		s.ctl.Release(context.Background(), l.port)
		s.logf("app %d stopped listening on port %d", l.app.id, l.port)
	})
}

// listenerOn returns the listener of port, or nil.
func (s *Server) listenerOn(port int) *listener {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listeners[port]
}

// handoff opens a connection to l's application and introduces it.
func (s *Server) handoff(ctx context.Context, l *listener, in appproto.Incoming, pc *pconn) (*transport.Conn, error) {
	select {
	case l.slots <- struct{}{}:
	default:
		return nil, ctlapi.Errorf(ctlapi.CodeRefused, "listener on port %d has its backlog of %d connections pending", l.port, l.backlog)
	}
	defer func() { <-l.slots }()
	ac, err := l.app.ep.DialContext(ctx, l.appPort)
	if err != nil {
		return nil, ctlapi.Errorf(ctlapi.CodeRefused, "the application listening on port %d is not accepting: %v", l.port, err)
	}
	if err := appproto.WriteFrame(ac, in); err != nil {
		ac.Close()
		return nil, errIntroduce{ctlapi.Errorf(ctlapi.CodeRefused, "introduce connection to the application on port %d: %v", l.port, err)}
	}
	pc.peerApp = l.app
	return ac, nil
}

// errIntroduce is a handoff that failed while the application may have
// been told of the connection (its Incoming written, perhaps in part).
type errIntroduce struct{ error }

func (e errIntroduce) Unwrap() error { return e.error }

// runRackAccept takes l's connections from one rack peer.
func (s *Server) runRackAccept(l *listener, link *rackLink, ln *transport.Listener) {
	defer s.wg.Done()
	for {
		fc, err := ln.AcceptConn()
		if err != nil {
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveRack(l, link, fc)
		}()
	}
}

// serveRack admits a connection from a rack peer's proxy over the NTB link
// and hands it to the listening application.
func (s *Server) serveRack(l *listener, link *rackLink, fc *transport.Conn) {
	s.serveInbound(fc, inbound{
		from: link.peer.Host, listener: l, path: ctlapi.PathNTB, link: link.peer.Link,
		partition: fc.Partition(), remotePort: fc.RemoteAddr().(transport.Addr).Port,
		via: "over NTB link " + link.peer.Link,
	})
}

// inbound describes where a connection from another host's proxy came in.
type inbound struct {
	from       string    // the peer it must come from ("": any peer, checked)
	listener   *listener // the listener it arrived for (nil: by its port)
	path, link string
	partition  int
	remotePort int
	via        string
	opened     func() // if set, called once the peer's open has arrived
}

// serveInbound reads the RackOpen a peer's proxy sends first, admits the
// connection and hands it to the listening application.
func (s *Server) serveInbound(fc net.Conn, in inbound) {
	fc.SetDeadline(time.Now().Add(requestTimeout))
	var open appproto.RackOpen
	if err := appproto.ReadFrame(fc, &open); err != nil {
		s.logf("inbound %s: open from peer: %v", in.via, err)
		fc.Close()
		return
	}
	if in.opened != nil {
		in.opened()
	}
	refuse := func(err error) {
		s.logf("inbound %s: refused %s -> port %d: %v", in.via, open.From, open.Port, err)
		appproto.WriteFrame(fc, appproto.DialReply{Code: ctlapi.CodeOf(err), Error: errMessage(err)})
		fc.Close()
	}
	if open.Resume != 0 {
		s.mu.Lock()
		lg := s.legs[legKey{open.From, open.Resume}]
		s.mu.Unlock()
		switch {
		case in.from != "" && open.From != in.from:
			refuse(ctlapi.Errorf(ctlapi.CodeBadRequest, "resume from %q arrived %s, which leads to %s", open.From, in.via, in.from))
		case lg == nil || !lg.resumes(open.From, open.Secret):
			// One answer for a leg that is not there and a wrong secret:
			// the refusal tells a guesser nothing, and lg is not touched.
			refuse(ctlapi.Errorf(ctlapi.CodeRefused, "no connection %s/%d to resume", open.From, open.Resume))
		default:
			if err := lg.accept(fc, in.path, open.RxSeq); err != nil {
				refuse(err)
			}
		}
		return
	}
	if open.Continue != "" {
		s.serveContinue(fc, open, in, refuse)
		return
	}
	l := in.listener
	switch {
	case in.from != "" && open.From != in.from:
		refuse(ctlapi.Errorf(ctlapi.CodeBadRequest, "open from %q arrived %s, which leads to %s", open.From, in.via, in.from))
		return
	case l != nil && open.Port != l.port:
		refuse(ctlapi.Errorf(ctlapi.CodeBadRequest, "open for port %d arrived on the listener of port %d", open.Port, l.port))
		return
	case l == nil:
		if l = s.listenerOn(open.Port); l == nil {
			refuse(ctlapi.Errorf(ctlapi.CodeRefused, "nobody listens on %s", hostPort(s.cfg.Host, open.Port)))
			return
		}
	}
	ctx, cancel := context.WithTimeout(s.ctx, dialTimeout)
	defer cancel()
	// Admit also refuses a host that is not a configured peer.
	if err := s.ctl.Admit(ctx, ctlapi.AdmitRequest{Peer: open.From, Port: l.port}); err != nil {
		refuse(err)
		return
	}
	pc := &pconn{
		id: s.nextID.Add(1), dir: "in", path: in.path, link: in.link, partition: in.partition,
		reason: fmt.Sprintf("from %s %s", open.From, in.via),
		local:  hostPort(s.cfg.Host, l.port),
		remote: hostPort(open.From, in.remotePort),
	}
	if open.Direct != "" {
		if in.path != ctlapi.PathNTB {
			refuse(ctlapi.Errorf(ctlapi.CodeBadRequest, "direct mode needs an NTB link, not %s", in.path))
			return
		}
		s.serveRackDirect(fc, open, l, pc, refuse)
		return
	}
	if open.Token == 0 {
		refuse(ctlapi.Errorf(ctlapi.CodeBadRequest, "open from %s without a token", open.From))
		return
	}
	if len(open.Secret) != legSecretLen {
		refuse(ctlapi.Errorf(ctlapi.CodeBadRequest, "open from %s with a %d-byte resume secret, want %d", open.From, len(open.Secret), legSecretLen))
		return
	}
	pc.secret = open.Secret
	incoming := appproto.Incoming{Local: pc.local, Remote: pc.remote, Path: pc.path}
	if l.pool {
		s.tryPool(l.app, pc)
		if pc.slot != nil {
			incoming.Pool = &appproto.PoolGrant{Slot: pc.slot.index}
		}
	}
	incoming.Reason = pc.reason
	ac, err := s.handoff(ctx, l, incoming, pc)
	if err != nil {
		if errors.As(err, new(errIntroduce)) {
			pc.abandonSlot(s, l.app) // the application may hold it
		} else {
			pc.dropSlot() // never named to the application
		}
		refuse(err)
		return
	}
	fc.SetDeadline(time.Time{})
	if err := appproto.WriteFrame(fc, appproto.DialReply{Local: pc.remote, Remote: pc.local, Path: pc.path, Window: pc.rxWindow(), Frame: legMaxPayload}); err != nil {
		pc.abandonSlot(s, l.app)
		ac.Close()
		fc.Close()
		return
	}
	peer, _ := s.cfg.Peer(open.From)
	s.runLeg(l.app, s.newLeg(pc, ac, peer, legKey{open.From, open.Token}, false, fc, in.path, legLimits{open.Window, open.Frame}))
}

// authenticate runs the server side of the TLS handshake on a connection
// to the TCP fallback listener, bounded by requestTimeout, and returns the
// connection to serve with the peer host its certificate proved; an RDMA
// connection's bootstrap has been authenticated by the provider
// (rdma.Config.Auth), which names the peer. Without a host key
// (auth.insecure) it returns c as it is and no host: the open names one.
// A connection that fails authentication is closed and nil returned; it
// never reaches a leg.
func (s *Server) authenticate(c net.Conn, path string) (net.Conn, string) {
	if s.auth == nil {
		return c, ""
	}
	if path == ctlapi.PathRDMA {
		var peer string
		if rc, ok := c.(interface{ Peer() string }); ok {
			peer = rc.Peer()
		}
		if peer == "" {
			s.logf("inbound over RDMA from %s: refused: the RDMA provider does not authenticate its bootstrap (rdma.Config.Auth)", c.RemoteAddr())
			c.Close()
			return nil, ""
		}
		return c, peer
	}
	c.SetDeadline(time.Now().Add(requestTimeout))
	tc, host, err := s.auth.Server(c)
	if err != nil {
		s.logf("inbound over TCP from %s: refused: %v", c.RemoteAddr(), err)
		c.Close()
		return nil, ""
	}
	return tc, host
}

// serveFallback takes connections from peers' proxies on ln, a listener
// of the TCP fallback or of the RDMA provider (path), until ln or the
// Server closes. Accept errors are retried with backoff, never returned;
// each remote IP has at most maxPendingPerIP connections whose open has
// not arrived (bounded by requestTimeout).
func (s *Server) serveFallback(ln net.Listener, path string) error {
	if !s.track(ln) {
		ln.Close()
		return net.ErrClosed
	}
	what := fmt.Sprintf("%s listener %s", path, ln.Addr())
	retry := accept.Retry{What: what, Logf: s.logf}
	pending := accept.NewLimiter(what, maxPendingPerIP, s.logf)
	for {
		c, ok := accept.Next(&retry, s.ctx.Done(), ln.Accept)
		if !ok {
			return nil
		}
		if path == ctlapi.PathTCP {
			spingate.Sockets() // a leg's data now waits in the poller too
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
		port := 0
		if _, p, err := net.SplitHostPort(c.RemoteAddr().String()); err == nil {
			port, _ = strconv.Atoi(p)
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer release()
			in := inbound{path: path, partition: -1, remotePort: port, via: fmt.Sprintf("over %s from %s", strings.ToUpper(path), c.RemoteAddr()), opened: release}
			if c, in.from = s.authenticate(c, path); c != nil {
				s.serveInbound(c, in)
			}
		}()
	}
}
