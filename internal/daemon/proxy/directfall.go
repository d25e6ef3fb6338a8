package proxy

import (
	"context"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/appproto"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/ntb"
)

// A direct connection's fallback. A direct link is a slice of the NTB
// link's window, so it is down whenever that link is: holdLease relays the
// rack link's state to the applications at both ends (relayLinkState), and
// while it is down the dialing application carries the connection on
// through the proxies, as a proxied connection (DialRequest.Continue): the
// far proxy hands it to the application holding the same direct link
// (Incoming.Continue), whose socklike splices it into the connection by
// stream offset (socklike/direct.go). Once the link is back the two
// applications move the connection back to their direct link.

// relayPoll bounds how long a change of a link that cannot signal its
// changes (no ntb.LinkWatcher) takes to reach a lease.
const relayPoll = 50 * time.Millisecond

// relayLinkState writes appproto.LeaseLinkDown and LeaseLinkUp on lease c
// as link goes down and comes back, until done closes. A link down
// because the peer's ntproxy exited, closed its end or went silent
// (ntb.Liveness) is not relayed: the link itself, and the direct link
// with it, still works.
func (s *Server) relayLinkState(link *rackLink, c *transport.Conn, pc *pconn, done <-chan struct{}) {
	dev := link.ep.Device()
	w, _ := dev.(ntb.LinkWatcher)
	lv, _ := dev.(ntb.Liveness)
	failed := func() bool {
		if dev.Link() == ntb.LinkUp {
			return false
		}
		if lv == nil {
			return true
		}
		switch lv.LinkCause() {
		case ntb.CauseClosed, ntb.CauseGone, ntb.CauseSilent:
			return false
		}
		return true
	}
	up := true
	for {
		var changed <-chan struct{}
		if w != nil {
			changed = w.LinkChanged()
		}
		if now := !failed(); now != up {
			up = now
			msg := byte(appproto.LeaseLinkDown)
			if up {
				msg = appproto.LeaseLinkUp
			}
			if _, err := c.Write([]byte{msg}); err != nil {
				return
			}
			s.logf("direct link %s (connection %d): NTB link %s %s", pc.dlName, pc.id, link.peer.Link, map[bool]string{true: "up: back to the direct link", false: "down: to the fallback through the proxies"}[up])
		}
		var tick <-chan time.Time
		var t *time.Timer
		if changed == nil {
			t = time.NewTimer(relayPoll)
			tick = t.C
		}
		select {
		case <-done:
		case <-changed:
		case <-tick:
		}
		if t != nil {
			t.Stop()
		}
		select {
		case <-done:
			return
		default:
		}
	}
}

// holdsDirect reports whether a holds the lease of direct link name.
func (s *Server) holdsDirect(a *app, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, pc := range a.conns {
		if pc.direct && pc.dlName == name {
			return true
		}
	}
	return false
}

// directHolder returns the application holding the lease of direct link
// name, which from granted (its name says so), and the lease's record; nil
// if none does.
func (s *Server) directHolder(from, name string) (*app, *pconn) {
	if !strings.HasPrefix(name, directPrefix+from+"-") {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.apps {
		for _, pc := range a.conns {
			if pc.direct && pc.dlName == name {
				return a, pc
			}
		}
	}
	return nil, nil
}

// awaitHolder is directHolder, waiting within ctx for the lease to be
// recorded: a first direct connection's continuation may come while the
// far side of its link is still being asked (socklike/directstart.go).
func (s *Server) awaitHolder(ctx context.Context, from, name string) (*app, *pconn) {
	for {
		if a, pc := s.directHolder(from, name); a != nil || !strings.HasPrefix(name, directPrefix+from+"-") {
			return a, pc
		}
		s.mu.Lock()
		if s.leased == nil {
			s.leased = make(chan struct{})
		}
		ch := s.leased
		s.mu.Unlock()
		if a, pc := s.directHolder(from, name); a != nil {
			return a, pc
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, nil
		}
	}
}

// serveContinue is serveInbound's part for a connection carrying on
// direct link open.Continue: it goes to the application holding the link,
// on its PortContinue (not through a listener, which may have closed since
// the direct connection was accepted), and runs as a proxied connection.
// The direct connection was admitted; its continuation is the same.
func (s *Server) serveContinue(fc net.Conn, open appproto.RackOpen, in inbound, refuse func(error)) {
	wctx, wcancel := context.WithTimeout(s.ctx, requestTimeout)
	a, lease := s.awaitHolder(wctx, open.From, open.Continue)
	wcancel()
	switch {
	case in.from != "" && open.From != in.from:
		refuse(ctlapi.Errorf(ctlapi.CodeBadRequest, "open from %q arrived %s, which leads to %s", open.From, in.via, in.from))
		return
	case a == nil:
		refuse(ctlapi.Errorf(ctlapi.CodeRefused, "no direct link %q of %s to continue", open.Continue, open.From))
		return
	case open.Direct != "" || open.Token == 0 || len(open.Secret) != legSecretLen:
		refuse(ctlapi.Errorf(ctlapi.CodeBadRequest, "continuation from %s: direct, without a token or with a %d-byte resume secret", open.From, len(open.Secret)))
		return
	}
	pc := &pconn{
		id: s.nextID.Add(1), app: a.id, dir: "in", path: in.path, link: in.link, partition: in.partition,
		reason: continueReason(open.Continue, fmt.Sprintf("from %s %s", open.From, in.via)),
		local:  lease.local, remote: lease.remote, cont: open.Continue, secret: open.Secret,
	}
	ctx, cancel := context.WithTimeout(s.ctx, dialTimeout)
	defer cancel()
	ac, err := a.ep.DialContext(ctx, appproto.PortContinue)
	if err == nil {
		if err = appproto.WriteFrame(ac, appproto.Incoming{Local: pc.local, Remote: pc.remote, Path: pc.path, Reason: pc.reason, Continue: open.Continue}); err != nil {
			ac.Close()
		}
	}
	if err != nil {
		refuse(ctlapi.Errorf(ctlapi.CodeRefused, "app %d takes no continuation of direct link %s: %v", a.id, open.Continue, err))
		return
	}
	fc.SetDeadline(time.Time{})
	if err := appproto.WriteFrame(fc, appproto.DialReply{Local: pc.remote, Remote: pc.local, Path: pc.path, Window: pc.rxWindow(), Frame: legMaxPayload}); err != nil {
		ac.Close()
		fc.Close()
		return
	}
	s.logf("connection %d: direct link %s continues through the proxies over %s", pc.id, pc.cont, pc.path)
	peer, _ := s.cfg.Peer(open.From)
	s.runLeg(a, s.newLeg(pc, ac, peer, legKey{open.From, open.Token}, false, fc, in.path, legLimits{open.Window, open.Frame}))
}

// continueReason is the reason of a proxied connection carrying on
// direct link name, which took the route of reason.
func continueReason(name, reason string) string {
	return fmt.Sprintf("direct link %s down: through the proxies while it is, %s", name, reason)
}
