package proxy

import (
	"net"
	"net/http"
	"sort"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/capture"
	"github.com/ntstack/ntstack/internal/prim/accept"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// Snapshot returns the proxy's live state: links with per-partition
// totals, applications, listeners and connections with their paths.
func (s *Server) Snapshot() ctlapi.Snapshot {
	snap := ctlapi.Snapshot{Host: s.cfg.Host, Apps: s.appStats(), PathSwitches: s.pathSwitches.Load()}
	if s.gwStat != nil {
		snap.Gateway = s.gwStat()
	}
	if s.trunks != nil {
		snap.Trunks = s.trunks()
	}
	s.mu.Lock()
	conns := make([]*pconn, 0, len(s.conns))
	for _, pc := range s.conns {
		conns = append(conns, pc)
	}
	for _, l := range s.listeners {
		snap.Listeners = append(snap.Listeners, ctlapi.ListenStat{App: l.app.id, Port: l.port, Backlog: l.backlog})
	}
	s.mu.Unlock()
	parts := map[string][]ctlapi.PartitionStat{}
	for _, l := range s.links {
		ps := make([]ctlapi.PartitionStat, s.cfg.Proxy.Partitions)
		for i := range ps {
			ps[i].Index = i
		}
		parts[l.peer.Link] = ps
	}
	for _, pc := range conns {
		cs := ctlapi.ConnStat{
			ID: pc.id, App: pc.app, Local: pc.local, Remote: pc.remote, Dir: pc.dir,
			Path: pc.path, Mode: pc.mode(), Reason: pc.reason, Link: pc.link, Partition: pc.partition,
			BytesTX: pc.bytesTX.Load(), BytesRX: pc.bytesRX.Load(),
			MsgsTX: pc.msgsTX.Load(), MsgsRX: pc.msgsRX.Load(),
			QueueDepth: int(pc.inFlight[0].Load() + pc.inFlight[1].Load()),
		}
		if l := pc.leg; l != nil {
			l.mu.Lock()
			cs.Path, cs.Switches = l.path, l.switches
			if l.switches > 0 {
				cs.LastPause = l.lastPause.String()
			}
			l.mu.Unlock()
		}
		snap.Conns = append(snap.Conns, cs)
		if ps := parts[pc.link]; pc.partition >= 0 && pc.partition < len(ps) {
			p := &ps[pc.partition]
			p.Conns++
			p.BytesTX += cs.BytesTX
			p.BytesRX += cs.BytesRX
			p.MsgsTX += cs.MsgsTX
			p.MsgsRX += cs.MsgsRX
		}
	}
	for _, l := range s.links {
		snap.Links = append(snap.Links, ctlapi.LinkStat{
			Name: l.peer.Link, Peer: l.peer.Host, State: l.ep.Device().Link().String(),
			Window: s.cfg.Proxy.Window, Partitions: parts[l.peer.Link],
		})
	}
	sort.Slice(snap.Links, func(i, j int) bool { return snap.Links[i].Name < snap.Links[j].Name })
	sort.Slice(snap.Apps, func(i, j int) bool { return snap.Apps[i].ID < snap.Apps[j].ID })
	sort.Slice(snap.Listeners, func(i, j int) bool { return snap.Listeners[i].Port < snap.Listeners[j].Port })
	sort.Slice(snap.Conns, func(i, j int) bool { return snap.Conns[i].ID < snap.Conns[j].ID })
	return snap
}

// ServeAdmin serves the snapshot API (ctlapi.PathSnapshot), fault injection
// (ctlapi.PathFault) and packet capture (capture.Path, see capture.go) on
// ln until ln or the Server closes.
func (s *Server) ServeAdmin(ln net.Listener) error {
	if !s.track(ln) {
		ln.Close()
		return net.ErrClosed
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+ctlapi.PathSnapshot, func(w http.ResponseWriter, r *http.Request) {
		ctlapi.Reply(w, s.Snapshot(), nil)
	})
	mux.HandleFunc("POST "+ctlapi.PathFault, func(w http.ResponseWriter, r *http.Request) {
		var req ctlapi.FaultRequest
		if err := ctlapi.Decode(r, &req); err != nil {
			ctlapi.Reply(w, nil, err)
			return
		}
		ctlapi.Reply(w, struct{}{}, s.Fault(req))
	})
	mux.HandleFunc("GET "+capture.Path, s.serveCapture)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-s.ctx.Done()
		srv.Close()
	}()
	// Only root reaches the socket (0600); the wrapper retries accept
	// errors, which Serve would return for some (ENOBUFS, ENOMEM).
	wrapped := accept.Wrap(ln, accept.Options{What: "admin socket " + ln.Addr().String(), Logf: s.logf})
	if err := srv.Serve(wrapped); err != nil && s.ctx.Err() == nil {
		return err
	}
	return nil
}

// Fault pulls or restores one of the emulated NTB links (fault injection
// for failover tests and demonstrations).
func (s *Server) Fault(req ctlapi.FaultRequest) error {
	for _, l := range s.links {
		if l.peer.Link != req.Link {
			continue
		}
		d, ok := l.ep.Device().(interface {
			ForceLinkDown()
			ForceLinkUp()
		})
		if !ok {
			return ctlapi.Errorf(ctlapi.CodeBadRequest, "link %s is not emulated: no fault injection", req.Link)
		}
		if req.Down {
			d.ForceLinkDown()
		} else {
			d.ForceLinkUp()
		}
		s.logf("fault: link %s forced %s", req.Link, map[bool]string{true: "down", false: "up"}[req.Down])
		return nil
	}
	return ctlapi.Errorf(ctlapi.CodeUnknown, "no link %q", req.Link)
}
