// Command ntrack runs an emulated ntstack rack on one Linux machine (see
// internal/tools/rack): a network namespace per host, joined by a bridge, with
// emulated NTB links under one fabric directory, each host running ntmon
// and ntproxy.
//
// Usage (as root):
//
//	ntrack up -hosts 2 -bin ./bin [-dir /tmp/rack] [-name ntrdemo]
//	ntrack down -prefix ntrdemo
//	ntrack demo -bin ./bin [-time 2s] [-gateway]
//	ntrack relay [-procs 2] LISTEN=TO ...
//
// up starts the rack, prints its namespaces, addresses and config paths
// and an example command, and stays until SIGINT or SIGTERM, then tears
// the rack down. down removes what racks whose names start with -prefix
// left behind (namespaces, veths, bridges, default directories) when their
// ntrack or test was killed. demo starts a 2-host rack, runs the KV (YCSB
// over RESP) and HTTP workloads between the hosts through their ntproxy
// daemons, over TCP through two plain TCP relays in the daemons' place
// (ntrack relay, one P each as ntproxy) and over TCP loopback, prints
// them side by side, then unmodified redis-server
// and nginx under redis-benchmark and wrk through the TCP gateway and over
// TCP, and beside them two plain TCP relays (ntrack relay) in place of the
// gateways, the ceiling of two user-space hops (-gateway: that table
// alone); then it tears the rack down. relay copies each connection to
// LISTEN to a new one to TO, both ways, with -procs Ps (by default two, as
// ntproxy's gateway process).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/tools/cli"
	"github.com/ntstack/ntstack/internal/tools/rack"
	"github.com/ntstack/ntstack/internal/tools/rackdemo"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// errUsage is wrapped by the errors of bad arguments; errFlags is returned
// after a bad flag, which the flag set has reported.
var (
	errUsage = errors.New("bad usage")
	errFlags = errors.New("bad flags")
)

// ntrack is the program's usage and its subcommands. Each parses its flags
// with a flag set writing to the stderr it is given, so -h and --help
// print its usage and exit 0 (cli.Program.Dispatch).
var ntrack = cli.Program{
	Name: "ntrack",
	Commands: []cli.Command{
		{Name: "up", Synopsis: upSynopsis, Run: command(up)},
		{Name: "down", Synopsis: downSynopsis, Run: command(down)},
		{Name: "demo", Synopsis: demoSynopsis, Run: command(demo)},
		{Name: "relay", Synopsis: relaySynopsis, Run: command(relay)},
	},
}

// run is ntrack with its arguments (without the program name); it returns
// the exit code.
func run(args []string, stdout, stderr io.Writer) int {
	if code, ok := ntrack.Dispatch(context.Background(), args, stdout, stderr); ok {
		return code
	}
	if len(args) > 0 && cli.IsHelp(args[0]) {
		ntrack.Usage(stdout)
		return 0
	}
	if len(args) == 0 {
		fmt.Fprintln(stderr, "ntrack: no command")
	} else {
		fmt.Fprintf(stderr, "ntrack: unknown command %q\n", args[0])
	}
	ntrack.Usage(stderr)
	return 2
}

// command adapts a subcommand that returns an error to cli.Command.Run:
// exit 2 for a usage error, 1 for any other error.
func command(f func(args []string, stdout, stderr io.Writer) error) func(context.Context, []string, io.Writer, io.Writer) int {
	return func(_ context.Context, args []string, stdout, stderr io.Writer) int {
		err := f(args, stdout, stderr)
		switch {
		case errors.Is(err, errFlags): // the flag set said why
			return 2
		case errors.Is(err, errUsage):
			fmt.Fprintf(stderr, "ntrack: %v\n", err)
			return 2
		case err != nil:
			fmt.Fprintln(stderr, "ntrack:", err)
			return 1
		}
		return 0
	}
}

const (
	upSynopsis    = "-hosts N -bin DIR [-dir DIR] [-name NAME] [-keep]"
	downSynopsis  = "-prefix PREFIX"
	demoSynopsis  = "-bin DIR [-time 2s] [-only proxy,pool,direct,tcp,gateway]"
	relaySynopsis = "[-procs 2] LISTEN=TO ..."
)

// parse parses a subcommand's flags: nil and done after -h, errFlags
// after a bad flag.
func parse(fs *flag.FlagSet, args []string, stdout io.Writer) (done bool, err error) {
	switch code, ok := cli.Parse(fs, args, stdout); {
	case ok:
		return false, nil
	case code == 0:
		return true, nil
	}
	return true, errFlags
}

