package monitor

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// Resolve decides how a local user reaches req.Target:req.Port: shared
// memory on this host, the NTB link to a rack peer, else RDMA when both
// hosts have it, else the peer's TCP fallback. A peer whose control
// session is down keeps its NTB route: the link may well be up, and
// ntproxy, which owns it, takes the route's next hop if it is not (see
// proxy.followLink); only a link the peer's HELLO showed unusable is
// passed over here. Errors
// are *ctlapi.Error: CodeUnknown, CodeDenied (naming the ACL rule),
// CodeNoPath, CodeBadRequest.
func (m *Monitor) Resolve(req ctlapi.ResolveRequest) (ctlapi.Route, error) {
	if req.Port < 1 || req.Port > 65535 {
		return ctlapi.Route{}, ctlapi.Errorf(ctlapi.CodeBadRequest, "resolve %s:%d: port outside 1..65535", req.Target, req.Port)
	}
	host, ok := m.cfg.HostOf(req.Target)
	if !ok {
		return ctlapi.Route{}, ctlapi.Errorf(ctlapi.CodeUnknown, "resolve %s: not this host (%s), a rack peer or one of their addresses", req.Target, m.cfg.Host)
	}
	if ok, rule := m.cfg.Allowed("out", req.UID, host, req.Port); !ok {
		return ctlapi.Route{}, ctlapi.Errorf(ctlapi.CodeDenied, "acl rule %d denies uid %d -> %s:%d", rule, req.UID, host, req.Port)
	}
	if host == m.cfg.Host {
		return ctlapi.Route{Host: host, Path: ctlapi.PathSHM, Reason: "same host: shared memory, never the NTB"}, nil
	}
	p := m.peers[host]
	m.mu.Lock()
	up, why, since, everUp, problem, hello := p.sess != nil, p.why, p.since, p.everUp, p.linkProblem, p.hello
	m.mu.Unlock()
	var r ctlapi.Reach
	switch {
	case p.cfg.Link == "":
		r.NTBWhy = "no NTB link to " + host
	case problem != "":
		r.NTBWhy = "NTB link unusable: " + problem
	case !up && everUp:
		r.NTBNote = fmt.Sprintf("peer %s control plane down since %s (%s), the link's own state decides", host, since.Format(time.TimeOnly), why)
	case !up:
		r.NTBNote = fmt.Sprintf("peer %s control plane not up yet (%s), the link's own state decides", host, why)
	}
	// The peer's RDMA listener is what its last HELLO said: its ntproxy
	// may well serve while its ntmon is away, as with the TCP fallback.
	switch {
	case m.opts.RDMA.Addr == "":
		r.RDMAWhy = "no RDMA on this host: " + m.opts.RDMA.Why
	case !everUp:
		r.RDMAWhy = fmt.Sprintf("RDMA on %s unknown: control plane not up yet", host)
	case hello.RDMA == "":
		r.RDMAWhy = fmt.Sprintf("no RDMA on %s: %s", host, hello.RDMAWhy)
	default:
		r.RDMAAddr = hello.RDMA
	}
	return ctlapi.PickRoute(p.cfg.Paths(), req.Transports, r)
}

// Admit decides whether a connection from rack peer req.Peer may reach
// local port req.Port. Errors: CodeUnknown, CodeDenied, CodeBadRequest.
func (m *Monitor) Admit(req ctlapi.AdmitRequest) error {
	if req.Port < 1 || req.Port > 65535 {
		return ctlapi.Errorf(ctlapi.CodeBadRequest, "admit %s -> port %d: port outside 1..65535", req.Peer, req.Port)
	}
	if _, ok := m.peers[req.Peer]; !ok && req.Peer != m.cfg.Host {
		return ctlapi.Errorf(ctlapi.CodeUnknown, "admit %s: not a peer of %s", req.Peer, m.cfg.Host)
	}
	if ok, rule := m.cfg.Allowed("in", -1, req.Peer, req.Port); !ok {
		return ctlapi.Errorf(ctlapi.CodeDenied, "acl rule %d denies %s -> %s:%d", rule, req.Peer, m.cfg.Host, req.Port)
	}
	return nil
}

