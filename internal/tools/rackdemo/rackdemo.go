// Package rackdemo runs the rack-scale workloads — a Redis-protocol
// key-value store under a YCSB load, and net/http file serving — between
// two hosts of an emulated rack through their ntproxy daemons, and the
// same workloads over TCP loopback in the same run, and reports them side
// by side. `ntrack demo` (make demo) prints it; the integration tests
// check it.
//
// The server applications attach to host b's ntproxy, the clients to host
// a's. In proxy mode every byte crosses a's proxy, the NTB link and b's
// proxy; in shared-pool mode each application writes and reads a slot of a
// pool it shares with its proxy, which sends from and receives into it;
// in direct mode the proxies grant each connection a link of its
// own and the bytes go from application to application. Both
// applications live in the calling process (attached separately, each
// with its own memory link); the TCP baseline runs the same server and
// client code on 127.0.0.1, and with Options.RelayCmd the same code runs
// over TCP through two plain relay processes in the two ntproxys' place,
// the ceiling of a path through two user-space daemons (relay.go).
package rackdemo

import (
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/tools/workload"
	"github.com/ntstack/ntstack/socklike"
)

// Options size the run.
type Options struct {
	Records    int           // KV keys (default 10000)
	Clients    int           // concurrent KV clients (default 4)
	KVTime     time.Duration // per KV workload and transport (default 2s)
	HTTPSizes  []int         // file sizes (default 8 KiB, 1 MiB, 32 MiB)
	HTTPTime   time.Duration // per size and transport (default 2s)
	HTTPConc   int           // concurrent HTTP clients (default 2)
	Seed       uint64
	ServerHost *config.Config // the host the servers attach to (b)
	ClientHost *config.Config // the host the clients attach to (a)
	// Transports names the transports to run, of "proxy", "pool",
	// "direct", "relay" and "tcp" (default: all, in that order; "relay"
	// only with RelayCmd).
	Transports []string
	// RelayCmd, if set, is the command line (program and leading
	// arguments) of a process running RelayMain, "ntrack relay": the
	// "relay" transport runs the TCP baseline's code through two such
	// relays in place of the two ntproxys, the ceiling of a path through
	// two user-space daemons.
	RelayCmd []string
}

func (o *Options) setDefaults() {
	if o.Records == 0 {
		o.Records = 10000
	}
	if o.Clients == 0 {
		o.Clients = 4
	}
	if o.KVTime == 0 {
		o.KVTime = 2 * time.Second
	}
	if len(o.HTTPSizes) == 0 {
		o.HTTPSizes = []int{8 << 10, 1 << 20, 32 << 20}
	}
	if o.HTTPTime == 0 {
		o.HTTPTime = 2 * time.Second
	}
	if o.HTTPConc == 0 {
		o.HTTPConc = 2
	}
	if o.Seed == 0 {
		o.Seed = 20261123
	}
}

// Result is one run: the KV and HTTP results per transport.
type Result struct {
	KV   []KVRow
	HTTP []HTTPRow
}

// KVRow is one YCSB workload over one transport.
type KVRow struct {
	Transport string
	Path      string // the path socklike reported ("tcp" for the baseline)
	workload.YCSBResult
}

// HTTPRow is one file size over one transport.
type HTTPRow struct {
	Transport string
	Path      string
	workload.HTTPResult
}

// transport is one way to serve and dial.
type transport struct {
	name   string
	listen func(port int) (net.Listener, error)
	dial   workload.DialFunc
	host   func(port int) string // the address clients dial
	path   func(c net.Conn) string
}

