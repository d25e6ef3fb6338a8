// Command ntproxy is a host's data-plane daemon: it owns the host's NTB
// links and carries the connections of every local application that
// attaches to it (socklike's attached mode, $NTSTACK_PROXY). It asks the
// host's ntmon for routes, admissions and ports.
//
//	ntproxy -config /etc/ntstack/host.toml
//
// When the configuration has gateway forwards or exports, ntproxy starts
// its own executable again with -gateway: a process of its own that
// serves the TCP gateway as an application of this ntproxy, reports its
// counters to it (ntmon status, metrics), stops it if it fails and stops
// with it. The gateway waits on TCP sockets; kept out of ntproxy, they
// leave ntproxy's fabric waits free to spin (DESIGN.md invariant 11;
// internal/daemon/gateway's process.go).
//
// Everything it does is internal/daemon/proxy and internal/daemon/gateway;
// this file is wiring.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
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
	gatewayOnly := flag.Bool("gateway", false, "serve only the TCP gateway, as an application of the host's ntproxy (ntproxy starts this process itself)")
	quiet := flag.Bool("q", false, "log only errors")
	procs := flag.Int("procs", -1, "Go scheduler Ps (GOMAXPROCS): -1 one, two with -gateway; 0 keeps the runtime's choice")
	cli.ParseMain("ntproxy", "[-config FILE] [-standalone] [-gateway] [-q] [-procs N]")
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	name := "ntproxy"
	if *gatewayOnly {
		name = "ntproxy -gateway"
	}
	log.SetPrefix(name + ": ")
	run := func() error { return runProxy(*cfgPath, *standalone, *quiet, *procs) }
	if *gatewayOnly {
		run = func() error { return runGateway(*cfgPath, *quiet, *procs) }
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}

func runProxy(cfgPath string, standalone, quiet bool, procs int) error {
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return err
	}
	setProcs(procs, 1)
	var gw atomic.Pointer[gateway.Process]
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
	log.Printf("host %s: applications attach at %s", cfg.Host, cfg.Path(config.ProxySocket))
	if len(cfg.Gateway.Forward)+len(cfg.Gateway.Export) == 0 {
		go func() {
			log.Printf("%v: shutting down", <-sig)
			s.Close()
		}()
		return s.ListenAndServe()
	}
	// The gateway is an application of this ntproxy: it stops it if it
	// cannot serve, and stops with it.
	g, err := startGateway(cfgPath, quiet)
	if err != nil {
		s.Close()
		return err
	}
	gw.Store(g)
	go func() {
		select {
		case v := <-sig:
			log.Printf("%v: shutting down", v)
		case <-g.Done():
			if g.Err() == nil {
				log.Printf("gateway process %d stopped: shutting down", g.Pid())
			}
		}
		g.Stop()
		s.Close()
	}()
	err = s.ListenAndServe()
	return errors.Join(err, g.Stop())
}

// startGateway starts this executable as the gateway process of the
// configuration at cfgPath.
func startGateway(cfgPath string, quiet bool) (*gateway.Process, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	args := []string{"-gateway", "-config", cfgPath}
	if quiet {
		args = append(args, "-q")
	}
	g, err := gateway.StartProcess(exec.Command(exe, args...))
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	log.Printf("gateway: process %d serves the forwards and exports", g.Pid())
	return g, nil
}

// setProcs sets GOMAXPROCS from -procs: n if positive, the runtime's
// choice if 0, and otherwise def.
//
// ntproxy mostly waits and copies. With a P per CPU its spinning
// goroutines compete with the applications for the same CPUs, so it runs
// one P; none of its data waits on a socket (a TCP fallback leg's does,
// and then nobody of the process spins: spingate), so its one goroutine
// may spin. The gateway process waits on TCP sockets too, and with one P
// nobody there may spin (spingate, DESIGN.md invariant 11): every fabric
// wait would park, and the TCP side and the fabric side take turns on the
// one P. Its second P lets one goroutine spin and the poller run beside
// it (docs/perf-log.md has both measurements).
func setProcs(n, def int) {
	switch {
	case n > 0:
	case n == 0:
		return
	default:
		n = def
	}
	runtime.GOMAXPROCS(n)
}

// runGateway is the gateway process (-gateway): it serves the TCP gateway
// of the configuration at cfgPath as an application of the host's
// ntproxy, once its socket answers, and reports to ntproxy over the stats
// socket until SIGINT or SIGTERM, or until ntproxy closes that socket.
func runGateway(cfgPath string, quiet bool, procs int) error {
	stats, err := gateway.StatsConn() // first: nothing has opened descriptor 3 yet
	if err != nil {
		return err
	}
	defer stats.Close()
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return err
	}
	setProcs(procs, 2)
	logf := log.Printf
	if quiet {
		logf = nil
	}
	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancel()
	var p *socklike.Proxy
	for range 100 { // ntproxy's ListenAndServe is starting
		if p, err = socklike.AttachProxy(cfg.Path(config.ProxySocket), socklike.Config{SpinBudget: cfg.Proxy.SpinBudget.Duration, Sockets: true}); err == nil {
			break
		}
		select {
		case <-ctx.Done():
			return nil // stopped before it served
		case <-time.After(20 * time.Millisecond):
		}
	}
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	defer p.Close()
	g, err := gateway.New(cfg, p, logf)
	if err != nil {
		return err
	}
	statsDone := make(chan struct{})
	go func() {
		defer close(statsDone)
		err := gateway.ServeStats(stats, g)
		if ctx.Err() == nil { // neither a signal nor the end of Run closed it
			if err == nil {
				err = io.EOF
			}
			log.Printf("stats socket: %v: ntproxy is gone; stopping", err)
			cancel()
		}
	}()
	err = g.Run(ctx)
	cancel()
	stats.Close() // ends ServeStats
	<-statsDone
	return err
}
