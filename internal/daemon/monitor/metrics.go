package monitor

import (
	"context"
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// MetricsNamespace prefixes every ntstack series.
const MetricsNamespace = "ntstack"

// collector builds the ntstack_ series at each scrape from the peer table,
// the port reservations and ntproxy's snapshot: the proxy's counters live
// in the proxy, and copying them into client_golang's own counters would
// only add a second, staler copy.
type collector struct {
	m *Monitor

	info, peerUp, peerLastSeen, proxyUp, listening        *prometheus.Desc
	linkUp, linkWindow                                    *prometheus.Desc
	partConns, partTXBytes, partRXBytes, partTX, partRX   *prometheus.Desc
	connTXBytes, connRXBytes, connTX, connRX              *prometheus.Desc
	connQueue, connDrops, connSwitches, pathSwitches      *prometheus.Desc
	gwActive, gwTotal, gwFailed, gwIn, gwOut, gwRedirects *prometheus.Desc
	trunkUp, trunkConns                                   *prometheus.Desc
}

var _ prometheus.Collector = (*collector)(nil)

func newCollector(m *Monitor) *collector {
	d := func(sub, name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(MetricsNamespace, sub, name), help, labels, nil)
	}
	link := []string{"link", "partition"}
	conn := []string{"id", "app", "remote", "path", "mode"}
	gw := []string{"kind", "listen", "to"}
	return &collector{
		m:            m,
		info:         d("monitor", "info", "ntmon build and peer protocol version (always 1).", "host", "version", "protocol"),
		peerUp:       d("peer", "up", "1 while the control-plane session with the rack peer is up.", "peer"),
		peerLastSeen: d("peer", "last_seen_timestamp_seconds", "When the peer's last frame arrived (Unix time; 0 = never).", "peer"),
		proxyUp:      d("proxy", "up", "1 if ntproxy's snapshot could be read for this scrape.", "host"),
		listening:    d("monitor", "reserved_ports", "Ports reserved through ntmon's listen API."),
		linkUp:       d("link", "up", "1 while ntproxy reports the NTB link up.", "link", "peer"),
		linkWindow:   d("link", "window_bytes", "Size of the link's window, each side.", "link", "peer"),
		partConns:    d("partition", "conns", "Connections placed on the partition.", link...),
		partTXBytes:  d("partition", "tx_bytes_total", "Payload bytes sent on the partition.", link...),
		partRXBytes:  d("partition", "rx_bytes_total", "Payload bytes received on the partition.", link...),
		partTX:       d("partition", "tx_messages_total", "Messages sent on the partition.", link...),
		partRX:       d("partition", "rx_messages_total", "Messages received on the partition.", link...),
		connTXBytes:  d("conn", "tx_bytes_total", "Payload bytes sent on the connection.", conn...),
		connRXBytes:  d("conn", "rx_bytes_total", "Payload bytes received on the connection.", conn...),
		connTX:       d("conn", "tx_messages_total", "Messages sent on the connection.", conn...),
		connRX:       d("conn", "rx_messages_total", "Messages received on the connection.", conn...),
		connQueue:    d("conn", "queue_bytes", "Bytes buffered for the connection in ntproxy.", conn...),
		connDrops:    d("conn", "drops_total", "Bytes dropped on the connection: always 0, ntstack never drops.", conn...),
		connSwitches: d("conn", "path_switches_total", "Transport changes of the connection (failover to RDMA or TCP, back to the NTB).", conn...),
		pathSwitches: d("proxy", "path_switches_total", "Transport changes of every connection since ntproxy started.", "host"),
		gwActive:     d("gateway", "conns", "Connections the TCP gateway service carries now.", gw...),
		gwTotal:      d("gateway", "conns_total", "Connections the TCP gateway service accepted.", gw...),
		gwFailed:     d("gateway", "failed_total", "Accepted connections whose other side could not be reached.", gw...),
		gwIn:         d("gateway", "in_bytes_total", "Bytes from the TCP side onto the fabric.", gw...),
		gwOut:        d("gateway", "out_bytes_total", "Bytes from the fabric to the TCP side.", gw...),
		gwRedirects:  d("gateway", "redirects_total", "Connects the eBPF redirect sent to the forward.", gw...),
		trunkUp:      d("gateway", "trunk_up", "1 if the gateway's trunk to the peer is up.", "peer", "role"),
		trunkConns:   d("gateway", "trunk_conns", "Connections the gateway's trunk carries now.", "peer", "role"),
	}
}

// Describe sends every descriptor.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{
		c.info, c.peerUp, c.peerLastSeen, c.proxyUp, c.listening, c.linkUp, c.linkWindow,
		c.partConns, c.partTXBytes, c.partRXBytes, c.partTX, c.partRX,
		c.connTXBytes, c.connRXBytes, c.connTX, c.connRX, c.connQueue, c.connDrops, c.connSwitches, c.pathSwitches,
		c.gwActive, c.gwTotal, c.gwFailed, c.gwIn, c.gwOut, c.gwRedirects, c.trunkUp, c.trunkConns,
	} {
		ch <- d
	}
}

