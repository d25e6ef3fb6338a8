package proxy

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/appproto"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/ntb/shm"
)

// Direct mode. The two applications of a connection get a link of their
// own — a window slice — and exchange data without either proxy: zero
// copies in the proxies, no proxy hops. The proxies still decide (route,
// ACL, admission, quota) and keep a lease: the request's connection from
// each application stays open for the life of the direct connection, and
// its closing (or the application's death) ends the grant.
//
// In the emulated fabric a slice is a link file in the fabric directory
// that both hosts see; on NTB hardware it would be a range of the window
// mapped for the application through the proxy's VFIO device.

// directPrefix starts every direct link's name.
const directPrefix = "direct-"

// serveDirect carries out a DialRequest with Direct set: c is the
// request's connection, kept as the lease. With req.Early the grant goes
// out on c as soon as it is made (a Pending reply), so that the
// application attaches its end of the link while the far side is brought
// in; the reply that follows is the verdict.
func (s *Server) serveDirect(a *app, c *transport.Conn, req appproto.DialRequest) {
	ctx, cancel := context.WithTimeout(s.ctx, dialTimeout)
	var granted func(*pconn, *appproto.DirectLink) error
	var early *pconn
	if req.Early {
		granted = func(pc *pconn, dl *appproto.DirectLink) error {
			// On record with the grant: the application may continue the
			// link through the proxies while the far side is asked.
			pc.dlName, early = dl.Name, pc
			if !s.recordLease(a, pc, c, nil) {
				return net.ErrClosed
			}
			return appproto.WriteFrame(c, appproto.DialReply{Local: pc.local, Remote: pc.remote, Path: pc.path, Reason: pc.reason, Direct: dl, Pending: true})
		}
	}
	pc, dl, err := s.dialDirect(ctx, a, req, granted)
	cancel()
	if err != nil {
		if early != nil {
			s.forget(early)
		}
		appproto.WriteFrame(c, appproto.DialReply{Code: ctlapi.CodeOf(err), Error: errMessage(err)})
		c.Close()
		return
	}
	c.SetDeadline(time.Time{})
	reply := appproto.DialReply{Local: pc.local, Remote: pc.remote, Path: pc.path, Reason: pc.reason, Direct: dl}
	if dl.Stream > 0 {
		dl = nil // the link's lease holds its quota
	}
	// The lease is on record before the reply: the application may
	// continue the link through the proxies (DialRequest.Continue) at once.
	if !s.recordLease(a, pc, c, dl) {
		return
	}
	if err := appproto.WriteFrame(c, reply); err != nil {
		c.Close()
	}
	s.awaitLease(a, pc, c, dl)
}

