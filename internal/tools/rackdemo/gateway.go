package rackdemo

import (
	"bufio"
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/tools/rack"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// The gateway services GatewayConfigure sets up: the client host forwards
// these local TCP ports to the server host's exported rack ports, which
// lead to redis-server and nginx on the server host.
const (
	RedisForward  = "127.0.0.1:16379"
	RedisRackPort = 7379 // the exported rack port leading to redis-server
	HTTPForward   = "127.0.0.1:18080"
	HTTPRackPort  = 7080 // the exported rack port leading to nginx
	redisPort     = 6379 // redis-server's TCP port on the server host
	nginxPort     = 8080 // nginx's TCP port on the server host
)

// GatewayTools are the unmodified programs RunGateway drives, from
// Debian's redis-server, redis-tools, nginx-light and wrk.
var GatewayTools = []string{"redis-server", "redis-benchmark", "redis-cli", "nginx", "wrk"}

// GatewayConfigure returns a rack.Spec.Configure that gives client the
// forwards and server the exports of RunGateway, in gateway mode mode
// ("": the default).
func GatewayConfigure(client, server, mode string) func(*config.Config) {
	return func(c *config.Config) {
		c.Gateway.Mode = mode
		switch c.Host {
		case client:
			c.Gateway.Forward = append(c.Gateway.Forward,
				config.Forward{Listen: RedisForward, To: net.JoinHostPort(server, strconv.Itoa(RedisRackPort))},
				config.Forward{Listen: HTTPForward, To: net.JoinHostPort(server, strconv.Itoa(HTTPRackPort))})
		case server:
			c.Gateway.Export = append(c.Gateway.Export,
				config.Export{Port: RedisRackPort, Target: net.JoinHostPort("127.0.0.1", strconv.Itoa(redisPort))},
				config.Export{Port: HTTPRackPort, Target: net.JoinHostPort("127.0.0.1", strconv.Itoa(nginxPort))})
		}
	}
}

// GatewayOptions size RunGateway.
type GatewayOptions struct {
	Client, Server string
	// Requests per redis-benchmark test (default 20000).
	Requests int
	// Clients is redis-benchmark's and wrk's connection count (default 8).
	Clients int
	// OneClient adds a row of one redis-benchmark client's GETs a path:
	// the round trip of a 64 B request alone.
	OneClient bool
	// BesideBulk adds a row of one client's GETs while wrk loads the
	// 1 MiB file over the same path: a small request's wait behind bulk
	// responses (on the gateway, carried on the same trunk).
	BesideBulk bool
	// WrkTime is each wrk run's duration (default 2s; wrk counts whole
	// seconds, so it is rounded up to one).
	WrkTime time.Duration
	// RelayCmd, if set, is the command line (program and leading
	// arguments) of a process running RelayMain, "ntrack relay": the
	// table then also measures two plain TCP relays in place of the
	// gateways, the ceiling of two user-space hops.
	RelayCmd []string
	// Then, if set, runs after the measurements, while the servers still
	// serve.
	Then func(ctx context.Context) error
}

// GatewayRow is one load run: a tool's test over one path.
type GatewayRow struct {
	Tool     string  // "redis-benchmark" or "wrk"
	Test     string  // "SET", "GET", "GET c=1", "GET /4k", ...
	Path     string  // "gateway" (over the fabric), "relay" (two TCP relays) or "tcp" (the rack's network)
	Rate     float64 // requests per second
	P50, P99 time.Duration
	// CPU is the CPU time a request cost the load tool, the server and
	// the path's processes (both ntproxys, or both relays) together; 0 if
	// not measured.
	CPU time.Duration
}

// RunGateway starts redis-server and nginx on the server host, then runs
// redis-benchmark and wrk on the client host over each path: through the
// gateway (127.0.0.1 forwards, carried over the NTB link), through two TCP
// relays if o.RelayCmd is set, and straight to the server host's TCP
// address over the rack's network. The rack must have been started with
// GatewayConfigure. It checks a SET/GET through the gateway with
// redis-cli before measuring.
func RunGateway(ctx context.Context, r *rack.Rack, o GatewayOptions) (rows []GatewayRow, err error) {
	if o.Requests == 0 {
		o.Requests = 20000
	}
	if o.Clients == 0 {
		o.Clients = 8
	}
	if o.WrkTime == 0 {
		o.WrkTime = 2 * time.Second
	}
	for _, tool := range GatewayTools {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("gateway demo: %s not installed (make rackdeps installs it)", tool)
		}
	}
	srv := r.Host(o.Server)
	if srv == nil || r.Host(o.Client) == nil {
		return nil, fmt.Errorf("gateway demo: rack has no host %q or %q", o.Server, o.Client)
	}
	dir, err := os.MkdirTemp("", "ntstack-gwdemo-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	stop, servers, err := startServers(ctx, r, o.Server, dir)
	defer func() { err = errors.Join(err, stop()) }()
	if err != nil {
		return nil, err
	}
	if err := waitGateway(ctx, r, o.Client, o.Server); err != nil {
		return nil, err
	}
	if err := redisCheck(ctx, r, o.Client); err != nil {
		return nil, err
	}
	type path struct {
		name, redis, http string
		pids              []int // the path's own processes
	}
	tcpAddr := func(port int) string { return net.JoinHostPort(srv.IP.String(), strconv.Itoa(port)) }
	// Each ntproxy's gateway process is its child: cpuOf counts it.
	paths := []path{{"gateway", RedisForward, HTTPForward, []int{r.Pid(o.Client, "ntproxy"), r.Pid(o.Server, "ntproxy")}}}
	if o.RelayCmd != nil {
		stopRelays, pids, err := startRelays(ctx, r, o, srv.IP.String())
		defer func() { err = errors.Join(err, stopRelays()) }()
		if err != nil {
			return nil, err
		}
		local := func(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(relayPorts[port][0])) }
		paths = append(paths, path{"relay", local(redisPort), local(nginxPort), pids})
	}
	paths = append(paths, path{"tcp", tcpAddr(redisPort), tcpAddr(nginxPort), nil})
	for _, p := range paths {
		pids := append(append([]int(nil), servers...), p.pids...)
		runs := []struct {
			test    string
			clients int
		}{{"set", o.Clients}, {"get", o.Clients}}
		if o.OneClient {
			runs = append(runs, runs[1])
			runs[2].clients = 1
		}
		for _, run := range runs {
			row, err := redisBenchmark(ctx, r, o, p.redis, run.test, run.clients, pids)
			if err != nil {
				return rows, fmt.Errorf("redis-benchmark over %s: %w", p.name, err)
			}
			row.Path = p.name
			rows = append(rows, row)
		}
		for _, file := range []string{"4k", "1m"} {
			row, err := wrk(ctx, r, o, "http://"+p.http+"/"+file, pids)
			if err != nil {
				return rows, fmt.Errorf("wrk over %s: %w", p.name, err)
			}
			row.Test, row.Path = "GET /"+file, p.name
			rows = append(rows, row)
		}
		if o.BesideBulk {
			row, err := besideBulk(ctx, r, o, p.redis, "http://"+p.http+"/1m")
			if err != nil {
				return rows, fmt.Errorf("redis-benchmark beside wrk over %s: %w", p.name, err)
			}
			row.Path = p.name
			rows = append(rows, row)
		}
	}
	if o.Then != nil {
		return rows, o.Then(ctx)
	}
	return rows, nil
}

