package proxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/qos"
)

// Routes follow the links' live state. ntmon picks a route from what the
// control plane knows (the configuration, the peer's HELLO, the ACL); only
// this ntproxy, which owns the NTB link, knows whether the link is up at
// this moment. So a dial ntmon routes over an NTB link that is down, or
// that goes down while the dial waits for it, takes the route's next hop
// (RDMA where the pair has it, then the TCP fallback) at once, and the
// connection's reason says why. Only a link that has not come up since
// this ntproxy started, or a route with nowhere else to go, is given
// linkGrace to come up: a proxy's first dials race the link's handshake.

// linkGrace is how long a dial waits for an NTB link that is down before
// it takes the route's next hop or, with none, fails.
const linkGrace = 500 * time.Millisecond

// linkSide is the end of the NTB link between host and peer that host
// attaches: side 0 for the name that sorts first. Fixed sides let two
// ends that met on different link memory tell which moves (ntb/shm).
func linkSide(host, peer string) shm.Side {
	if host < peer {
		return shm.Side0
	}
	return shm.Side1
}

// linkDown says why the NTB link to host is down, or "" while it is up.
func (s *Server) linkDown(host string) string {
	link := s.links[host]
	if link == nil {
		return "this ntproxy has no NTB link to " + host
	}
	dev := link.ep.Device()
	if dev.Link() == ntb.LinkUp {
		return ""
	}
	return fmt.Sprintf("NTB link %s down (%s)", link.peer.Link, dev.LinkReason())
}

// passNTB moves route, over an NTB link, to its next hop that is not one,
// giving why the link was passed over; false if it has none.
func passNTB(route ctlapi.Route, why string) (ctlapi.Route, bool) {
	for _, h := range route.Hops {
		if h.Path == ctlapi.PathNTB {
			continue
		}
		route.Path, route.Addr, route.Link = h.Path, h.Addr, ""
		route.Reason = fmt.Sprintf("%s: %s %s", why, strings.ToUpper(h.Path), h.Addr)
		return route, true
	}
	return route, false
}

// followLink is route, as ntmon picked it, taken past an NTB link that is
// down now. A route with no other hop fails with the link's reason,
// after linkGrace rather than the dial's timeout.
func (s *Server) followLink(ctx context.Context, route ctlapi.Route) (ctlapi.Route, error) {
	if route.Path != ctlapi.PathNTB {
		return route, nil
	}
	why := s.linkDown(route.Host)
	if why == "" {
		return route, nil
	}
	next, ok := passNTB(route, why)
	if link := s.links[route.Host]; link != nil && (!ok || !link.everUp.Load()) {
		if waitLinkUp(ctx, link.ep.Device(), linkGrace) {
			return route, nil
		}
		why = s.linkDown(route.Host)
		next, ok = passNTB(route, why)
	}
	if !ok {
		return route, ctlapi.Errorf(ctlapi.CodeNoPath, "no path to %s: %s, and no other transport allowed (%s)", route.Host, why, route.Reason)
	}
	return next, nil
}

// waitLinkUp waits up to d for dev's link to be up, and reports whether it
// is.
func waitLinkUp(ctx context.Context, dev ntb.Device, d time.Duration) bool {
	w, ok := dev.(ntb.LinkWatcher)
	if !ok {
		return dev.Link() == ntb.LinkUp
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		changed := w.LinkChanged()
		if dev.Link() == ntb.LinkUp {
			return true
		}
		select {
		case <-changed:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// runLinkWatch marks link once its link has come up (rackLink.everUp).
func (s *Server) runLinkWatch(link *rackLink) {
	defer s.wg.Done()
	if waitLinkUp(s.ctx, link.ep.Device(), time.Duration(1<<63-1)) {
		link.everUp.Store(true)
	}
}

// errLinkWentDown is the cause of a dial over an NTB link that went down
// meanwhile.
var errLinkWentDown = errors.New("NTB link went down")

// dialNTB dials port over link, giving up as soon as the link goes down
// (the cause then wraps errLinkWentDown and names the link's reason).
func dialNTB(ctx context.Context, link *rackLink, port int, class qos.Class) (*transport.Conn, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	dev := link.ep.Device()
	if w, ok := dev.(ntb.LinkWatcher); ok {
		stop := make(chan struct{})
		defer close(stop)
		go func() {
			for {
				changed := w.LinkChanged()
				if dev.Link() != ntb.LinkUp {
					cancel(fmt.Errorf("%w (%s)", errLinkWentDown, dev.LinkReason()))
					return
				}
				select {
				case <-changed:
				case <-stop:
					return
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	c, err := link.ep.DialClass(ctx, port, class)
	if err != nil && errors.Is(context.Cause(ctx), errLinkWentDown) {
		return nil, fmt.Errorf("NTB link %s: %w", link.peer.Link, context.Cause(ctx))
	}
	return c, err
}

// linkFailed reports whether err, from dialNTB, is the link's fault rather
// than the far side's answer (nobody listening, a refusal).
func linkFailed(err error) bool {
	return errors.Is(err, errLinkWentDown) || errors.Is(err, transport.ErrLinkDown)
}