// dialDirect reserves the quota, names the link and has the far side's
// application listen on it, telling granted (if set) of the grant as soon
// as the far side has been asked.
func (s *Server) dialDirect(ctx context.Context, a *app, req appproto.DialRequest, granted func(*pconn, *appproto.DirectLink) error) (*pconn, *appproto.DirectLink, error) {
	if _, err := validClass(req.Priority); err != nil {
		return nil, nil, err
	}
	if req.Port < 1 || req.Port > 65535 {
		return nil, nil, ctlapi.Errorf(ctlapi.CodeBadRequest, "port %d outside 1..65535", req.Port)
	}
	route, err := s.ctl.Resolve(ctx, ctlapi.ResolveRequest{UID: a.cred.UID, Target: req.Target, Port: req.Port, Transports: req.Transports})
	if err != nil {
		return nil, nil, err
	}
	if route.Path != ctlapi.PathNTB && route.Path != ctlapi.PathSHM {
		return nil, nil, ctlapi.Errorf(ctlapi.CodeNoDirect, "direct mode needs an NTB link or the same host; %s is reachable only over %s (%s)", route.Host, route.Path, route.Reason)
	}
	if link := s.links[route.Host]; route.Path == ctlapi.PathNTB && link != nil && !waitLinkUp(ctx, link.ep.Device(), linkGrace) {
		return nil, nil, ctlapi.Errorf(ctlapi.CodeNoDirect, "direct mode needs the NTB link to %s: %s", route.Host, s.linkDown(route.Host))
	}
	pc := &pconn{id: s.nextID.Add(1), app: a.id, dir: "out", path: route.Path, link: route.Link, partition: -1, direct: true}
	pc.remote = hostPort(route.Host, req.Port)
	pc.local = hostPort(s.cfg.Host, int(pc.id%50000)+10000)
	pc.reason = route.Reason + "; direct: a window slice of its own, no proxy on the data path"
	dl := &appproto.DirectLink{Name: fmt.Sprintf("%s%s-%d", directPrefix, s.cfg.Host, pc.id), Dir: s.cfg.Proxy.FabricDir, Window: s.cfg.Proxy.DirectWindow}
	reserve := func() error { return s.reserveDirect(a, dl) }
	if req.Reuse != "" {
		// A later connection on a's live link: its lease holds the
		// link's quota, and this connection's lease holds none.
		if err := s.reusable(a, req, route.Host); err != nil {
			return nil, nil, err
		}
		dl = &appproto.DirectLink{Name: req.Reuse, Dir: s.cfg.Proxy.FabricDir, Stream: req.Stream}
		pc.dlName = appproto.StreamName(dl.Name, dl.Stream)
		pc.reason = route.Reason + "; direct: a connection on the window slice of an earlier one, no proxy on the data path"
		reserve = func() error { return nil }
	}
	if err := reserve(); err != nil {
		return nil, nil, err
	}
	// The grant goes out once the far side's part is under way, so that
	// the application's attaching its end overlaps that, not this
	// proxy's own exchange with the far side.
	grant := func() error {
		if granted == nil {
			return nil
		}
		return granted(pc, dl)
	}
	switch route.Path {
	case ctlapi.PathSHM:
		l := s.listenerOn(req.Port)
		if l == nil {
			err = ctlapi.Errorf(ctlapi.CodeRefused, "nobody listens on %s", pc.remote)
			break
		}
		if dl.Stream > 0 && !s.holdsDirect(l.app, dl.Name) {
			err = ctlapi.Errorf(ctlapi.CodeRefused, "the application listening on %s holds no direct link %s", pc.remote, dl.Name)
			break
		}
		in := appproto.Incoming{Local: pc.remote, Remote: pc.local, Path: pc.path, Reason: pc.reason, Direct: dl}
		if err = grant(); err != nil {
			break
		}
		var ac *transport.Conn
		if ac, err = s.handoffDirect(ctx, l, in, pc); err == nil {
			q := &pconn{id: s.nextID.Add(1), app: l.app.id, dir: "in", path: pc.path, reason: pc.reason, partition: -1, direct: true,
				local: pc.remote, remote: pc.local, dlName: appproto.StreamName(dl.Name, dl.Stream)}
			go s.holdLease(l.app, q, ac, nil)
		}
	case ctlapi.PathNTB:
		link := s.links[route.Host]
		if link == nil {
			err = ctlapi.Errorf(ctlapi.CodeNoPath, "ntmon routes %s over NTB link %s, which this ntproxy does not have", route.Host, route.Link)
			break
		}
		var fc *transport.Conn
		if fc, err = link.ep.DialContext(ctx, req.Port); err != nil {
			err = fabricErr(route.Host, req.Port, err)
			break
		}
		_, err = s.rackOpenThen(fc, route.Host, appproto.RackOpen{Port: req.Port, Direct: dl.Name, DirectWindow: dl.Window, Stream: dl.Stream}, grant)
		fc.Close() // the far proxy holds its application's lease
	}
	if err != nil {
		if dl.Stream == 0 {
			s.releaseDirect(a, dl)
		}
		return nil, nil, err
	}
	return pc, dl, nil
}

