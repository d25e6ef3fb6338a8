// Command ntproxy is a host's data-plane daemon: it owns the host's NTB
// links and carries the connections of every local application that
// attaches to it (socklike's attached mode, $NTSTACK_PROXY). It asks the
// host's ntmon for routes, admissions and ports.
//
//	ntproxy -config /etc/ntstack/host.toml
//
// Everything it does is internal/proxy; this file is wiring.
package main

import (
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"runtime"
	"syscall"

	"github.com/ntstack/ntstack/internal/config"
	"github.com/ntstack/ntstack/internal/proxy"
)

func main() {
	cfgPath := flag.String("config", "/etc/ntstack/host.toml", "host configuration (TOML)")
	standalone := flag.Bool("standalone", false, "decide routes, ACL and ports from the configuration alone, without ntmon")
	quiet := flag.Bool("q", false, "log only errors")
	procs := flag.Int("procs", 1, "Go scheduler Ps (GOMAXPROCS); 0 keeps the runtime's choice")
	flag.Parse()
	// The proxy mostly waits and copies. With a P per CPU its spinning
	// goroutines compete with the applications for the same CPUs: on the
	// 2-vCPU reference machine one P took proxied KV round trips from
	// ~300 to ~170 us.
	if *procs > 0 {
		runtime.GOMAXPROCS(*procs)
	}
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	log.SetPrefix("ntproxy: ")
	if err := run(*cfgPath, *standalone, *quiet); err != nil {
		fmt.Fprintln(os.Stderr, "ntproxy:", err)
		os.Exit(1)
	}
}

func run(cfgPath string, standalone, quiet bool) error {
	cfg, err := config.Load(cfgPath)
	if err != nil {
		return err
	}
	o := proxy.Options{Logf: log.Printf}
	if quiet {
		o.Logf = nil
	}
	if !standalone {
		o.Control = proxy.NewMonitorControl(cfg.Path(config.MonitorSocket))
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
	return s.ListenAndServe()
}