func up(args []string, out, stderr io.Writer) error {
	fs := cli.FlagSet("ntrack up", upSynopsis, stderr)
	hosts := fs.Int("hosts", 2, "number of hosts (named a, b, c, …)")
	bin := fs.String("bin", "", "directory holding the ntmon and ntproxy binaries (required)")
	dir := fs.String("dir", "", "state root: a directory per host with config, logs and sockets (default $TMPDIR/ntstack-NAME)")
	name := fs.String("name", "", "rack name, the prefix of its namespaces and links (default random ntrXXXXX)")
	keep := fs.Bool("keep", false, "keep the configs and logs after the rack is down")
	if done, err := parse(fs, args, out); done {
		return err
	}
	if *bin == "" || *hosts < 1 || *hosts > 26 {
		return fmt.Errorf("up: want -bin DIR and -hosts 1..26: %w", errUsage)
	}
	spec := rack.Spec{Name: *name, BinDir: *bin, StateRoot: *dir, KeepState: *keep}
	for i := range *hosts {
		spec.Hosts = append(spec.Hosts, string(rune('a'+i)))
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, err := rack.Start(ctx, spec)
	if err != nil {
		return fmt.Errorf("up: %w", err)
	}
	fmt.Fprintf(out, "rack %s up: bridge %s, subnet %s, fabric %s\n", r.Name(), r.Bridge(), r.Subnet(), r.FabricDir())
	for _, h := range r.Hosts() {
		fmt.Fprintf(out, "  host %s: netns %s, ip %s, address %s\n    config %s\n    logs   %s %s\n",
			h.Name, h.Netns, h.IP, h.Address, h.ConfigPath, h.LogPath("ntmon"), h.LogPath("ntproxy"))
	}
	a := r.Hosts()[0]
	fmt.Fprintf(out, "run an application on %s:\n  ip netns exec %s env %s=%s <app>\n",
		a.Name, a.Netns, rack.ProxyEnv, a.Config.Path(config.ProxySocket))
	fmt.Fprintf(out, "stop with Ctrl-C; if ntrack is killed: ntrack down -prefix %s\n", r.Name())

	<-ctx.Done()
	fmt.Fprintf(out, "rack %s going down\n", r.Name())
	return r.Close()
}

func down(args []string, out, stderr io.Writer) error {
	fs := cli.FlagSet("ntrack down", downSynopsis, stderr)
	prefix := fs.String("prefix", "", "remove racks whose names start with this (required)")
	if done, err := parse(fs, args, out); done {
		return err
	}
	if *prefix == "" {
		return fmt.Errorf("down: want -prefix: %w", errUsage)
	}
	return rack.Cleanup(*prefix)
}

// relay runs the gateway table's ceiling: a plain TCP relay from each
// LISTEN address to its TO address (rackdemo.RelayMain).
func relay(args []string, out, stderr io.Writer) error {
	fs := cli.FlagSet("ntrack relay", relaySynopsis, stderr)
	procs := fs.Int("procs", 2, "Go scheduler Ps (GOMAXPROCS), as many as ntproxy's gateway process; 0 keeps the runtime's choice")
	if done, err := parse(fs, args, out); done {
		return err
	}
	if fs.NArg() == 0 {
		return fmt.Errorf("relay: want LISTEN=TO pairs: %w", errUsage)
	}
	return rackdemo.RelayMain(fs.Args(), *procs, out)
}

func demo(args []string, out, stderr io.Writer) error {
	fs := cli.FlagSet("ntrack demo", demoSynopsis, stderr)
	bin := fs.String("bin", "", "directory holding the ntmon and ntproxy binaries (required)")
	per := fs.Duration("time", 2*time.Second, "measured time per workload, size and transport")
	only := fs.String("only", "", "parts to run, comma-separated, of the rack workloads' transports proxy, pool, direct, relay (TCP through two relays) and tcp, and gateway (the gateway table: TCP, the relays and the gateway); default: all")
	if done, err := parse(fs, args, out); done {
		return err
	}
	if *bin == "" {
		return fmt.Errorf("demo: want -bin DIR: %w", errUsage)
	}
	var transports []string
	withGateway := *only == ""
	for _, part := range strings.Split(*only, ",") {
		switch part {
		case "":
		case "gateway":
			withGateway = true
		case "proxy", "pool", "direct", "relay", "tcp":
			transports = append(transports, part)
		default:
			return fmt.Errorf("demo: -only %q: want proxy, pool, direct, relay, tcp or gateway: %w", part, errUsage)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	r, err := rack.Start(ctx, rack.Spec{Hosts: []string{"a", "b"}, BinDir: *bin, Configure: rackdemo.GatewayConfigure("a", "b", "")})
	if err != nil {
		return err
	}
	defer r.Close()
	a, b := r.Host("a"), r.Host("b")
	fmt.Fprintf(out, "rack %s: hosts a (%s) and b (%s), NTB link %s, ntmon and ntproxy on each\n",
		r.Name(), a.IP, b.IP, a.Config.Peers[0].Link)
	self, err := os.Executable()
	if err != nil {
		return err
	}
	if *only == "" || len(transports) > 0 {
		fmt.Fprintf(out, "KV server and HTTP file server attached to b's ntproxy, clients to a's; baseline: the same code over TCP loopback\n")
		fmt.Fprintf(out, "relays: the same code over TCP through two plain Go TCP relays (ntrack relay, one P each as ntproxy) in place of the ntproxys: the ceiling of two user-space hops\n\n")
		res, err := rackdemo.Run(ctx, rackdemo.Options{ServerHost: b.Config, ClientHost: a.Config, KVTime: *per, HTTPTime: *per, Transports: transports, RelayCmd: []string{self, "relay"}})
		res.Print(out)
		if err != nil {
			return err
		}
	}
	if !withGateway {
		return nil
	}
	fmt.Fprintf(out, "\nunmodified redis-server and nginx on b; redis-benchmark and wrk on a through ntproxy's TCP gateway (NTB link), then over TCP to %s\n\n", b.IP)
	fmt.Fprintf(out, "relay: two plain Go TCP relays (ntrack relay, two Ps as the gateway process) in place of the gateways, a loopback hop on each host: the ceiling of two user-space hops\n\n")
	rows, err := rackdemo.RunGateway(ctx, r, rackdemo.GatewayOptions{Client: "a", Server: "b", Clients: 50, OneClient: true, BesideBulk: true, WrkTime: *per, RelayCmd: []string{self, "relay"}})
	rackdemo.PrintGateway(out, rows)
	return err
}
