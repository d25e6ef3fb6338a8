package proxy

import (
	"context"
	"sync"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// Control is what ntproxy asks the control plane: where a target lives and
// which path reaches it, whether a rack peer may connect to a port, and
// which ports are taken. ntmon answers it in a deployment (MonitorControl);
// StaticControl answers from the configuration alone.
type Control interface {
	Resolve(ctx context.Context, r ctlapi.ResolveRequest) (ctlapi.Route, error)
	Admit(ctx context.Context, r ctlapi.AdmitRequest) error
	Reserve(ctx context.Context, r ctlapi.ListenRequest) (int, error)
	Release(ctx context.Context, port int) error
}

// MonitorControl asks the host's ntmon over its local API.
type MonitorControl struct{ c *ctlapi.Client }

var _ Control = MonitorControl{}

// NewMonitorControl returns a Control that calls the ntmon serving on the
// Unix socket path.
func NewMonitorControl(path string) MonitorControl {
	return MonitorControl{c: ctlapi.NewClient(path)}
}

func (m MonitorControl) Resolve(ctx context.Context, r ctlapi.ResolveRequest) (ctlapi.Route, error) {
	var route ctlapi.Route
	err := m.c.Call(ctx, ctlapi.PathResolve, r, &route)
	return route, err
}

func (m MonitorControl) Admit(ctx context.Context, r ctlapi.AdmitRequest) error {
	return m.c.Call(ctx, ctlapi.PathAdmit, r, nil)
}

func (m MonitorControl) Reserve(ctx context.Context, r ctlapi.ListenRequest) (int, error) {
	var reply ctlapi.ListenReply
	err := m.c.Call(ctx, ctlapi.PathListen, r, &reply)
	return reply.Port, err
}

func (m MonitorControl) Release(ctx context.Context, port int) error {
	return m.c.Call(ctx, ctlapi.PathUnlisten, ctlapi.ListenRequest{Port: port}, nil)
}

// StaticControl decides from the configuration alone: it knows no peer
// liveness (a configured NTB link is always the route) and allocates ports
// in memory (below 1024 only to uid 0 or CAP_NET_BIND_SERVICE, as
// ntmon). It serves tests and a proxy run without ntmon.
type StaticControl struct {
	Config *config.Config
	// RDMA is this host's RDMA listener and PeerRDMA the peers' by host,
	// as ntmon would learn them ("" or nil: no RDMA path).
	RDMA     string
	PeerRDMA map[string]string

	mu sync.Mutex
	// mu protects the following fields.
	ports map[int]int // port → holder pid
	next  int
}

var _ Control = (*StaticControl)(nil)

func (s *StaticControl) Resolve(_ context.Context, r ctlapi.ResolveRequest) (ctlapi.Route, error) {
	host, ok := s.Config.HostOf(r.Target)
	if !ok {
		return ctlapi.Route{}, ctlapi.Errorf(ctlapi.CodeUnknown, "%q is no host or address of this rack", r.Target)
	}
	if ok, rule := s.Config.Allowed("out", r.UID, host, r.Port); !ok {
		return ctlapi.Route{}, ctlapi.Errorf(ctlapi.CodeDenied, "acl rule %d denies uid %d -> %s:%d", rule, r.UID, host, r.Port)
	}
	if host == s.Config.Host {
		return ctlapi.Route{Host: host, Path: ctlapi.PathSHM, Reason: "same host: shared memory, never the NTB"}, nil
	}
	p, _ := s.Config.Peer(host)
	var reach ctlapi.Reach
	if p.Link == "" {
		reach.NTBWhy = "no NTB link to " + host
	}
	switch {
	case s.RDMA == "":
		reach.RDMAWhy = "no RDMA on this host: StaticControl.RDMA not set"
	case s.PeerRDMA[host] == "":
		reach.RDMAWhy = "no RDMA on " + host + ": not in StaticControl.PeerRDMA"
	default:
		reach.RDMAAddr = s.PeerRDMA[host]
	}
	return ctlapi.PickRoute(p.Paths(), r.Transports, reach)
}

func (s *StaticControl) Admit(_ context.Context, r ctlapi.AdmitRequest) error {
	if _, ok := s.Config.Peer(r.Peer); !ok {
		return ctlapi.Errorf(ctlapi.CodeUnknown, "%q is not a peer of %s", r.Peer, s.Config.Host)
	}
	if ok, rule := s.Config.Allowed("in", -1, r.Peer, r.Port); !ok {
		return ctlapi.Errorf(ctlapi.CodeDenied, "acl rule %d denies %s -> %s:%d", rule, r.Peer, s.Config.Host, r.Port)
	}
	return nil
}

// Ephemeral ports handed out for listens on port 0.
const (
	firstEphemeral = 49152
	lastEphemeral  = 65535
)

func (s *StaticControl) Reserve(_ context.Context, r ctlapi.ListenRequest) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ports == nil {
		s.ports, s.next = map[int]int{}, firstEphemeral
	}
	if r.Port < 0 || r.Port > lastEphemeral {
		return 0, ctlapi.Errorf(ctlapi.CodeBadRequest, "port %d outside 0..65535", r.Port)
	}
	if r.Port > 0 && r.Port < proc.FirstUnprivilegedPort {
		if err := proc.MayBindPrivileged(proc.Cred{UID: r.UID, PID: r.PID}); err != nil {
			return 0, ctlapi.Errorf(ctlapi.CodeDenied, "listen on port %d: below %d, and %v", r.Port, proc.FirstUnprivilegedPort, err)
		}
	}
	if r.Port != 0 {
		if pid, taken := s.ports[r.Port]; taken && pid != r.PID {
			return 0, ctlapi.Errorf(ctlapi.CodePortInUse, "port %d is listened on by pid %d", r.Port, pid)
		}
		s.ports[r.Port] = r.PID
		return r.Port, nil
	}
	for range lastEphemeral - firstEphemeral + 1 {
		p := s.next
		s.next++
		if s.next > lastEphemeral {
			s.next = firstEphemeral
		}
		if _, taken := s.ports[p]; !taken {
			s.ports[p] = r.PID
			return p, nil
		}
	}
	return 0, ctlapi.Errorf(ctlapi.CodeQuota, "no free ephemeral port")
}

func (s *StaticControl) Release(_ context.Context, port int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.ports, port)
	return nil
}