// startRelays runs o.RelayCmd on both hosts: the client's relay listens
// on its loopback and dials the server's, which listens on the rack's
// network and dials the servers on its loopback. It returns what stops
// them and their process ids.
func startRelays(ctx context.Context, r *rack.Rack, o GatewayOptions, serverIP string) (func() error, []int, error) {
	var clientArgs, serverArgs []string
	for port, rp := range relayPorts {
		clientArgs = append(clientArgs, fmt.Sprintf("127.0.0.1:%d=%s", rp[0], net.JoinHostPort(serverIP, strconv.Itoa(rp[1]))))
		serverArgs = append(serverArgs, fmt.Sprintf("0.0.0.0:%d=127.0.0.1:%d", rp[1], port))
	}
	var cmds []*exec.Cmd
	stop := func() error {
		for _, c := range cmds {
			c.Process.Signal(syscall.SIGTERM)
		}
		for _, c := range cmds {
			c.Wait()
		}
		return nil
	}
	var pids []int
	for _, h := range []struct {
		host string
		args []string
	}{{o.Server, serverArgs}, {o.Client, clientArgs}} {
		c := r.ExecContext(ctx, h.host, o.RelayCmd[0], append(o.RelayCmd[1:len(o.RelayCmd):len(o.RelayCmd)], h.args...)...)
		c.Stderr = os.Stderr // stdout: the relay's addresses, known here
		c.WaitDelay = 2 * time.Second
		if err := c.Start(); err != nil {
			return stop, nil, fmt.Errorf("start relay on %s: %w", h.host, err)
		}
		cmds = append(cmds, c)
		pids = append(pids, c.Process.Pid)
	}
	for _, rp := range relayPorts {
		if err := waitTCP(ctx, r, o.Server, rp[1]); err != nil {
			return stop, pids, err
		}
		if err := waitTCP(ctx, r, o.Client, rp[0]); err != nil {
			return stop, pids, err
		}
	}
	return stop, pids, nil
}

