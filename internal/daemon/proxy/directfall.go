package proxy

import (
	"fmt"
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

// admitContinue checks a peer's open that carries on direct link name: a
// link the peer granted (its name says so) and a that holds it here.
func (s *Server) admitContinue(a *app, from, name string) error {
	if !strings.HasPrefix(name, directPrefix+from+"-") || !s.holdsDirect(a, name) {
		return ctlapi.Errorf(ctlapi.CodeRefused, "no direct link %q of %s to continue", name, from)
	}
	return nil
}

// continueReason is the reason of a proxied connection carrying on
// direct link name, which took the route of reason.
func continueReason(name, reason string) string {
	return fmt.Sprintf("direct link %s down: through the proxies while it is, %s", name, reason)
}