// Run runs every workload over the rack and over TCP loopback.
func Run(ctx context.Context, o Options) (Result, error) {
	o.setDefaults()
	srv, err := socklike.AttachProxy(o.ServerHost.Path(config.ProxySocket), socklike.Config{})
	if err != nil {
		return Result{}, fmt.Errorf("server application: %w", err)
	}
	defer srv.Close()
	cli, err := socklike.AttachProxy(o.ClientHost.Path(config.ProxySocket), socklike.Config{})
	if err != nil {
		return Result{}, fmt.Errorf("client application: %w", err)
	}
	defer cli.Close()
	listen := func(pool bool) func(port int) (net.Listener, error) {
		lc := socklike.ListenConfig{Proxy: srv, Pool: pool}
		return func(port int) (net.Listener, error) { return lc.Listen(ctx, "tcp", fmt.Sprintf(":%d", port)) }
	}
	direct := &socklike.Dialer{Proxy: cli, Direct: true}
	directT := transport{
		name:   "ntstack direct (a → NTB → b)",
		listen: listen(false),
		dial:   direct.DialContext,
		host:   func(port int) string { return fmt.Sprintf("%s:%d", o.ServerHost.Host, port) },
		path:   func(c net.Conn) string { return c.(*socklike.Conn).Route().Path + "-direct" },
	}
	rackT := transport{
		name:   "ntstack proxy (a → ntproxy → NTB → ntproxy → b)",
		listen: listen(false),
		dial:   (&socklike.Dialer{Proxy: cli}).DialContext,
		host:   func(port int) string { return fmt.Sprintf("%s:%d", o.ServerHost.Host, port) },
		path:   func(c net.Conn) string { return c.(*socklike.Conn).Route().Path },
	}
	pooled := &socklike.Dialer{Proxy: cli, Pool: true}
	poolT := transport{
		name:   "ntstack shared pool (a → ntproxy → NTB → ntproxy → b, in place)",
		listen: listen(true),
		dial:   pooled.DialContext,
		host:   func(port int) string { return fmt.Sprintf("%s:%d", o.ServerHost.Host, port) },
		path:   routePath,
	}
	var tcpAddr string
	tcpT := transport{
		name: "tcp loopback",
		listen: func(int) (net.Listener, error) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err == nil {
				tcpAddr = ln.Addr().String()
			}
			return ln, err
		},
		dial: (&net.Dialer{}).DialContext,
		host: func(int) string { return tcpAddr },
		path: func(net.Conn) string { return "tcp" },
	}
	all := map[string]transport{"proxy": rackT, "pool": poolT, "direct": directT, "tcp": tcpT}
	known := []string{"proxy", "pool", "direct", "tcp"}
	if o.RelayCmd != nil {
		all["relay"] = relayTransport(ctx, o.RelayCmd)
		known = []string{"proxy", "pool", "direct", "relay", "tcp"}
	}
	names := known
	if len(o.Transports) > 0 {
		names = o.Transports
	}
	var run []transport
	for _, name := range names {
		t, ok := all[name]
		if !ok {
			return Result{}, fmt.Errorf("unknown transport %q (want one of %s)", name, strings.Join(known, ", "))
		}
		run = append(run, t)
	}
	var res Result
	for _, t := range run {
		rows, err := runKV(ctx, t, o)
		res.KV = append(res.KV, rows...)
		if err != nil {
			return res, fmt.Errorf("kv over %s: %w", t.name, err)
		}
		hrows, err := runHTTP(ctx, t, o)
		res.HTTP = append(res.HTTP, hrows...)
		if err != nil {
			return res, fmt.Errorf("http over %s: %w", t.name, err)
		}
	}
	return res, nil
}

// routePath names a rack connection's path and mode.
func routePath(c net.Conn) string {
	sc, ok := c.(*socklike.Conn)
	if !ok {
		return fmt.Sprintf("%T", c)
	}
	if r := sc.Route(); r.Mode == "pool" {
		return r.Path + "-pool"
	}
	return sc.Route().Path
}