// reusable checks that req may be a later connection on a's direct link
// req.Reuse: a link this proxy granted, whose lease a holds, to host.
func (s *Server) reusable(a *app, req appproto.DialRequest, host string) error {
	if req.Stream < 1 || req.Stream > appproto.MaxStream {
		return ctlapi.Errorf(ctlapi.CodeBadRequest, "direct link stream %d outside 1..%d", req.Stream, appproto.MaxStream)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, pc := range a.conns {
		if pc.direct && pc.dlName == req.Reuse && pc.dir == "out" && strings.HasPrefix(req.Reuse, directPrefix+s.cfg.Host+"-") && hostOf(pc.remote) == host {
			return nil
		}
	}
	return ctlapi.Errorf(ctlapi.CodeRefused, "app %d holds no direct link %q to %s", a.id, req.Reuse, host)
}

// handoffDirect introduces a direct connection to l's application and
// waits until it listens on the link.
func (s *Server) handoffDirect(ctx context.Context, l *listener, in appproto.Incoming, pc *pconn) (*transport.Conn, error) {
	ac, err := s.handoff(ctx, l, in, pc)
	if err != nil {
		return nil, err
	}
	ac.SetReadDeadline(time.Now().Add(requestTimeout))
	var b [1]byte
	if _, err := ac.Read(b[:]); err != nil || b[0] != appproto.DirectReady {
		ac.Close()
		return nil, ctlapi.Errorf(ctlapi.CodeRefused, "the application listening on port %d did not take the direct link: %v", l.port, err)
	}
	ac.SetReadDeadline(time.Time{})
	return ac, nil
}

// serveRackDirect is serveInbound's part for a direct open from a peer:
// hand the link to the listener's application, answer the peer, hold the
// lease.
func (s *Server) serveRackDirect(fc net.Conn, open appproto.RackOpen, l *listener, pc *pconn, refuse func(error)) {
	if !strings.HasPrefix(open.Direct, directPrefix+open.From+"-") || strings.ContainsAny(open.Direct, "/\x00") || len(open.Direct) > 96 {
		refuse(ctlapi.Errorf(ctlapi.CodeBadRequest, "direct link name %q is not one %s may grant", open.Direct, open.From))
		return
	}
	pc.direct = true
	if open.Stream != 0 {
		s.serveRackStream(fc, open, l, pc, refuse)
		return
	}
	pc.reason += "; direct: a window slice of its own, no proxy on the data path"
	// The opener chose the window (see reserveDirect); a peer that names
	// none opened a link of the configured size, and one may not ask for
	// more than that or for a size the fabric cannot map.
	window := cmp.Or(open.DirectWindow, s.cfg.Proxy.DirectWindow)
	if window < min(minDirectWindow, s.cfg.Proxy.DirectWindow) || window > s.cfg.Proxy.DirectWindow || window%4096 != 0 {
		refuse(ctlapi.Errorf(ctlapi.CodeBadRequest, "direct link window %d outside [%d, %d] or not a multiple of 4096", window, min(minDirectWindow, s.cfg.Proxy.DirectWindow), s.cfg.Proxy.DirectWindow))
		return
	}
	dl := &appproto.DirectLink{Name: open.Direct, Dir: s.cfg.Proxy.FabricDir, Window: window}
	if err := s.reserveDirectExact(l.app, dl); err != nil {
		refuse(err)
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, dialTimeout)
	defer cancel()
	in := appproto.Incoming{Local: pc.local, Remote: pc.remote, Path: pc.path, Reason: pc.reason, Direct: dl}
	ac, err := s.handoffDirect(ctx, l, in, pc)
	if err != nil {
		s.releaseDirect(l.app, dl)
		refuse(err)
		return
	}
	// On record before the answer, as in serveDirect: the far side may
	// continue the link through the proxies as soon as it has it.
	pc.app = l.app.id
	if !s.recordLease(l.app, pc, ac, dl) {
		fc.Close()
		return
	}
	err = appproto.WriteFrame(fc, appproto.DialReply{Local: pc.remote, Remote: pc.local, Path: pc.path})
	fc.Close()
	if err != nil {
		ac.Close()
	}
	s.awaitLease(l.app, pc, ac, dl)
}

// serveRackStream is serveRackDirect's part for a later connection on a
// live direct link: l's application must hold the link; nothing is
// reserved (the link's lease holds its quota).
func (s *Server) serveRackStream(fc net.Conn, open appproto.RackOpen, l *listener, pc *pconn, refuse func(error)) {
	if open.Stream < 1 || open.Stream > appproto.MaxStream {
		refuse(ctlapi.Errorf(ctlapi.CodeBadRequest, "direct link stream %d outside 1..%d", open.Stream, appproto.MaxStream))
		return
	}
	if !s.holdsDirect(l.app, open.Direct) {
		refuse(ctlapi.Errorf(ctlapi.CodeRefused, "the application listening on port %d holds no direct link %s", l.port, open.Direct))
		return
	}
	pc.reason += "; direct: a connection on the window slice of an earlier one, no proxy on the data path"
	ctx, cancel := context.WithTimeout(s.ctx, dialTimeout)
	defer cancel()
	dl := &appproto.DirectLink{Name: open.Direct, Dir: s.cfg.Proxy.FabricDir, Stream: open.Stream}
	in := appproto.Incoming{Local: pc.local, Remote: pc.remote, Path: pc.path, Reason: pc.reason, Direct: dl}
	ac, err := s.handoffDirect(ctx, l, in, pc)
	if err != nil {
		refuse(err)
		return
	}
	err = appproto.WriteFrame(fc, appproto.DialReply{Local: pc.remote, Remote: pc.local, Path: pc.path})
	fc.Close()
	if err != nil {
		ac.Close()
		return
	}
	pc.app = l.app.id
	pc.dlName = appproto.StreamName(dl.Name, dl.Stream)
	s.holdLease(l.app, pc, ac, nil)
}

// minDirectWindow is the smallest window reserveDirect shrinks a direct
// link's to: a request/response connection (a Redis client's) keeps its
// messages far below it, and a bulk one still streams at many times TCP's
// rate with it.
const minDirectWindow = 256 << 10

// reserveDirect charges a's direct quota, and its user's memory quota,
// for dl. A link of dl.Window that does not fit is halved, down to
// minDirectWindow, until one fits (dl.Window then says which), so that
// many connections stay direct with smaller windows rather than the
// first few with large ones and the rest through the proxies.
func (s *Server) reserveDirect(a *app, dl *appproto.DirectLink) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for w := dl.Window; ; w /= 2 {
		err := s.reserveDirectLocked(a, w)
		if err == nil {
			dl.Window = w
			return nil
		}
		if w/2 < minDirectWindow || w%2 != 0 || (w/2)%4096 != 0 {
			return err
		}
	}
}

