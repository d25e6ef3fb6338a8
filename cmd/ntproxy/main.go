// Command ntproxy is a host's data-plane daemon: it owns the host's NTB
// links and carries the connections of every local application that
// attaches to it (socklike's attached mode, $NTSTACK_PROXY). It asks the
// host's ntmon for routes, admissions and ports.
//
//	ntproxy -config /etc/ntstack/host.toml
//
// Everything it does is internal/daemon/proxy; this file is wiring.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/daemon/gateway"
	"github.com/ntstack/ntstack/internal/daemon/proxy"
	"github.com/ntstack/ntstack/internal/tools/cli"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/socklike"
)

func main() {
	cfgPath := flag.String("config", "/etc/ntstack/host.toml", "host configuration (TOML)")
	standalone := flag.Bool("standalone", false, "decide routes, ACL and ports from the configuration alone, without ntmon")
	quiet := flag.Bool("q", false, "log only errors")
	procs := flag.Int("procs", -1, "Go scheduler Ps (GOMAXPROCS): -1 one, two with a TCP gateway; 0 keeps the runtime's choice")
	cli.ParseMain("ntproxy", "[-config FILE] [-standalone] [-q] [-procs N]")
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetPrefix("ntproxy: ")
	if err := run(*cfgPath, *standalone, *quiet, *procs); err != nil {
		fmt.Fprintln(os.Stderr, "ntproxy:", err)
		os.Exit(1)
	}
}

func run(cfgPath string, standalone, quiet bool, procs int) error {
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return err
	}
	setProcs(procs, len(cfg.Gateway.Forward)+len(cfg.Gateway.Export) > 0)
	var gw atomic.Pointer[gateway.Gateway]
	o := proxy.Options{Logf: log.Printf, Gateway: func() []ctlapi.GatewayStat {
		if g := gw.Load(); g != nil {
			return g.Stats()
		}
		return nil
	}, Trunks: func() []ctlapi.TrunkStat {
		if g := gw.Load(); g != nil {
			return g.TrunkStats()
		}
		return nil
	}}
	if quiet {
		o.Logf = nil
	}
	if !standalone {
		o.Control = proxy.NewMonitorControl(cfg.Path(config.MonitorSocket))
	}
	auth, err := cfg.HostAuth()
	if err != nil {
		return err
	}
	if v, err := proxy.OpenRDMA(cfg.Proxy.RDMA, auth); err != nil {
		log.Printf("no RDMA path: %v", err)
	} else {
		defer v.Close()
		o.RDMA = v
		log.Printf("RDMA path: listening on %s (verbs)", cfg.Proxy.RDMA.Listen)
	}
	s, err := proxy.New(cfg, o)
	if err != nil {
		return err
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		log.Printf("%v: shutting down", <-sig)
		s.Close()
	}()
	log.Printf("host %s: applications attach at %s", cfg.Host, cfg.Path(config.ProxySocket))
	if len(cfg.Gateway.Forward)+len(cfg.Gateway.Export) == 0 {
		return s.ListenAndServe()
	}
	// The gateway is an application of this ntproxy: it stops it if it
	// cannot serve, and stops with it.
	ctx, cancel := context.WithCancel(context.Background())
	gwErr := make(chan error, 1)
	go func() {
		err := runGateway(ctx, cfg, o.Logf, &gw)
		if err != nil {
			s.Close()
		}
		gwErr <- err
	}()
	err = s.ListenAndServe()
	cancel()
	return errors.Join(err, <-gwErr)
}

// setProcs sets GOMAXPROCS from -procs: n if positive, the runtime's
// choice if 0, and otherwise one P, or two if the gateway serves.
//
// The proxy mostly waits and copies. With a P per CPU its spinning
// goroutines compete with the applications for the same CPUs, so it runs
// one P. A gateway waits on TCP sockets too, and with one P nobody may
// spin (spingate, DESIGN.md invariant 11): every fabric wait then parks,
// and the TCP side and the fabric side take turns on the one P. A second
// P lets one goroutine spin and the poller run beside it
// (docs/perf-log.md has both measurements).
func setProcs(n int, gateway bool) {
	switch {
	case n > 0:
	case n == 0:
		return
	case gateway:
		n = 2
	default:
		n = 1
	}
	runtime.GOMAXPROCS(n)
}

// runGateway serves the TCP gateway as an application of this ntproxy,
// once its socket answers, until ctx ends.
func runGateway(ctx context.Context, cfg *config.Config, logf func(string, ...any), gw *atomic.Pointer[gateway.Gateway]) error {
	var p *socklike.Proxy
	var err error
	for range 100 { // ListenAndServe is starting
		if p, err = socklike.AttachProxy(cfg.Path(config.ProxySocket), socklike.Config{SpinBudget: cfg.Proxy.SpinBudget.Duration, Sockets: true}); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	defer p.Close()
	g, err := gateway.New(cfg, p, logf)
	if err != nil {
		return err
	}
	gw.Store(g)
	return g.Run(ctx)
}
