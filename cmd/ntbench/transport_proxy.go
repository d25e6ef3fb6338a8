package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/daemon/proxy"
	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/wire/hostauth"
	"github.com/ntstack/ntstack/qos"
	"github.com/ntstack/ntstack/socklike"
)

// proxy is ntstack in attached mode across two hosts of an emulated rack:
// the client application attaches to host a's ntproxy, the server
// application to host b's, and the two proxies are joined by an emulated
// NTB link — four processes and three hops (app → proxy → proxy → app).
// The server process starts both proxies (this binary again, with
// $NTBENCH_PROXYD naming a host configuration); each is pinned to its
// host's CPU: b's to the server's, a's to another one (the client's under
// -pin split). The proxies decide routes from their configuration alone
// (no ntmon: the control plane is not on the data path).
//
// direct is the same rack in direct mode (socklike's Dialer.Direct): the
// proxies grant each connection a link of its own and leave the data path,
// so its bytes go from application to application.
//
// pool is the same rack in shared-pool mode (Dialer.Pool, ListenConfig.Pool):
// each application writes and reads a slot of a pool it shares with its
// proxy, which sends from and receives into it.
func init() {
	register(transport{name: "proxy", listen: listenProxy(false), dial: dialProxy(modeProxy)})
	register(transport{name: "direct", listen: listenProxy(false), dial: dialProxy(modeDirect)})
	register(transport{name: "pool", listen: listenProxy(true), dial: dialProxy(modePool)})
}

type proxyMode int

const (
	modeProxy proxyMode = iota
	modeDirect
	modePool
)

// String is the mode as socklike's Route names it.
func (m proxyMode) String() string { return [...]string{"proxy", "direct", "pool"}[m] }

func dialProxy(mode proxyMode) func(o *options, addr string) (net.Conn, error) {
	return func(o *options, addr string) (net.Conn, error) {
		sock, target, ok := strings.Cut(addr, " ")
		if !ok {
			return nil, fmt.Errorf("proxy address %q: want \"<socket> <host:port>\"", addr)
		}
		p, err := clientProxy(sock, o)
		if err != nil {
			return nil, err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		d := socklike.Dialer{Proxy: p, Priority: qos.Class(o.priority), Direct: mode == modeDirect, Pool: mode == modePool}
		c, err := d.DialContext(ctx, "ntb", target)
		if err != nil {
			return nil, err
		}
		if r := c.(*socklike.Conn).Route(); r.Mode != mode.String() {
			c.Close()
			return nil, fmt.Errorf("%s: got a %s connection: %s", mode, r.Mode, r.Reason)
		}
		return c, nil
	}
}

// Environment of a proxy daemon child.
const (
	proxydEnv     = "NTBENCH_PROXYD"         // its configuration file
	proxydCPUEnv  = "NTBENCH_PROXYD_CPU"     // the CPU to pin it to, or -1
	proxydProfEnv = "NTBENCH_PROXYD_PROFILE" // its CPU profile, if set
	proxydTrace   = "NTBENCH_PROXYD_TRACE"   // its execution trace, if set
)

// appConfig is socklike's configuration for an application's memory link:
// the spin budget and segment sizes of the flags; the partition layout is
// ntproxy's, and the shared window the engine's default (applications do
// not tune it).
func appConfig(o *options) socklike.Config {
	return socklike.Config{SpinBudget: o.spin, MTU: o.mtu, Window: o.recvWindow, DirectIdle: o.directIdle}
}

var (
	proxyMu      sync.Mutex
	proxyClients = map[string]*socklike.Proxy{}
)

func clientProxy(sock string, o *options) (*socklike.Proxy, error) {
	proxyMu.Lock()
	defer proxyMu.Unlock()
	if p := proxyClients[sock]; p != nil {
		return p, nil
	}
	p, err := socklike.AttachProxy(sock, appConfig(o))
	if err != nil {
		return nil, err
	}
	proxyClients[sock] = p
	return p, nil
}

// proxyRack is the two-host rack of one server process.
type proxyRack struct {
	net.Listener
	app    *socklike.Proxy
	dirs   []string
	daemon []*exec.Cmd
}

func listenProxy(pool bool) func(o *options) (net.Listener, string, error) {
	return func(o *options) (net.Listener, string, error) { return listenRack(o, pool) }
}

func listenRack(o *options, pool bool) (_ net.Listener, _ string, err error) {
	r := &proxyRack{}
	defer func() {
		if err != nil {
			r.Close()
		}
	}()
	state, err := os.MkdirTemp("", "ntbench-proxy-")
	if err != nil {
		return nil, "", err
	}
	fabric := filepath.Join("/dev/shm", fmt.Sprintf("ntbench-proxy-%d", os.Getpid()))
	r.dirs = append(r.dirs, state, fabric)
	cpuB, cpuA := o.cpu, -1
	if o.cpu >= 0 {
		cpuA = otherCPU(o.cpu)
	}
	partitions := max(o.partitions, 1)
	var cfgs [2]*config.Config
	// Each host gets a key and pins the other's, as a deployment would.
	keys, pins := map[string]string{}, map[string]string{}
	for _, host := range []string{"a", "b"} {
		keys[host] = filepath.Join(state, host+".key")
		if pins[host], err = hostauth.WriteKey(keys[host], host); err != nil {
			return nil, "", err
		}
	}
	for i, host := range []string{"a", "b"} {
		peer := "ab"[1-i : 2-i]
		spin := ""
		if o.spin != 0 {
			spin = fmt.Sprintf("spin_budget = %q\n", o.spin)
		}
		doc := fmt.Sprintf("host = %q\nstate_dir = %q\n[auth]\nkey = %q\n[proxy]\nfabric_dir = %q\npartitions = %d\n%s[[peers]]\nhost = %q\nlink = \"ntbench\"\nkey = %q\n",
			host, filepath.Join(state, host), keys[host], fabric, partitions, spin, peer, pins[peer])
		if cfgs[i], err = config.Parse([]byte(doc)); err != nil {
			return nil, "", fmt.Errorf("proxy config for %s: %w", host, err)
		}
		path := filepath.Join(state, host+".toml")
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			return nil, "", err
		}
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), proxydEnv+"="+path, proxydCPUEnv+"="+strconv.Itoa([]int{cpuA, cpuB}[i]))
		if o.cpuprofile != "" {
			cmd.Env = append(cmd.Env, proxydProfEnv+"="+o.cpuprofile+".proxy-"+host)
		}
		if o.trace != "" {
			cmd.Env = append(cmd.Env, proxydTrace+"="+o.trace+".proxy-"+host)
		}
		cmd.Stderr = os.Stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return nil, "", fmt.Errorf("start proxy %s: %w", host, err)
		}
		r.daemon = append(r.daemon, cmd)
	}
	for _, c := range cfgs {
		if err := waitUnix(c.Path(config.ProxySocket), 10*time.Second); err != nil {
			return nil, "", err
		}
	}
	if r.app, err = socklike.AttachProxy(cfgs[1].Path(config.ProxySocket), appConfig(o)); err != nil {
		return nil, "", err
	}
	lc := socklike.ListenConfig{Proxy: r.app, Pool: pool}
	ln, err := lc.Listen(context.Background(), "ntb", ":0")
	if err != nil {
		return nil, "", err
	}
	r.Listener = ln
	return r, fmt.Sprintf("%s b:%d", cfgs[0].Path(config.ProxySocket), ln.Addr().(socklike.Addr).Port), nil
}