// probe dials addr once to learn the connection's path.
func probe(ctx context.Context, t transport, addr string) (string, error) {
	c, err := t.dial(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return t.path(c), nil
}

func runKV(ctx context.Context, t transport, o Options) ([]KVRow, error) {
	ln, err := t.listen(6379)
	if err != nil {
		return nil, err
	}
	kv := workload.NewKV()
	go kv.Serve(ln)
	defer kv.Close()
	addr := t.host(6379)
	path, err := probe(ctx, t, addr)
	if err != nil {
		return nil, err
	}
	var rows []KVRow
	for i, w := range []string{"A", "B"} {
		r, err := workload.RunYCSB(ctx, workload.YCSBConfig{
			Dial: t.dial, Addr: addr, Records: o.Records, Clients: o.Clients,
			Duration: o.KVTime, Workload: w, Seed: o.Seed + uint64(i),
		})
		rows = append(rows, KVRow{Transport: t.name, Path: path, YCSBResult: r})
		if err != nil {
			return rows, err
		}
		// A fresh load for the next workload: version counters restart.
		if _, err := kvFlush(ctx, t, addr); err != nil {
			return rows, err
		}
	}
	return rows, nil
}

// kvFlush empties the store with a raw FLUSHALL.
func kvFlush(ctx context.Context, t transport, addr string) (string, error) {
	c, err := t.dial(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if _, err := io.WriteString(c, "*1\r\n$8\r\nFLUSHALL\r\n"); err != nil {
		return "", err
	}
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	return string(buf[:n]), err
}

func runHTTP(ctx context.Context, t transport, o Options) ([]HTTPRow, error) {
	ln, err := t.listen(8080)
	if err != nil {
		return nil, err
	}
	fs := workload.NewFileServer(o.HTTPSizes, o.Seed)
	go fs.Serve(ln)
	defer fs.Close()
	addr := t.host(8080)
	path, err := probe(ctx, t, addr)
	if err != nil {
		return nil, err
	}
	var rows []HTTPRow
	for _, size := range o.HTTPSizes {
		r, err := workload.RunHTTP(ctx, workload.HTTPConfig{
			Dial: t.dial, BaseURL: "http://" + addr, Size: size, Seed: o.Seed,
			Duration: o.HTTPTime, Concurrency: o.HTTPConc,
		})
		rows = append(rows, HTTPRow{Transport: t.name, Path: path, HTTPResult: r})
		if err != nil {
			return rows, err
		}
	}
	return rows, nil
}

// Print writes the result as two tables and the ratios against TCP.
func (r Result) Print(w io.Writer) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KV (RESP, go-redis, YCSB)\tpath\tworkload\tops/s\tp50\tp99\tmax\terrors")
	for _, k := range r.KV {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t%v\t%v\t%v\t%d\n", k.Transport, k.Path, k.Workload, k.OpsPerSec,
			round(k.All.P50), round(k.All.P99), round(k.All.Max), k.Errors+k.VerifyErrors)
	}
	fmt.Fprintln(tw)
	fmt.Fprintln(tw, "HTTP (net/http file serving)\tpath\tsize\treq/s\tMB/s\tp50\tp99\terrors")
	for _, h := range r.HTTP {
		rps := 0.0
		if h.Elapsed > 0 {
			rps = float64(h.Requests) / h.Elapsed.Seconds()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t%.0f\t%v\t%v\t%d\n", h.Transport, h.Path, size(h.Size), rps, h.MBPerSec,
			round(h.Latency.P50), round(h.Latency.P99), h.Errors+h.VerifyErrors)
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, k := range r.KV {
		if k.Path == "tcp" {
			continue
		}
		var tcp, relay float64
		for _, b := range r.KV {
			if b.Workload != k.Workload || b.All.P50 <= 0 || k.All.P50 <= 0 {
				continue
			}
			switch b.Path {
			case "tcp":
				tcp = k.OpsPerSec / b.OpsPerSec
				fmt.Fprintf(w, "KV workload %s over %s: p50 %.2fx TCP's, throughput %.2fx TCP's", k.Workload, k.Path,
					float64(k.All.P50)/float64(b.All.P50), tcp)
			case RelayPath:
				relay = k.OpsPerSec / b.OpsPerSec
			}
		}
		printRelay(w, k.Path, tcp, relay)
	}
	for _, h := range r.HTTP {
		if h.Path == "tcp" {
			continue
		}
		var tcp, relay float64
		for _, b := range r.HTTP {
			if b.Size != h.Size || b.Latency.P50 <= 0 || h.Latency.P50 <= 0 {
				continue
			}
			switch b.Path {
			case "tcp":
				tcp = h.MBPerSec / b.MBPerSec
				fmt.Fprintf(w, "HTTP %s over %s: p50 %.2fx TCP's, throughput %.2fx TCP's", size(h.Size), h.Path,
					float64(h.Latency.P50)/float64(b.Latency.P50), tcp)
			case RelayPath:
				relay = h.MBPerSec / b.MBPerSec
			}
		}
		printRelay(w, h.Path, tcp, relay)
	}
}

// printRelay ends a ratio line: with the relays' throughput against the
// row's, unless the row is the relays' own or they did not run.
func printRelay(w io.Writer, path string, tcp, relay float64) {
	switch {
	case tcp == 0:
		return
	case path != RelayPath && relay > 0:
		fmt.Fprintf(w, ", %.2fx the relays'\n", relay)
	default:
		fmt.Fprintln(w)
	}
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	case d >= time.Microsecond:
		return d.Round(100 * time.Nanosecond)
	}
	return d
}

func size(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}