// startServers runs redis-server and nginx on host, serving files of 4 KiB
// and 1 MiB from dir, and returns what stops them and their process ids.
func startServers(ctx context.Context, r *rack.Rack, host, dir string) (func() error, []int, error) {
	for name, size := range map[string]int{"4k": 4 << 10, "1m": 1 << 20} {
		if err := os.WriteFile(filepath.Join(dir, name), bytes.Repeat([]byte("ntstack\n"), size/8), 0o644); err != nil {
			return func() error { return nil }, nil, err
		}
	}
	conf := fmt.Sprintf(`user root;
worker_processes 1;
daemon off;
pid %[1]s/nginx.pid;
error_log stderr warn;
events { worker_connections 1024; }
http {
	access_log off;
	client_body_temp_path %[1]s;
	proxy_temp_path %[1]s;
	fastcgi_temp_path %[1]s;
	uwsgi_temp_path %[1]s;
	scgi_temp_path %[1]s;
	sendfile on;
	server { listen %[2]d; root %[1]s; }
}
`, dir, nginxPort)
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o644); err != nil {
		return func() error { return nil }, nil, err
	}
	var cmds []*exec.Cmd
	// SIGTERM lets nginx's master stop its worker, which holds the
	// output pipe too; WaitDelay bounds the wait for that pipe.
	stop := func() error {
		for _, c := range cmds {
			c.Process.Signal(syscall.SIGTERM)
		}
		for _, c := range cmds {
			c.Wait()
		}
		return nil
	}
	for _, argv := range [][]string{
		{"redis-server", "--port", strconv.Itoa(redisPort), "--bind", "0.0.0.0", "--protected-mode", "no",
			"--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", dir},
		{"nginx", "-p", dir, "-c", filepath.Join(dir, "nginx.conf")},
	} {
		c := r.ExecContext(ctx, host, argv[0], argv[1:]...)
		var out bytes.Buffer
		c.Stdout, c.Stderr = &out, &out
		c.WaitDelay = 2 * time.Second
		if err := c.Start(); err != nil {
			return stop, nil, fmt.Errorf("start %s: %w", argv[0], err)
		}
		cmds = append(cmds, c)
	}
	for _, port := range []int{redisPort, nginxPort} {
		if err := waitTCP(ctx, r, host, port); err != nil {
			return stop, nil, err
		}
	}
	var pids []int
	for _, c := range cmds {
		pids = append(pids, c.Process.Pid)
	}
	return stop, pids, nil
}

