package monitor

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strconv"

	"github.com/ntstack/ntstack/internal/prim/accept"
	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// Who may ask what of the local API. The socket is open to every local
// user (0666): `ntmon status` runs as anyone, and ntproxy, as root, asks on
// behalf of the applications it serves. So the kernel, not the request,
// says who is asking: each connection's SO_PEERCRED identity.
//   - A root caller is trusted with everything, and may name in the body
//     the uid and pid it asks for (ntproxy relays its applications'
//     identities, which it takes from SO_PEERCRED on its own socket).
//   - Anyone else asks for itself: identities in its bodies are ignored;
//     it may release only its own uid's reservations, and status shows it
//     only its own applications, reservations and connections.
//   - Ports below 1024 need uid 0 or CAP_NET_BIND_SERVICE
//     (proc.MayBindPrivileged) in the process asked for.

// Bounds of the local API's connections.
const (
	// maxAPIConnsPerUID bounds the open connections of each non-root
	// uid; more are closed at once. Root (ntproxy) is not bounded.
	maxAPIConnsPerUID = 16
	// maxMetricsConnsPerIP bounds the open connections per remote IP of
	// the metrics endpoint.
	maxMetricsConnsPerIP = 16
)

// callerKey is the request-context key of a connection's callerCred.
type callerKey struct{}

// callerCred is the SO_PEERCRED identity of a local API connection, or why
// there is none.
type callerCred struct {
	cred proc.Cred
	err  error
}

// unixConnOf returns the *net.UnixConn beneath c (accept.Conn wraps it).
func unixConnOf(c net.Conn) (*net.UnixConn, error) {
	for {
		switch v := c.(type) {
		case *net.UnixConn:
			return v, nil
		case interface{ NetConn() net.Conn }:
			c = v.NetConn()
		default:
			return nil, fmt.Errorf("a %T is no Unix socket", c)
		}
	}
}

// peerCred is the SO_PEERCRED identity of a local API connection.
func peerCred(c net.Conn) (proc.Cred, error) {
	uc, err := unixConnOf(c)
	if err != nil {
		return proc.Cred{}, err
	}
	return proc.PeerCred(uc)
}

// uidSource names a local API connection's source, its uid, for the
// per-uid bound.
func uidSource(c net.Conn) (string, error) {
	cred, err := peerCred(c)
	if err != nil {
		return "", err
	}
	return strconv.Itoa(cred.UID), nil
}

// wrapAPIListener bounds ln's connections per uid (root unbounded) and
// retries its accept errors.
func (m *Monitor) wrapAPIListener(ln net.Listener) net.Listener {
	return accept.Wrap(ln, accept.Options{
		What:      "local API " + ln.Addr().String(),
		Logf:      m.logf,
		Source:    uidSource,
		Exempt:    func(uid string) bool { return uid == "0" },
		PerSource: maxAPIConnsPerUID,
	})
}

// connContext stores the connection's SO_PEERCRED identity in the
// context of its requests.
func connContext(ctx context.Context, c net.Conn) context.Context {
	cred, err := peerCred(c)
	return context.WithValue(ctx, callerKey{}, callerCred{cred, err})
}

// callerOf returns who sent r, as the kernel says.
func callerOf(r *http.Request) (proc.Cred, error) {
	cc, ok := r.Context().Value(callerKey{}).(callerCred)
	if !ok {
		return proc.Cred{}, ctlapi.Errorf(ctlapi.CodeDenied, "%s: the caller's credentials are unknown", r.URL.Path)
	}
	if cc.err != nil {
		return proc.Cred{}, ctlapi.Errorf(ctlapi.CodeDenied, "%s: the caller's credentials: %v", r.URL.Path, cc.err)
	}
	return cc.cred, nil
}

// onBehalf returns the identity a request from caller asks for: the uid
// and pid it names if the caller is root, else the caller's own.
func onBehalf(caller proc.Cred, uid, pid int) proc.Cred {
	if caller.UID == 0 {
		return proc.Cred{UID: uid, PID: pid}
	}
	return proc.Cred{UID: caller.UID, PID: caller.PID, GID: caller.GID}
}

// logf adapts the Monitor's logger to a printf-style log function.
func (m *Monitor) logf(format string, args ...any) {
	m.log.Warn(fmt.Sprintf(format, args...))
}

// visibleTo trims st to what a non-root uid may see: its own
// reservations, applications, listeners and connections, the links' state
// without the partitions' traffic (every user's, summed), and no gateway
// (root's service). Root sees everything.
func visibleTo(st *ctlapi.Status, uid int) {
	if uid == 0 {
		return
	}
	st.Scope = fmt.Sprintf("uid %d only: its reservations, applications and connections; links without traffic (root sees every user's)", uid)
	own := st.Listening[:0]
	for _, e := range st.Listening {
		if e.UID == uid {
			own = append(own, e)
		}
	}
	st.Listening = own
	p := st.Proxy
	if p == nil {
		return
	}
	apps := map[uint64]bool{}
	ownApps := p.Apps[:0]
	for _, a := range p.Apps {
		if a.UID == uid {
			apps[a.ID] = true
			ownApps = append(ownApps, a)
		}
	}
	p.Apps = ownApps
	lns := p.Listeners[:0]
	for _, l := range p.Listeners {
		if apps[l.App] {
			lns = append(lns, l)
		}
	}
	p.Listeners = lns
	conns := p.Conns[:0]
	for _, c := range p.Conns {
		if apps[c.App] {
			conns = append(conns, c)
		}
	}
	p.Conns = conns
	for i := range p.Links {
		for j := range p.Links[i].Partitions {
			p.Links[i].Partitions[j] = ctlapi.PartitionStat{Index: p.Links[i].Partitions[j].Index}
		}
	}
	p.Gateway, p.Trunks = nil, nil
}
