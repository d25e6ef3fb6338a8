// Command ntmon is a host's ntstack control-plane daemon: it keeps sessions
// with the rack peers' ntmons (telling them whether this host takes RDMA),
// resolves routes (shared memory, NTB, RDMA or TCP fallback) and enforces the ACL for ntproxy, reserves ports, and serves
// status and Prometheus metrics. All the work is in internal/daemon/monitor.
//
//	ntmon -config /etc/ntstack/host.toml       # run until SIGINT or SIGTERM (that file is the default)
//	ntmon status                               # tables: links, partitions, peers, listeners, apps, connections
//	ntmon status -socket /run/ntstack/a/ntmon.sock -json
//	ntmon doctor [-config FILE] [-json]        # check and explain the environment; exit 1 if a check failed
//	ntmon capture -link b -count 500 -w kv.pcapng  # ntproxy's frames on a rack link, for Wireshark (see -h)
//	ntmon capture -lua ntstack.lua             # the Wireshark dissector for those files
//	ntmon keygen -host a -out /etc/ntstack/a.key  # a host key; prints the pin for peers' configs
//	ntmon keygen -new-ca -out ca.key -cert ca.pem # a rack CA; then keygen -ca ca.key signs host keys
//	ntmon version
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/daemon/monitor"
	"github.com/ntstack/ntstack/internal/daemon/proxy"
	"github.com/ntstack/ntstack/internal/tools/cli"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// version is the build's version; set with -ldflags "-X main.version=…".
var version = "dev"

// defaultConfig is where deploy/systemd/ntmon.service keeps the host's
// configuration.
const defaultConfig = "/etc/ntstack/host.toml"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// ntmon is the program's usage and its subcommands. Each parses its flags
// with a flag set writing to the stderr it is given, so -h and --help
// print its usage and exit 0 (cli.Program.Dispatch).
var ntmon = cli.Program{
	Name:     "ntmon",
	Synopsis: "[-config FILE] [-debug]",
	Commands: []cli.Command{
		{Name: "status", Synopsis: statusSynopsis, Run: status},
		{Name: "doctor", Synopsis: doctorSynopsis, Run: doctorCmd},
		{Name: "capture", Synopsis: "-link LINK [-conn ID] [-count N | -duration D] -w FILE | -lua FILE", Run: captureCmd},
		{Name: "keygen", Synopsis: keygenSynopsis, Run: keygenCmd},
		{Name: "version", Run: versionCmd},
	},
}

// run is ntmon with its arguments (without the program name); it returns
// the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if code, ok := ntmon.Dispatch(ctx, args, stdout, stderr); ok {
		return code
	}
	if len(args) == 1 && args[0] == "help" {
		args = []string{"-h"}
	}
	fs := flag.NewFlagSet("ntmon", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", defaultConfig, "host configuration file (TOML; see internal/daemon/config/example.toml)")
	debug := fs.Bool("debug", false, "log at debug level")
	fs.Usage = func() {
		ntmon.Usage(fs.Output())
		fmt.Fprintln(fs.Output(), "\nflags:")
		fs.PrintDefaults()
	}
	if code, ok := cli.Parse(fs, args, stdout); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	level := slog.LevelInfo
	if *debug {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if err := serve(ctx, *cfgPath, log); err != nil {
		fmt.Fprintln(stderr, "ntmon:", err)
		return 1
	}
	return 0
}

// versionCmd is `ntmon version`.
func versionCmd(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.FlagSet("ntmon version", "", stderr)
	if code, ok := cli.Parse(fs, args, stdout); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	fmt.Fprintf(stdout, "ntmon %s (peer protocol %d)\n", version, monitor.ProtocolVersion)
	return 0
}

func serve(ctx context.Context, path string, log *slog.Logger) error {
	cfg, err := config.Load(path)
	if err != nil {
		return err
	}
	opts := monitor.Options{Logger: log, Version: version}
	// The RDMA capability peers learn: ntproxy, built alike, listens there.
	if v, err := proxy.OpenRDMA(cfg.Proxy.RDMA, nil); err != nil { // a probe: no connection is made
		opts.RDMA.Why = err.Error()
	} else {
		v.Close()
		opts.RDMA.Addr = cfg.Proxy.RDMA.Listen
	}
	log.Info("rdma capability", "addr", opts.RDMA.Addr, "why_none", opts.RDMA.Why)
	m, err := monitor.New(cfg, opts)
	if err != nil {
		return err
	}
	return m.Run(ctx)
}

const statusSynopsis = "[-config FILE | -socket PATH] [-json]"

// status is `ntmon status`.
func status(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.FlagSet("ntmon status", statusSynopsis, stderr)
	cfgPath := fs.String("config", defaultConfig, "host configuration file: ntmon's socket is under its state_dir")
	socket := fs.String("socket", "", "ntmon's local API socket (instead of -config)")
	asJSON := fs.Bool("json", false, "print the raw status as JSON")
	if code, ok := cli.Parse(fs, args, stdout); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return 2
	}
	if *socket == "" {
		cfg, err := config.Load(*cfgPath)
		if err != nil {
			fmt.Fprintln(stderr, "ntmon status:", err)
			return 1
		}
		*socket = cfg.Path(config.MonitorSocket)
	}
	c := ctlapi.NewClient(*socket)
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var st ctlapi.Status
	if err := c.Call(ctx, ctlapi.PathStatus, nil, &st); err != nil {
		fmt.Fprintf(stderr, "ntmon status: %v\n", err)
		var e *ctlapi.Error
		if errors.As(err, &e) && e.Code == ctlapi.CodeUnavail {
			fmt.Fprintf(stderr, "ntmon status: is ntmon running? (socket %s)\n", *socket)
		}
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(&st); err != nil {
			fmt.Fprintln(stderr, "ntmon status:", err)
			return 1
		}
		return 0
	}
	if err := monitor.WriteStatus(stdout, &st); err != nil {
		fmt.Fprintln(stderr, "ntmon status:", err)
		return 1
	}
	return 0
}