// Collect reads the peer table and ntproxy's snapshot. A label set the
// snapshot repeats is reported once: a duplicate would fail the scrape.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	seen := make(map[string]bool)
	emit := func(d *prometheus.Desc, t prometheus.ValueType, v float64, labels ...string) {
		key := d.String() + "\x00" + strings.Join(labels, "\x00")
		if seen[key] {
			return
		}
		seen[key] = true
		ch <- prometheus.MustNewConstMetric(d, t, v, labels...)
	}
	emit(c.info, prometheus.GaugeValue, 1, m.cfg.Host, m.opts.Version, strconv.Itoa(ProtocolVersion))
	for _, p := range m.peerStatus() {
		emit(c.peerUp, prometheus.GaugeValue, b2f(p.Up), p.Host)
		var last float64
		if !p.LastSeen.IsZero() {
			last = float64(p.LastSeen.UnixNano()) / 1e9
		}
		emit(c.peerLastSeen, prometheus.GaugeValue, last, p.Host)
	}
	emit(c.listening, prometheus.GaugeValue, float64(len(m.ports.list())))

	snap, err := m.snapshot(context.Background())
	emit(c.proxyUp, prometheus.GaugeValue, b2f(err == nil), m.cfg.Host)
	if err != nil {
		return
	}
	for _, l := range snap.Links {
		emit(c.linkUp, prometheus.GaugeValue, b2f(l.State == "up"), l.Name, l.Peer)
		emit(c.linkWindow, prometheus.GaugeValue, float64(l.Window), l.Name, l.Peer)
		for _, p := range l.Partitions {
			lv := []string{l.Name, strconv.Itoa(p.Index)}
			emit(c.partConns, prometheus.GaugeValue, float64(p.Conns), lv...)
			emit(c.partTXBytes, prometheus.CounterValue, float64(p.BytesTX), lv...)
			emit(c.partRXBytes, prometheus.CounterValue, float64(p.BytesRX), lv...)
			emit(c.partTX, prometheus.CounterValue, float64(p.MsgsTX), lv...)
			emit(c.partRX, prometheus.CounterValue, float64(p.MsgsRX), lv...)
		}
	}
	apps := appNames(snap)
	for _, cs := range snap.Conns {
		lv := []string{strconv.FormatUint(cs.ID, 10), apps(cs.App), cs.Remote, cs.Path, cs.Mode}
		emit(c.connTXBytes, prometheus.CounterValue, float64(cs.BytesTX), lv...)
		emit(c.connRXBytes, prometheus.CounterValue, float64(cs.BytesRX), lv...)
		emit(c.connTX, prometheus.CounterValue, float64(cs.MsgsTX), lv...)
		emit(c.connRX, prometheus.CounterValue, float64(cs.MsgsRX), lv...)
		emit(c.connQueue, prometheus.GaugeValue, float64(cs.QueueDepth), lv...)
		emit(c.connDrops, prometheus.CounterValue, float64(cs.Drops), lv...)
		emit(c.connSwitches, prometheus.CounterValue, float64(cs.Switches), lv...)
	}
	emit(c.pathSwitches, prometheus.CounterValue, float64(snap.PathSwitches), m.cfg.Host)
	for _, g := range snap.Gateway {
		lv := []string{g.Kind, g.Listen, g.To}
		emit(c.gwActive, prometheus.GaugeValue, float64(g.Active), lv...)
		emit(c.gwTotal, prometheus.CounterValue, float64(g.Total), lv...)
		emit(c.gwFailed, prometheus.CounterValue, float64(g.Failed), lv...)
		emit(c.gwIn, prometheus.CounterValue, float64(g.BytesIn), lv...)
		emit(c.gwOut, prometheus.CounterValue, float64(g.BytesOut), lv...)
		emit(c.gwRedirects, prometheus.CounterValue, float64(g.Redirects), lv...)
	}
	for _, t := range snap.Trunks {
		emit(c.trunkUp, prometheus.GaugeValue, b2f(t.State == "up"), t.Peer, t.Role)
		emit(c.trunkConns, prometheus.GaugeValue, float64(t.Conns), t.Peer, t.Role)
	}
}

// appNames returns a function naming an application ID as "name" (or
// the ID when the snapshot has no name for it).
func appNames(snap *ctlapi.Snapshot) func(uint64) string {
	names := make(map[uint64]string, len(snap.Apps))
	for _, a := range snap.Apps {
		if a.Name != "" {
			names[a.ID] = a.Name
		}
	}
	return func(id uint64) string {
		if n, ok := names[id]; ok {
			return n
		}
		return strconv.FormatUint(id, 10)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// metricsHandler serves /metrics from a private registry: the ntstack_
// collector plus the Go runtime's and the process's standard series.
func (m *Monitor) metricsHandler() http.Handler {
	reg := prometheus.NewRegistry()
	reg.MustRegister(newCollector(m),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      reg,
	}))
	return mux
}