// waitGateway waits until the gateways serve: the server's exports
// listen on their rack ports (its ntproxy lists them) and the client's
// forwards on their TCP ports. Each gateway attaches to its ntproxy after
// the rack is up, so a first connection could otherwise find the rack
// port closed.
func waitGateway(ctx context.Context, r *rack.Rack, client, server string) error {
	c := ctlapi.NewClient(r.Host(server).Config.Path(config.MonitorSocket))
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var st ctlapi.Status
		err := c.Call(ctx, ctlapi.PathStatus, nil, &st)
		if err == nil && st.Proxy != nil {
			ports := map[int]bool{}
			for _, l := range st.Proxy.Listeners {
				ports[l.Port] = true
			}
			if ports[RedisRackPort] && ports[HTTPRackPort] {
				break
			}
			err = fmt.Errorf("exports not listening yet (ports %v)", ports)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("gateway on %s: %w", server, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, addr := range []string{RedisForward, HTTPForward} {
		_, port, _ := net.SplitHostPort(addr)
		p, _ := strconv.Atoi(port)
		if err := waitTCP(ctx, r, client, p); err != nil {
			return fmt.Errorf("gateway forward: %w", err)
		}
	}
	return nil
}

// waitTCP waits until something listens on host's port.
func waitTCP(ctx context.Context, r *rack.Rack, host string, port int) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := r.Enter(host, func() error {
			c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
			if err == nil {
				c.Close()
			}
			return err
		})
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("server on %s:%d: %w", host, port, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// redisCheck sets and reads back a key through the gateway with redis-cli.
func redisCheck(ctx context.Context, r *rack.Rack, client string) error {
	host, port, _ := net.SplitHostPort(RedisForward)
	cli := func(args ...string) (string, error) {
		out, err := r.ExecContext(ctx, client, "redis-cli", append([]string{"-h", host, "-p", port}, args...)...).CombinedOutput()
		return strings.TrimSpace(string(out)), err
	}
	if out, err := cli("SET", "ntstack:gateway", "carried"); err != nil || out != "OK" {
		return fmt.Errorf("redis-cli SET through the gateway: %q, %v", out, err)
	}
	if out, err := cli("GET", "ntstack:gateway"); err != nil || out != "carried" {
		return fmt.Errorf("redis-cli GET through the gateway: %q, %v", out, err)
	}
	return nil
}

// redisBenchmark runs test ("set" or "get") from clients connections
// against addr and parses its CSV; pids are the processes whose CPU the
// requests cost besides redis-benchmark's own.
func redisBenchmark(ctx context.Context, r *rack.Rack, o GatewayOptions, addr, test string, clients int, pids []int) (GatewayRow, error) {
	host, port, _ := net.SplitHostPort(addr)
	n := o.Requests
	if clients == 1 {
		n = max(1, n/4) // one client's round trips: latency, not load
	}
	before := cpuOf(pids)
	cmd := r.ExecContext(ctx, o.Client, "redis-benchmark", "-h", host, "-p", port,
		"-n", strconv.Itoa(n), "-c", strconv.Itoa(clients), "-d", "64", "-r", "10000",
		"-t", test, "--csv")
	out, err := cmd.Output()
	if err != nil {
		return GatewayRow{}, fmt.Errorf("%w: %s", err, out)
	}
	rows, err := parseRedisCSV(out)
	if err != nil {
		return GatewayRow{}, err
	}
	if len(rows) != 1 {
		return GatewayRow{}, fmt.Errorf("redis-benchmark -t %s: %d result rows: %q", test, len(rows), out)
	}
	row := rows[0]
	if clients != o.Clients {
		row.Test += " c=" + strconv.Itoa(clients)
	}
	row.CPU = (cpuOf(pids) - before + processCPU(cmd.ProcessState)) / time.Duration(n)
	return row, nil
}

// besideBulk measures one redis-benchmark client's GETs to redisAddr
// while wrk loads bulkURL with o.Clients connections. wrk is started
// first with time to spare and stopped once redis-benchmark is done; the
// row's CPU is not measured (wrk's share cannot be told apart).
func besideBulk(ctx context.Context, r *rack.Rack, o GatewayOptions, redisAddr, bulkURL string) (GatewayRow, error) {
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	bulk := r.ExecContext(wctx, o.Client, "wrk", "-t1", "-c"+strconv.Itoa(o.Clients), "-d60s", bulkURL)
	if err := bulk.Start(); err != nil {
		return GatewayRow{}, fmt.Errorf("wrk: %w", err)
	}
	row, err := redisBenchmark(ctx, r, o, redisAddr, "get", 1, nil)
	stop()
	bulk.Wait() // killed: its report is not wanted
	row.Test += " beside /1m"
	row.CPU = 0
	return row, err
}

// cpuOf returns the CPU time the processes pids and their descendants
// have used, from /proc (0 for what cannot be read).
func cpuOf(pids []int) time.Duration {
	var total time.Duration
	for _, pid := range pids {
		total += procTreeCPU(pid, 0)
	}
	return total
}

// procTreeCPU returns pid's CPU time and its descendants' (depth bounds
// the walk).
func procTreeCPU(pid, depth int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil || depth > 8 {
		return 0
	}
	// The fields after the command name, which is in parentheses and may
	// hold spaces: state is the first, utime and stime the 12th and 13th.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	total := time.Duration(ut+st) * time.Second / clockTicks
	tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	for _, t := range tasks {
		kids, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, t.Name()))
		for _, k := range strings.Fields(string(kids)) {
			if kid, err := strconv.Atoi(k); err == nil {
				total += procTreeCPU(kid, depth+1)
			}
		}
	}
	return total
}

// clockTicks is the unit of /proc's CPU times (USER_HZ, 100 on Linux).
const clockTicks = 100

// processCPU returns the CPU time of an exited process.
func processCPU(ps *os.ProcessState) time.Duration {
	if ps == nil {
		return 0
	}
	return ps.UserTime() + ps.SystemTime()
}

// parseRedisCSV reads redis-benchmark --csv: a header row naming the
// columns ("test", "rps", "p50_latency_ms", "p99_latency_ms", ...), then a
// row per test.
func parseRedisCSV(out []byte) ([]GatewayRow, error) {
	recs, err := csv.NewReader(bytes.NewReader(out)).ReadAll()
	if err != nil || len(recs) < 2 {
		return nil, fmt.Errorf("redis-benchmark output %q: %v", out, err)
	}
	col := map[string]int{}
	for i, name := range recs[0] {
		col[name] = i
	}
	var rows []GatewayRow
	for _, rec := range recs[1:] {
		num := func(name string) (float64, error) {
			i, ok := col[name]
			if !ok || i >= len(rec) {
				return 0, fmt.Errorf("redis-benchmark output: no %s column", name)
			}
			return strconv.ParseFloat(rec[i], 64)
		}
		rps, err1 := num("rps")
		p50, err2 := num("p50_latency_ms")
		p99, err3 := num("p99_latency_ms")
		if err := errors.Join(err1, err2, err3); err != nil {
			return nil, err
		}
		rows = append(rows, GatewayRow{Tool: "redis-benchmark", Test: rec[col["test"]], Rate: rps,
			P50: time.Duration(p50 * float64(time.Millisecond)), P99: time.Duration(p99 * float64(time.Millisecond))})
	}
	return rows, nil
}

// wrk loads url and parses its report. Any socket error or non-2xx
// response fails the run. pids are the processes whose CPU the requests
// cost besides wrk's own.
func wrk(ctx context.Context, r *rack.Rack, o GatewayOptions, url string, pids []int) (GatewayRow, error) {
	secs := max(1, int((o.WrkTime+time.Second-1)/time.Second))
	before := cpuOf(pids)
	cmd := r.ExecContext(ctx, o.Client, "wrk", "-t1", "-c"+strconv.Itoa(o.Clients),
		"-d"+strconv.Itoa(secs)+"s", "--latency", url)
	out, err := cmd.Output()
	if err != nil {
		return GatewayRow{}, fmt.Errorf("%w: %s", err, out)
	}
	row, requests, err := parseWrk(out)
	if err == nil && requests > 0 {
		row.CPU = (cpuOf(pids) - before + processCPU(cmd.ProcessState)) / time.Duration(requests)
	}
	return row, err
}

// parseWrk reads wrk --latency's report: the "50%" and "99%" lines of the
// latency distribution, "Requests/sec:" and "N requests in ...", which it
// returns too.
func parseWrk(out []byte) (row GatewayRow, requests int64, err error) {
	row = GatewayRow{Tool: "wrk"}
	var seen int
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && (f[0] == "50%" || f[0] == "99%"):
			d, err := time.ParseDuration(f[1])
			if err != nil {
				return row, 0, fmt.Errorf("wrk latency %q: %w", f[1], err)
			}
			if f[0] == "50%" {
				row.P50 = d
			} else {
				row.P99 = d
			}
			seen++
		case len(f) == 2 && f[0] == "Requests/sec:":
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return row, 0, fmt.Errorf("wrk rate %q: %w", f[1], err)
			}
			row.Rate = v
			seen++
		case len(f) >= 3 && f[1] == "requests" && f[2] == "in":
			requests, _ = strconv.ParseInt(f[0], 10, 64)
		case len(f) > 0 && (f[0] == "Non-2xx" || f[0] == "Socket"):
			return row, 0, fmt.Errorf("wrk: %s", sc.Text())
		}
	}
	if seen != 3 {
		return row, 0, fmt.Errorf("wrk output without latency percentiles or rate: %q", out)
	}
	return row, requests, nil
}