// Listen reserves a port (req.Port 0: one of EphemeralFirst..EphemeralLast)
// for the local process req.PID of user req.UID. A port below 1024 needs
// uid 0 or CAP_NET_BIND_SERVICE in that process (proc.MayBindPrivileged).
// The holder asking again keeps its port (an application re-listening
// after an ntproxy restart), and a reservation whose holder has exited is
// taken over. Errors: CodeDenied for a privileged port, CodePortInUse
// naming the holder, CodeBadRequest, CodeQuota when the range is
// exhausted.
func (m *Monitor) Listen(req ctlapi.ListenRequest) (ctlapi.ListenReply, error) {
	if req.Port > 0 && req.Port < proc.FirstUnprivilegedPort {
		if err := proc.MayBindPrivileged(proc.Cred{UID: req.UID, PID: req.PID}); err != nil {
			return ctlapi.ListenReply{}, ctlapi.Errorf(ctlapi.CodeDenied, "listen on port %d: below %d, and %v", req.Port, proc.FirstUnprivilegedPort, err)
		}
	}
	port, err := m.ports.reserve(req)
	if err != nil {
		return ctlapi.ListenReply{}, err
	}
	m.log.Debug("port reserved", "port", port, "uid", req.UID, "pid", req.PID)
	return ctlapi.ListenReply{Port: port}, nil
}

// Unlisten releases a reservation; a non-zero req.PID must be the holder's.
func (m *Monitor) Unlisten(req ctlapi.ListenRequest) error {
	return m.ports.release(req, anyUID)
}

// Status reports the peers, the reservations and ntproxy's snapshot
// (Status.ProxyErr says why the snapshot is missing): everything, as root
// sees it (the local API shows a non-root caller only its own part).
func (m *Monitor) Status(ctx context.Context) (st ctlapi.Status) {
	if m.opts.RDMA.Addr == "" {
		defer func() { st.RDMA = "none: " + m.opts.RDMA.Why }()
	}
	st = ctlapi.Status{
		Host:      m.cfg.Host,
		Version:   m.opts.Version,
		RDMA:      m.opts.RDMA.Addr,
		Security:  m.Security(),
		Peers:     m.peerStatus(),
		Listening: m.ports.list(),
	}
	snap, err := m.snapshot(ctx)
	if err != nil {
		st.ProxyErr = err.Error()
	} else {
		st.Proxy = snap
	}
	return st
}

// snapshot fetches ntproxy's live state.
func (m *Monitor) snapshot(ctx context.Context) (*ctlapi.Snapshot, error) {
	ctx, cancel := context.WithTimeout(ctx, m.opts.ProxyTimeout)
	defer cancel()
	var snap ctlapi.Snapshot
	if err := m.proxy.Call(ctx, ctlapi.PathSnapshot, nil, &snap); err != nil {
		return nil, fmt.Errorf("ntproxy snapshot: %w", err)
	}
	return &snap, nil
}

