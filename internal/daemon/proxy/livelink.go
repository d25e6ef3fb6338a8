package proxy

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/qos"
	"github.com/ntstack/ntstack/socklike"
)

// Routes follow the links' live state. ntmon picks a route from what the
// control plane knows (the configuration, the peer's HELLO, the ACL); only
// this ntproxy, which owns the NTB link, knows whether the link is up at
// this moment. So a dial ntmon routes over an NTB link that is down, or
// that goes down while the dial waits for it, takes the route's next hop
// (RDMA where the pair has it, then the TCP fallback) at once, and the
// connection's reason says why.

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
// down now. A route with no other hop fails at once with the link's
// reason, rather than wait for the link.
func (s *Server) followLink(route ctlapi.Route) (ctlapi.Route, error) {
	if route.Path != ctlapi.PathNTB {
		return route, nil
	}
	why := s.linkDown(route.Host)
	if why == "" {
		return route, nil
	}
	next, ok := passNTB(route, why)
	if !ok {
		return route, ctlapi.Errorf(ctlapi.CodeNoPath, "no path to %s: %s, and no other transport allowed (%s)", route.Host, why, route.Reason)
	}
	return next, nil
}

// errLinkWentDown is the cause of a dial over an NTB link that went down
// meanwhile.
var errLinkWentDown = errors.New("NTB link went down")

// dialNTB dials port over link, giving up as soon as the link goes down
// (the cause then wraps errLinkWentDown and names the link's reason).
func dialNTB(ctx context.Context, link *rackLink, port int, class qos.Class) (*socklike.Conn, error) {
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
	return errors.Is(err, errLinkWentDown) || errors.Is(err, socklike.ErrLinkDown)
}