// reserveDirectExact is reserveDirect for the far side of a link, whose
// window the opener chose: it charges dl.Window or nothing.
func (s *Server) reserveDirectExact(a *app, dl *appproto.DirectLink) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reserveDirectLocked(a, dl.Window)
}

func (s *Server) reserveDirectLocked(a *app, window int) error {
	cost := linkBytes(window)
	if a.direct+cost > s.cfg.Proxy.DirectQuota {
		return ctlapi.Errorf(ctlapi.CodeQuota, "direct links of app %d would hold %d bytes, over proxy.direct_quota %d", a.id, a.direct+cost, s.cfg.Proxy.DirectQuota)
	}
	if err := s.chargeLocked(a.cred.UID, cost, "a direct link"); err != nil {
		return err
	}
	a.direct += cost
	a.memory += cost
	return nil
}

// releaseDirect returns dl's quota and removes its file (the ends that
// attached keep their mappings).
func (s *Server) releaseDirect(a *app, dl *appproto.DirectLink) {
	if dl == nil {
		return
	}
	cost := linkBytes(dl.Window)
	s.mu.Lock()
	a.direct -= cost
	a.memory -= cost
	s.mu.Unlock()
	shm.Remove(dl.Dir, dl.Name)
}

// holdLease registers pc and waits until the application closes the lease
// c (or goes), then releases the grant.
func (s *Server) holdLease(a *app, pc *pconn, c *transport.Conn, dl *appproto.DirectLink) {
	if s.recordLease(a, pc, c, dl) {
		s.awaitLease(a, pc, c, dl)
	}
}

// recordLease registers pc, the lease c of a's grant; false (c closed, the
// grant released) if the server or a has gone.
func (s *Server) recordLease(a *app, pc *pconn, c *transport.Conn, dl *appproto.DirectLink) bool {
	pc.ends = [2]net.Conn{c, nil}
	s.mu.Lock()
	if s.closed || a.gone {
		s.mu.Unlock()
		c.Close()
		s.releaseDirect(a, dl)
		return false
	}
	if dl != nil {
		pc.dlName = dl.Name
	}
	s.conns[pc.id] = pc
	a.conns[pc.id] = pc
	if s.leased != nil {
		close(s.leased)
		s.leased = nil
	}
	s.mu.Unlock()
	return true
}

// awaitLease waits until the application closes the recorded lease c (or
// goes), then releases the grant.
func (s *Server) awaitLease(a *app, pc *pconn, c *transport.Conn, dl *appproto.DirectLink) {
	done := make(chan struct{})
	if link := s.links[hostOf(pc.remote)]; link != nil && pc.path == ctlapi.PathNTB {
		go s.relayLinkState(link, c, pc, done)
	}
	var b [1]byte
	c.Read(b[:])
	close(done)
	c.Close()
	s.forget(pc)
	s.releaseDirect(a, dl)
}
