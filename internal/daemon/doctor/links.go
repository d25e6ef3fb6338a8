package doctor

import (
	"context"
	"fmt"

	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// checkLinks asks the running ntmon for its status and reports each
// configured peer (ntmon's session) and each configured NTB link
// (ntproxy's snapshot, relayed by ntmon). A configured peer or link that
// is down fails.
func (h *host) checkLinks(ctx context.Context) []Result {
	cfg, socket := h.opts.Config, h.opts.MonitorSocket
	if cfg == nil {
		return []Result{{Name: "links", Status: Skip,
			Detail: "no host config (ntmon doctor -config FILE): peers and links not checked"}}
	}
	c := ctlapi.NewClient(socket)
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, h.opts.Timeout)
	defer cancel()
	var st ctlapi.Status
	if err := c.Call(ctx, ctlapi.PathStatus, nil, &st); err != nil {
		return []Result{{Name: "ntmon", Status: Fail,
			Detail: fmt.Sprintf("ntmon not running at %s: %v", socket, err),
			Fix:    "systemctl start ntmon   (or run: ntmon -config FILE)"}}
	}
	if len(cfg.Peers) == 0 {
		return []Result{{Name: "ntmon", Status: Pass,
			Detail: fmt.Sprintf("ntmon %s of host %s answers at %s; no peers configured", st.Version, st.Host, socket)}}
	}
	peers := map[string]ctlapi.PeerStatus{}
	for _, p := range st.Peers {
		peers[p.Host] = p
	}
	var rs []Result
	for _, p := range cfg.Peers {
		r := Result{Name: "peer " + p.Host}
		ps, ok := peers[p.Host]
		switch {
		case !ok:
			r.Status = Fail
			r.Detail = fmt.Sprintf("peer %s is configured, but ntmon at %s does not know it", p.Host, socket)
			r.Fix = "ntmon runs with another configuration: systemctl restart ntmon (or compare its -config with this one)"
		case ps.Up:
			r.Status = Pass
			r.Detail = fmt.Sprintf("peer %s up (control %s): %s", p.Host, ps.Control, ps.Why)
		default:
			r.Status = Fail
			r.Detail = fmt.Sprintf("peer %s down (control %s): %s", p.Host, ps.Control, ps.Why)
			r.Fix = fmt.Sprintf("check ntmon on %s (systemctl status ntmon) and that this host reaches %s over TCP", p.Host, p.Control)
		}
		rs = append(rs, r)
	}
	links := map[string]ctlapi.LinkStat{}
	if st.Proxy != nil {
		for _, l := range st.Proxy.Links {
			links[l.Name] = l
		}
	}
	for _, p := range cfg.Peers {
		if p.Link == "" {
			continue
		}
		r := Result{Name: "link " + p.Link}
		l, ok := links[p.Link]
		switch {
		case st.Proxy == nil:
			r.Status = Fail
			r.Detail = fmt.Sprintf("NTB link %s to %s unknown: ntproxy not reachable: %s", p.Link, p.Host, st.ProxyErr)
			r.Fix = "systemctl start ntproxy   (or run: ntproxy -config FILE)"
		case !ok:
			r.Status = Fail
			r.Detail = fmt.Sprintf("NTB link %s to %s is configured, but ntproxy has not opened it", p.Link, p.Host)
			r.Fix = "ntproxy runs with another configuration: systemctl restart ntproxy"
		case l.State == "up":
			r.Status = Pass
			r.Detail = fmt.Sprintf("NTB link %s to %s up: %s window, %d partition(s)", p.Link, p.Host, formatBytes(uint64(l.Window)), len(l.Partitions))
		default:
			r.Status = Fail
			why := "ntmon gives no reason"
			if ps, ok := peers[p.Host]; ok && ps.Why != "" {
				why = ps.Why
			}
			r.Detail = fmt.Sprintf("NTB link %s to %s %s: %s", p.Link, p.Host, l.State, why)
			r.Fix = fmt.Sprintf("the link comes up when ntproxy on %s opens its end: systemctl status ntproxy there; ntmon status shows the peer's state", p.Host)
		}
		rs = append(rs, r)
	}
	return rs
}
