package monitor

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// WriteStatus prints st as the tables of `ntmon status`: links,
// partitions, peers, listeners, applications and connections (with the
// path each took and why). Byte counts are exact, for grep and diff.
func WriteStatus(w io.Writer, st *ctlapi.Status) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	section := func(title string, header ...string) {
		fmt.Fprintf(tw, "\n%s\n", title)
		fmt.Fprintln(tw, strings.Join(header, "\t"))
	}
	row := func(cols ...any) {
		s := make([]string, len(cols))
		for i, c := range cols {
			s[i] = cell(c)
		}
		fmt.Fprintln(tw, strings.Join(s, "\t"))
	}

	if strings.HasPrefix(st.Security, "WARNING") {
		fmt.Fprintf(tw, "%s\n", st.Security)
	}
	fmt.Fprintf(tw, "host %s, ntmon %s, peer protocol %d\n", st.Host, st.Version, ProtocolVersion)
	if st.Security != "" && !strings.HasPrefix(st.Security, "WARNING") {
		fmt.Fprintf(tw, "security: %s\n", st.Security)
	}
	fmt.Fprintf(tw, "rdma: %s\n", cell(st.RDMA))
	if st.Scope != "" {
		fmt.Fprintf(tw, "view: %s\n", st.Scope)
	}
	snap := st.Proxy
	if snap == nil {
		fmt.Fprintf(tw, "ntproxy: not reachable (%s)\n", st.ProxyErr)
	}

	section("LINKS", "NAME", "PEER", "STATE", "WINDOW", "PARTITIONS")
	if snap != nil {
		for _, l := range snap.Links {
			row(l.Name, l.Peer, l.State, sizeString(l.Window), len(l.Partitions))
		}
	} else {
		for _, p := range st.Peers {
			if p.Link != "" {
				row(p.Link, p.Host, "unknown (no ntproxy)", sizeString(p.Window), p.Partitions)
			}
		}
	}

	section("PARTITIONS", "LINK", "PARTITION", "CONNS", "BYTES-TX", "BYTES-RX", "MSGS-TX", "MSGS-RX")
	if snap != nil {
		for _, l := range snap.Links {
			for _, p := range l.Partitions {
				row(l.Name, p.Index, p.Conns, p.BytesTX, p.BytesRX, p.MsgsTX, p.MsgsRX)
			}
		}
	}

	section("PEERS", "HOST", "CONTROL", "STATE", "LINK", "PROTOCOL", "CAPS", "RDMA", "LAST-SEEN", "WHY")
	for _, p := range st.Peers {
		state := "down"
		if p.Up {
			state = "up"
		}
		last := "never"
		if !p.LastSeen.IsZero() {
			last = p.LastSeen.Format(time.TimeOnly)
		}
		version := "-"
		if p.Version != 0 {
			version = strconv.Itoa(p.Version)
		}
		row(p.Host, p.Control, state, p.Link, version, strings.Join(p.Caps, ","), rdmaCell(p.RDMA), last, p.Why)
	}

	section("LISTENERS", "PORT", "UID", "PID", "APP", "BACKLOG")
	type listener struct {
		entry   *ctlapi.ListenEntry
		stat    *ctlapi.ListenStat
		appName string
	}
	byPort := map[int]*listener{}
	for i := range st.Listening {
		e := &st.Listening[i]
		byPort[e.Port] = &listener{entry: e}
	}
	var appName func(uint64) string
	if snap != nil {
		appName = appLabel(snap)
		for i := range snap.Listeners {
			ls := &snap.Listeners[i]
			l := byPort[ls.Port]
			if l == nil {
				l = &listener{}
				byPort[ls.Port] = l
			}
			l.stat, l.appName = ls, appName(ls.App)
		}
	}
	ports := make([]int, 0, len(byPort))
	for p := range byPort {
		ports = append(ports, p)
	}
	sort.Ints(ports)
	for _, port := range ports {
		l := byPort[port]
		uid, pid, app, backlog := "-", "-", "-", "-"
		if l.entry != nil {
			uid, pid = strconv.Itoa(l.entry.UID), strconv.Itoa(l.entry.PID)
		}
		if l.stat != nil {
			app, backlog = l.appName, strconv.Itoa(l.stat.Backlog)
		}
		row(port, uid, pid, app, backlog)
	}

	section("APPLICATIONS", "ID", "NAME", "PID", "UID", "CONNS", "MEMORY")
	if snap != nil {
		for _, a := range snap.Apps {
			row(a.ID, a.Name, a.PID, a.UID, a.Conns, sizeString(int(a.Memory)))
		}
	}

	section("CONNECTIONS", "ID", "APP", "LOCAL", "REMOTE", "DIR", "PATH", "MODE", "REASON", "BYTES-TX", "BYTES-RX")
	if snap != nil {
		for _, c := range snap.Conns {
			path := c.Path
			if c.Link != "" {
				path = fmt.Sprintf("%s(%s/%d)", c.Path, c.Link, c.Partition)
			}
			row(c.ID, appName(c.App), c.Local, c.Remote, c.Dir, path, c.Mode, c.Reason, c.BytesTX, c.BytesRX)
		}
	}

	if snap != nil && len(snap.Gateway) > 0 {
		section("GATEWAY", "KIND", "LISTEN", "TO", "MODE", "ACTIVE", "TOTAL", "FAILED", "REDIRECTS", "BYTES-IN", "BYTES-OUT", "LAST-ERROR")
		for _, g := range snap.Gateway {
			row(g.Kind, g.Listen, g.To, g.Mode, g.Active, g.Total, g.Failed, g.Redirects, g.BytesIn, g.BytesOut, g.LastError)
		}
	}

	if snap != nil && len(snap.Trunks) > 0 {
		section("TRUNKS", "PEER", "ROLE", "STATE", "LINK", "PORTS", "CONNS", "ERROR")
		for _, t := range snap.Trunks {
			ports := make([]string, len(t.Ports))
			for i, p := range t.Ports {
				ports[i] = strconv.Itoa(p)
			}
			row(t.Peer, t.Role, t.State, t.Link, strings.Join(ports, ","), t.Conns, t.Error)
		}
	}
	return tw.Flush()
}

// appLabel names an application "name[id]", or by ID alone.
func appLabel(snap *ctlapi.Snapshot) func(uint64) string {
	names := make(map[uint64]string, len(snap.Apps))
	for _, a := range snap.Apps {
		names[a.ID] = a.Name
	}
	return func(id uint64) string {
		if n := names[id]; n != "" {
			return fmt.Sprintf("%s[%d]", n, id)
		}
		return strconv.FormatUint(id, 10)
	}
}

// cell formats one table cell: "-" for empty, tabs and newlines flattened
// so that a peer-supplied string cannot break the table.
func cell(v any) string {
	s := fmt.Sprint(v)
	if s == "" {
		return "-"
	}
	return strings.Map(func(r rune) rune {
		if r == '\t' || r == '\n' || r == '\r' {
			return ' '
		}
		return r
	}, s)
}

// sizeString formats a byte size in binary units ("16MiB"); 0 is "-".
func sizeString(n int) string {
	switch {
	case n <= 0:
		return "-"
	case n%(1<<30) == 0:
		return fmt.Sprintf("%dGiB", n>>30)
	case n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return strconv.Itoa(n) + "B"
}

// rdmaCell is a peer's RDMA listener, or "none" (its reason is long; the
// JSON status has it).
func rdmaCell(s string) string {
	if s == "" || strings.HasPrefix(s, "none") {
		return "none"
	}
	return s
}