// peerStatus lists the configured peers in config order.
func (m *Monitor) peerStatus() []ctlapi.PeerStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]ctlapi.PeerStatus, 0, len(m.cfg.Peers))
	for _, pc := range m.cfg.Peers {
		p := m.peers[pc.Host]
		ps := ctlapi.PeerStatus{
			Host:     pc.Host,
			Control:  pc.Control,
			Up:       p.sess != nil,
			Link:     pc.Link,
			LastSeen: p.lastSeen,
		}
		at := p.since.Format(time.TimeOnly)
		switch {
		case ps.Up:
			ps.Why = fmt.Sprintf("up since %s, %s", at, p.why)
		case p.everUp:
			ps.Why = fmt.Sprintf("down since %s: %s", at, p.why)
			if p.retry != "" {
				ps.Why += "; reconnecting: " + p.retry
			}
		default:
			ps.Why = "never up: " + p.why
		}
		if ps.Up && p.linkProblem != "" {
			ps.Why += "; NTB link unusable: " + p.linkProblem
		}
		if p.everUp {
			h := p.hello
			ps.Version = h.Version
			ps.Caps = slices.Clone(h.Caps)
			ps.RDMA = h.RDMA
			if h.RDMA == "" {
				ps.RDMA = "none: " + h.RDMAWhy
			}
			if i := slices.IndexFunc(h.Links, func(l HelloLink) bool { return l.Name == pc.Link }); pc.Link != "" && i >= 0 {
				ps.Window, ps.Partitions = h.Links[i].Window, h.Links[i].Partitions
			}
		}
		out = append(out, ps)
	}
	return out
}

// apiHandler serves the local API (ctlapi paths). Every request is
// answered for the identity its connection's SO_PEERCRED gives (see
// caller.go), which the server's ConnContext stores.
func (m *Monitor) apiHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+ctlapi.PathResolve, func(w http.ResponseWriter, r *http.Request) {
		var req ctlapi.ResolveRequest
		caller, err := decodeFrom(r, &req)
		if err != nil {
			ctlapi.Reply(w, nil, err)
			return
		}
		req.UID = onBehalf(caller, req.UID, 0).UID
		rt, err := m.Resolve(req)
		ctlapi.Reply(w, rt, err)
	})
	mux.HandleFunc("POST "+ctlapi.PathAdmit, func(w http.ResponseWriter, r *http.Request) {
		var req ctlapi.AdmitRequest
		if _, err := decodeFrom(r, &req); err != nil {
			ctlapi.Reply(w, nil, err)
			return
		}
		ctlapi.Reply(w, struct{}{}, m.Admit(req))
	})
	mux.HandleFunc("POST "+ctlapi.PathListen, func(w http.ResponseWriter, r *http.Request) {
		var req ctlapi.ListenRequest
		caller, err := decodeFrom(r, &req)
		if err != nil {
			ctlapi.Reply(w, nil, err)
			return
		}
		who := onBehalf(caller, req.UID, req.PID)
		req.UID, req.PID = who.UID, who.PID
		rep, err := m.Listen(req)
		ctlapi.Reply(w, rep, err)
	})
	mux.HandleFunc("POST "+ctlapi.PathUnlisten, func(w http.ResponseWriter, r *http.Request) {
		var req ctlapi.ListenRequest
		caller, err := decodeFrom(r, &req)
		if err != nil {
			ctlapi.Reply(w, nil, err)
			return
		}
		if caller.UID == 0 {
			ctlapi.Reply(w, struct{}{}, m.ports.release(req, anyUID))
			return
		}
		// Anyone else releases only its own user's reservations, whatever
		// pid its body names.
		ctlapi.Reply(w, struct{}{}, m.ports.release(ctlapi.ListenRequest{Port: req.Port}, caller.UID))
	})
	mux.HandleFunc("GET "+ctlapi.PathStatus, func(w http.ResponseWriter, r *http.Request) {
		caller, err := callerOf(r)
		if err != nil {
			ctlapi.Reply(w, nil, err)
			return
		}
		st := m.Status(r.Context())
		visibleTo(&st, caller.UID)
		ctlapi.Reply(w, st, nil)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		ctlapi.Reply(w, nil, ctlapi.Errorf(ctlapi.CodeBadRequest, "%s %s: no such endpoint", r.Method, r.URL.Path))
	})
	return mux
}

// decodeFrom returns r's caller and decodes its body into v.
func decodeFrom(r *http.Request, v any) (proc.Cred, error) {
	caller, err := callerOf(r)
	if err != nil {
		return proc.Cred{}, err
	}
	return caller, ctlapi.Decode(r, v)
}