// PrintGateway writes rows as a table, each row beside its TCP baseline
// and, where there is one, beside the relays' ceiling.
func PrintGateway(w io.Writer, rows []GatewayRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "tool\ttest\tpath\treq/s\tp50\tp99\tcpu/req\tvs tcp req/s\tvs tcp p50\tvs relay req/s\t")
	base := map[string]map[string]GatewayRow{"tcp": {}, "relay": {}}
	for _, r := range rows {
		if m := base[r.Path]; m != nil {
			m[r.Tool+r.Test] = r
		}
	}
	ratio := func(r GatewayRow, path string) (rate, p50 string) {
		if b, ok := base[path][r.Tool+r.Test]; ok && r.Path != path && b.Rate > 0 && b.P50 > 0 {
			return fmt.Sprintf("%.2fx", r.Rate/b.Rate), fmt.Sprintf("%.2fx", float64(r.P50)/float64(b.P50))
		}
		return "", ""
	}
	for _, r := range rows {
		vsRate, vsP50 := ratio(r, "tcp")
		vsRelay, _ := ratio(r, "relay")
		cpu := ""
		if r.CPU > 0 {
			cpu = round(r.CPU).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t%v\t%v\t%s\t%s\t%s\t%s\t\n", r.Tool, r.Test, r.Path, r.Rate, round(r.P50), round(r.P99), cpu, vsRate, vsP50, vsRelay)
	}
	tw.Flush()
}