// Close stops listening, detaches, stops both proxies and removes their
// files.
func (r *proxyRack) Close() error {
	var errs []error
	if r.Listener != nil {
		errs = append(errs, r.Listener.Close())
	}
	if r.app != nil {
		errs = append(errs, r.app.Close())
	}
	for _, cmd := range r.daemon {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(3 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	}
	for _, d := range r.dirs {
		os.RemoveAll(d)
	}
	return errors.Join(errs...)
}

func waitUnix(path string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		c, err := net.Dial("unix", path)
		if err == nil {
			return c.Close()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ntproxy at %s did not come up: %w", path, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// otherCPU returns an online CPU other than cpu (cpu itself on a 1-CPU
// machine).
func otherCPU(cpu int) int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return cpu
	}
	for _, part := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, _ := strings.Cut(part, "-")
		first, err1 := strconv.Atoi(lo)
		last, err2 := strconv.Atoi(hi)
		if hi == "" {
			last, err2 = first, nil
		}
		if err1 != nil || err2 != nil {
			continue
		}
		for c := first; c <= last; c++ {
			if c != cpu {
				return c
			}
		}
	}
	return cpu
}

// runProxyd is a proxy daemon child: ntproxy on the configuration in
// $NTBENCH_PROXYD until SIGTERM.
func runProxyd(cfgPath string) int {
	if cpu, err := strconv.Atoi(os.Getenv(proxydCPUEnv)); err == nil && cpu >= 0 {
		runtime.GOMAXPROCS(1)
		if err := proc.SetAffinity([]int{cpu}); err != nil {
			fmt.Fprintf(os.Stderr, "ntbench proxyd: %v\n", err)
			return 1
		}
	}
	stop, err := startCapture(os.Getenv(proxydProfEnv), os.Getenv(proxydTrace))
	if err != nil {
		fmt.Fprintf(os.Stderr, "ntbench proxyd: %v\n", err)
		return 1
	}
	defer stop()
	cfg, err := config.Load(cfgPath)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ntbench proxyd: %v\n", err)
		return 1
	}
	s, err := proxy.New(cfg, proxy.Options{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "ntbench proxyd: %v\n", err)
		return 1
	}
	go func() {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
		<-sig
		s.Close()
	}()
	if err := s.ListenAndServe(); err != nil {
		fmt.Fprintf(os.Stderr, "ntbench proxyd: %v\n", err)
		return 1
	}
	return 0
}
