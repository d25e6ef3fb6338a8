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
	// WrkTime is each wrk run's duration (default 2s; wrk counts whole
	// seconds, so it is rounded up to one).
	WrkTime time.Duration
	// Then, if set, runs after the measurements, while the servers still
	// serve.
	Then func(ctx context.Context) error
}

// GatewayRow is one load run: a tool's test over one path.
type GatewayRow struct {
	Tool     string  // "redis-benchmark" or "wrk"
	Test     string  // "SET", "GET", "GET /4k", ...
	Path     string  // "gateway" (over the fabric) or "tcp" (the rack's network)
	Rate     float64 // requests per second
	P50, P99 time.Duration
}

// RunGateway starts redis-server and nginx on the server host, then runs
// redis-benchmark and wrk on the client host twice each: through the
// gateway (127.0.0.1 forwards, carried over the NTB link) and straight to
// the server host's TCP address over the rack's network. The rack must
// have been started with GatewayConfigure. It checks a SET/GET through the
// gateway with redis-cli before measuring.
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
	stop, err := startServers(ctx, r, o.Server, dir)
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
	for _, path := range []struct{ name, redis, http string }{
		{"gateway", RedisForward, HTTPForward},
		{"tcp", net.JoinHostPort(srv.IP.String(), strconv.Itoa(redisPort)), net.JoinHostPort(srv.IP.String(), strconv.Itoa(nginxPort))},
	} {
		rb, err := redisBenchmark(ctx, r, o, path.redis)
		if err != nil {
			return rows, fmt.Errorf("redis-benchmark over %s: %w", path.name, err)
		}
		for _, row := range rb {
			row.Path = path.name
			rows = append(rows, row)
		}
		for _, file := range []string{"4k", "1m"} {
			row, err := wrk(ctx, r, o, "http://"+path.http+"/"+file)
			if err != nil {
				return rows, fmt.Errorf("wrk over %s: %w", path.name, err)
			}
			row.Test, row.Path = "GET /"+file, path.name
			rows = append(rows, row)
		}
	}
	if o.Then != nil {
		return rows, o.Then(ctx)
	}
	return rows, nil
}

// startServers runs redis-server and nginx on host, serving files of 4 KiB
// and 1 MiB from dir, and returns what stops them.
func startServers(ctx context.Context, r *rack.Rack, host, dir string) (func() error, error) {
	for name, size := range map[string]int{"4k": 4 << 10, "1m": 1 << 20} {
		if err := os.WriteFile(filepath.Join(dir, name), bytes.Repeat([]byte("ntstack\n"), size/8), 0o644); err != nil {
			return func() error { return nil }, err
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
		return func() error { return nil }, err
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
			return stop, fmt.Errorf("start %s: %w", argv[0], err)
		}
		cmds = append(cmds, c)
	}
	for _, port := range []int{redisPort, nginxPort} {
		if err := waitTCP(ctx, r, host, port); err != nil {
			return stop, err
		}
	}
	return stop, nil
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

// redisBenchmark runs SET and GET against addr and parses its CSV.
func redisBenchmark(ctx context.Context, r *rack.Rack, o GatewayOptions, addr string) ([]GatewayRow, error) {
	host, port, _ := net.SplitHostPort(addr)
	out, err := r.ExecContext(ctx, o.Client, "redis-benchmark", "-h", host, "-p", port,
		"-n", strconv.Itoa(o.Requests), "-c", strconv.Itoa(o.Clients), "-d", "64", "-r", "10000",
		"-t", "set,get", "--csv").Output()
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, out)
	}
	return parseRedisCSV(out)
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
// response fails the run.
func wrk(ctx context.Context, r *rack.Rack, o GatewayOptions, url string) (GatewayRow, error) {
	secs := max(1, int((o.WrkTime+time.Second-1)/time.Second))
	out, err := r.ExecContext(ctx, o.Client, "wrk", "-t1", "-c"+strconv.Itoa(o.Clients),
		"-d"+strconv.Itoa(secs)+"s", "--latency", url).Output()
	if err != nil {
		return GatewayRow{}, fmt.Errorf("%w: %s", err, out)
	}
	return parseWrk(out)
}

// parseWrk reads wrk --latency's report: the "50%" and "99%" lines of the
// latency distribution and "Requests/sec:".
func parseWrk(out []byte) (GatewayRow, error) {
	row := GatewayRow{Tool: "wrk"}
	var seen int
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 2 && (f[0] == "50%" || f[0] == "99%"):
			d, err := time.ParseDuration(f[1])
			if err != nil {
				return row, fmt.Errorf("wrk latency %q: %w", f[1], err)
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
				return row, fmt.Errorf("wrk rate %q: %w", f[1], err)
			}
			row.Rate = v
			seen++
		case len(f) > 0 && (f[0] == "Non-2xx" || f[0] == "Socket"):
			return row, fmt.Errorf("wrk: %s", sc.Text())
		}
	}
	if seen != 3 {
		return row, fmt.Errorf("wrk output without latency percentiles or rate: %q", out)
	}
	return row, nil
}

// PrintGateway writes rows as a table, each gateway row beside its TCP
// baseline.
func PrintGateway(w io.Writer, rows []GatewayRow) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "tool\ttest\tpath\treq/s\tp50\tp99\tvs tcp req/s\tvs tcp p50\t")
	base := map[string]GatewayRow{}
	for _, r := range rows {
		if r.Path == "tcp" {
			base[r.Tool+r.Test] = r
		}
	}
	for _, r := range rows {
		vsRate, vsP50 := "", ""
		if b, ok := base[r.Tool+r.Test]; ok && r.Path != "tcp" && b.Rate > 0 && b.P50 > 0 {
			vsRate = fmt.Sprintf("%.2fx", r.Rate/b.Rate)
			vsP50 = fmt.Sprintf("%.2fx", float64(r.P50)/float64(b.P50))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.0f\t%v\t%v\t%s\t%s\t\n", r.Tool, r.Test, r.Path, r.Rate, round(r.P50), round(r.P99), vsRate, vsP50)
	}
	tw.Flush()
}
