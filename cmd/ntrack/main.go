// Command ntrack runs an emulated ntstack rack on one Linux machine (see
// internal/tools/rack): a network namespace per host, joined by a bridge, with
// emulated NTB links under one fabric directory, each host running ntmon
// and ntproxy.
//
// Usage (as root):
//
//	ntrack up -hosts 2 -bin ./bin [-dir /tmp/rack] [-name ntrdemo]
//	ntrack down -prefix ntrdemo
//	ntrack demo -bin ./bin [-time 2s]
//
// up starts the rack, prints its namespaces, addresses and config paths
// and an example command, and stays until SIGINT or SIGTERM, then tears
// the rack down. down removes what racks whose names start with -prefix
// left behind (namespaces, veths, bridges, default directories) when their
// ntrack or test was killed. demo starts a 2-host rack, runs the KV (YCSB
// over RESP) and HTTP workloads between the hosts through their ntproxy
// daemons and over TCP loopback, prints both, then unmodified redis-server
// and nginx under redis-benchmark and wrk through the TCP gateway and over
// TCP, and tears the rack down.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/tools/rack"
	"github.com/ntstack/ntstack/internal/tools/rackdemo"
)

func main() {
	err := run(os.Args[1:], os.Stdout)
	switch {
	case errors.Is(err, flag.ErrHelp): // the flag package printed the flags
		os.Exit(2)
	case errors.Is(err, errUsage):
		fmt.Fprintf(os.Stderr, "ntrack: %v\n%s\n", err, usage)
		os.Exit(2)
	case err != nil:
		fmt.Fprintln(os.Stderr, "ntrack:", err)
		os.Exit(1)
	}
}

var errUsage = errors.New("bad usage")

const usage = `usage:
  ntrack up -hosts N -bin DIR [-dir DIR] [-name NAME] [-keep]
  ntrack down -prefix PREFIX
  ntrack demo -bin DIR [-time 2s]`

func run(args []string, out io.Writer) error {
	if len(args) == 0 {
		return errUsage
	}
	switch args[0] {
	case "up":
		return up(args[1:], out)
	case "down":
		return down(args[1:])
	case "demo":
		return demo(args[1:], out)
	default:
		return fmt.Errorf("unknown command %q: %w", args[0], errUsage)
	}
}

func up(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("ntrack up", flag.ContinueOnError)
	hosts := fs.Int("hosts", 2, "number of hosts (named a, b, c, …)")
	bin := fs.String("bin", "", "directory holding the ntmon and ntproxy binaries (required)")
	dir := fs.String("dir", "", "state root: a directory per host with config, logs and sockets (default $TMPDIR/ntstack-NAME)")
	name := fs.String("name", "", "rack name, the prefix of its namespaces and links (default random ntrXXXXX)")
	keep := fs.Bool("keep", false, "keep the configs and logs after the rack is down")
	if err := fs.Parse(args); err != nil {
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

func down(args []string) error {
	fs := flag.NewFlagSet("ntrack down", flag.ContinueOnError)
	prefix := fs.String("prefix", "", "remove racks whose names start with this (required)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *prefix == "" {
		return fmt.Errorf("down: want -prefix: %w", errUsage)
	}
	return rack.Cleanup(*prefix)
}

func demo(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("ntrack demo", flag.ContinueOnError)
	bin := fs.String("bin", "", "directory holding the ntmon and ntproxy binaries (required)")
	per := fs.Duration("time", 2*time.Second, "measured time per workload, size and transport")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *bin == "" {
		return fmt.Errorf("demo: want -bin DIR: %w", errUsage)
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
	fmt.Fprintf(out, "KV server and HTTP file server attached to b's ntproxy, clients to a's; baseline: the same code over TCP loopback\n\n")
	res, err := rackdemo.Run(ctx, rackdemo.Options{ServerHost: b.Config, ClientHost: a.Config, KVTime: *per, HTTPTime: *per})
	res.Print(out)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "\nunmodified redis-server and nginx on b; redis-benchmark and wrk on a through ntproxy's TCP gateway (NTB link), then over TCP to %s\n\n", b.IP)
	rows, err := rackdemo.RunGateway(ctx, r, rackdemo.GatewayOptions{Client: "a", Server: "b", WrkTime: *per})
	rackdemo.PrintGateway(out, rows)
	return err
}
