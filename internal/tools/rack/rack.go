// Package rack emulates a rack of ntstack hosts on one Linux machine, for
// integration tests and demos. Every host is a network namespace with its
// own address on a private bridge, its own state directory and config file
// (internal/daemon/config), and its own daemons: ntmon and ntproxy, or stand-ins a
// test chooses. The emulated NTB links are files in one fabric directory
// that every namespace sees: `ip netns exec` gives a process its own mount
// namespace but the same /dev/shm and /tmp.
//
//	root namespace                          host namespaces
//	bridge <name>-br ─┬─ veth <name>-v0 ══ eth0 192.168.X.10   <name>-a
//	  (no address)    ├─ veth <name>-v1 ══ eth0 192.168.X.11   <name>-b
//	                  └─ veth <name>-v2 ══ eth0 192.168.X.12   <name>-c
//	fabric dir /dev/shm/ntstack-<name>/  (link files, shared by all)
//	state root /tmp/ntstack-<name>/<host>/  config.toml, *.log, sockets
//
// Host i gets 192.168.X.(10+i) on its eth0 and the virtual address
// 10.77.X.(10+i), which is only a name in the configs. The bridge has no
// address, so the root namespace cannot reach the hosts over IP and two
// racks never route into each other: a subnet only has to be unique within
// its rack (Start still picks X at random in 200..250). Code in the root
// namespace reaches a host through Exec (a command run in its namespace),
// Enter (Go code on a thread moved into its namespace) or the Unix sockets
// in its state directory, which belong to no network namespace.
//
// Concurrency: a Rack's methods are safe for concurrent use, and Close may
// race with Kill and Restart (Restart then fails with "rack closed"). Racks
// are independent, so tests may run several at once, in one process or
// many: each has its own random name, hence its own namespaces, links and
// directories.
//
// Lifetime pitfalls:
//   - Namespaces, veths and the bridge are kernel objects that outlive the
//     process that made them. Close removes them; a test binary that crashes
//     or is killed first leaves them behind (with no processes, see below)
//     until Cleanup(prefix) or `ntrack down -prefix P` removes them.
//   - Linux sends a parent-death signal when the *thread* that forked the
//     child ends, and the Go runtime ends a thread whenever a goroutine
//     exits while locked to it (runtime.LockOSThread), whatever that thread
//     forked earlier for other goroutines. Daemons get SIGKILL as their
//     parent-death signal and are forked from one thread that lives as
//     long as the process (launcher.go); Exec's commands get it too but
//     are started by the caller, from any thread: in a process whose code
//     retires locked threads, such a command may die early. The launcher is
//     one goroutine that stays for the rest of the process; goroutine leak
//     checks must ignore runLauncher.
//   - Commands from Exec belong to the caller, who must Wait for them. Close
//     kills whatever still runs in the namespaces, daemons or not.
package rack

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sync"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/errs"
	"github.com/ntstack/ntstack/internal/wire/hostauth"
)

// Ports every host uses, on its rack address.
const (
	ControlPort  = config.DefaultControlPort // ntmon's peer listener (monitor.listen)
	MetricsPort  = 9470                      // ntmon's metrics (monitor.metrics)
	FallbackPort = 7480                      // ntproxy's TCP fallback (peers' fallback)
	RDMAPort     = 7490                      // ntproxy's RDMA listener (proxy.rdma.listen), if the host has a device
)

// ProxyEnv is the environment variable that tells an application where its
// host's ntproxy socket is; Exec sets it.
const ProxyEnv = "NTSTACK_PROXY"

// Names of files under a host's state directory.
const (
	ConfigFile = "config.toml"
	// KeyFile is each host's key, beside its configuration.
	KeyFile   = "host.key"
	logSuffix = ".log"
)

// DefaultReadyTimeout bounds the wait for a daemon's socket when
// Spec.ReadyTimeout is zero.
const DefaultReadyTimeout = 10 * time.Second

// Limits of a spec. Interface names have at most 15 bytes (IFNAMSIZ-1):
// the longest is a veth, "<name>-v<i>": 10 + 2 + 3 = 15.
const (
	maxNameLen = 10
	maxHosts   = 200
	hostBase   = 10 // host i is at subnet address .(hostBase+i)
)

// nameRE matches a rack name; it is also a valid prefix for Cleanup.
var nameRE = regexp.MustCompile(`^[a-z][a-z0-9]{0,9}$`)

// hostRE matches a host name: what config accepts, less '.' (which the
// link names would make ambiguous).
var hostRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$`)

// Spec describes a rack. Zero fields take the defaults their comments name.
type Spec struct {
	// Name prefixes every namespace, interface and default directory of the
	// rack: a lowercase letter then up to 9 lowercase letters or digits.
	// Default "ntr" and 5 random hex digits.
	Name string
	// Hosts are the host names, in order: host i gets address .(10+i).
	// Required. Letters, digits, '_' and '-'.
	Hosts []string
	// Links are the pairs of hosts joined by an emulated NTB link, named
	// "<Name>-<a>-<b>" with a < b. nil means every pair of hosts not in
	// OffRack; an empty, non-nil slice means none.
	Links [][2]string
	// OffRack hosts have no NTB link: peers reach them over TCP only.
	OffRack []string
	// Subnet holds the hosts' addresses: an IPv4 prefix with room for
	// .10 up to .(10+len(Hosts)-1). Default 192.168.X.0/24, X random in
	// 200..250.
	Subnet netip.Prefix
	// FabricDir is proxy.fabric_dir of every host. It must not exist or be
	// empty; Close removes it. Default /dev/shm/ntstack-<Name>.
	FabricDir string
	// StateRoot holds a directory per host: its state_dir, config file and
	// daemon logs. Default $TMPDIR/ntstack-<Name>. Close removes the host
	// directories, and StateRoot itself if Start created it, unless
	// KeepState. Keep it short: socket paths under it must fit in 107
	// bytes.
	StateRoot string
	// KeepState keeps the host directories (configs, logs) after Close.
	KeepState bool
	// Window and Partitions set proxy.window and proxy.partitions of every
	// host (0: config's defaults).
	Window, Partitions int
	// ACL is each host's access-control list, by host name.
	ACL map[string][]config.Rule
	// Configure, if set, adjusts each host's configuration before it is
	// written (e.g. a short monitor.peer_timeout for failure tests). The
	// result must still pass config.Parse.
	Configure func(c *config.Config)
	// BinDir runs the real daemons from this directory (see Daemons).
	// Set BinDir or Daemons, not both; neither runs no daemons.
	BinDir string
	// Daemons run on every host, started in order: the first daemon on
	// every host, waiting for its Socket, then the next.
	Daemons []Daemon
	// ReadyTimeout bounds each wait for a daemon's Socket (default
	// DefaultReadyTimeout).
	ReadyTimeout time.Duration
}

// Daemon is a long-running program every host of a rack runs.
type Daemon struct {
	// Name identifies the daemon in Kill, Restart and Pid and names its
	// log, <state dir>/<Name>.log (stdout and stderr, appended).
	Name string
	// Argv returns the command line for a host; Argv[0] is looked up in
	// the PATH. The command runs in the host's namespace, in the root
	// mount namespace's file system.
	Argv func(h *Host) []string
	// Env is added to this process's environment.
	Env []string
	// Socket, if set, is a Unix socket under the host's state directory
	// that accepts once the daemon is ready: Start and Restart wait for it.
	Socket string
}

// Daemons returns the real daemons, `ntmon -config FILE` then
// `ntproxy -config FILE` from binDir, ready when ntmon.sock and
// ntproxy.sock accept.
func Daemons(binDir string) []Daemon {
	bin := func(name string) func(h *Host) []string {
		return func(h *Host) []string {
			return []string{filepath.Join(binDir, name), "-config", h.ConfigPath}
		}
	}
	return []Daemon{
		{Name: "ntmon", Argv: bin("ntmon"), Socket: config.MonitorSocket},
		{Name: "ntproxy", Argv: bin("ntproxy"), Socket: config.ProxySocket},
	}
}

// Host is one host of a rack. Its fields are fixed once Start returns.
type Host struct {
	Name    string
	Index   int    // position in Spec.Hosts
	Netns   string // namespace name, "<rack>-<host>"
	IP      netip.Addr
	Address string // virtual address (a name in the configs only)
	OffRack bool
	// Config is the configuration as the daemons read it back.
	Config     *config.Config
	ConfigPath string
	StateDir   string
	// KeyPath is the host's key (auth.key); KeyPin is its pin, as its
	// peers' configurations hold it.
	KeyPath string
	KeyPin  string
	key     []byte // the key file's contents, written by Start
}

// NetnsPath is where `ip netns add` bound the host's namespace.
func (h *Host) NetnsPath() string { return filepath.Join(netnsDir, h.Netns) }

// LogPath is the log file of one of the host's daemons.
func (h *Host) LogPath(daemon string) string {
	return filepath.Join(h.StateDir, daemon+logSuffix)
}

// netnsDir is where iproute2 binds named network namespaces.
const netnsDir = "/run/netns"

// Rack is a running emulated rack. Close it.
type Rack struct {
	name      string
	bridge    string
	subnet    netip.Prefix
	fabricDir string
	stateRoot string
	keepState bool
	daemons   []Daemon
	ready     time.Duration
	hosts     []*Host
	byName    map[string]*Host

	// made lists what Start created, for Close to undo; written by Start
	// before the Rack is shared.
	made struct {
		bridge   bool
		netns    []string
		veths    []string
		fabric   bool
		root     bool
		hostDirs []string
	}

	mu sync.Mutex
	// mu protects the following fields.
	procs  map[string]*process // by procKey
	closed bool

	closeOnce sync.Once
	closeErr  error
}

// ErrNotSupported is matched (errors.Is) by the error Start returns when
// this machine cannot run a rack; the error says why.
var ErrNotSupported = errs.ErrNotSupported

// NotSupportedError reports what an emulated rack lacks here.
type NotSupportedError struct{ Reason string }

func (e *NotSupportedError) Error() string {
	return "emulated rack not supported: " + e.Reason
}

// Is makes the error match ErrNotSupported.
func (e *NotSupportedError) Is(target error) bool { return target == ErrNotSupported }

// Supported reports whether this machine can run a rack: Linux, root and
// iproute2's ip. It returns a *NotSupportedError if not.
func Supported() error {
	if runtime.GOOS != "linux" {
		return &NotSupportedError{Reason: "network namespaces need Linux, not " + runtime.GOOS}
	}
	if uid := os.Geteuid(); uid != 0 {
		return &NotSupportedError{Reason: fmt.Sprintf("creating network namespaces needs root (euid %d)", uid)}
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return &NotSupportedError{Reason: "no ip command (iproute2) in PATH"}
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		return &NotSupportedError{Reason: "kernel without network namespaces (no /proc/self/ns/net)"}
	}
	return nil
}

// Start builds and starts the rack spec describes: bridge, namespaces,
// addresses, configs, then the daemons, waiting for each daemon's Socket.
// ctx bounds Start only; the rack lives until Close. On error, Start undoes
// what it did; the error includes the output of a failing command and the
// log tail of a daemon that did not come up.
func Start(ctx context.Context, spec Spec) (r *Rack, err error) {
	r, err = plan(spec)
	if err != nil {
		return nil, fmt.Errorf("start rack: %w", err)
	}
	if err := Supported(); err != nil {
		return nil, fmt.Errorf("start rack %s: %w", r.name, err)
	}
	defer func() {
		if err != nil {
			err = errors.Join(fmt.Errorf("start rack %s: %w", r.name, err), r.Close())
			r = nil
		}
	}()
	if err := r.setupNetwork(ctx); err != nil {
		return r, err
	}
	if err := r.setupFiles(); err != nil {
		return r, err
	}
	for _, d := range r.daemons {
		for _, h := range r.hosts {
			if err := r.startDaemon(h, d); err != nil {
				return r, err
			}
		}
		if d.Socket == "" {
			continue
		}
		for _, h := range r.hosts {
			if err := r.waitSocket(ctx, h, d.Socket, r.ready); err != nil {
				return r, err
			}
		}
	}
	return r, nil
}

// plan validates spec and fills in the defaults, the hosts and their
// configurations, without touching the system.
func plan(spec Spec) (*Rack, error) {
	name := spec.Name
	if name == "" {
		name = fmt.Sprintf("ntr%05x", rand.IntN(1<<20))
	}
	if !nameRE.MatchString(name) {
		return nil, fmt.Errorf("rack name %q: want a lowercase letter then up to %d lowercase letters or digits", name, maxNameLen-1)
	}
	r := &Rack{
		name:      name,
		bridge:    name + "-br",
		subnet:    spec.Subnet,
		fabricDir: spec.FabricDir,
		stateRoot: spec.StateRoot,
		keepState: spec.KeepState,
		daemons:   spec.Daemons,
		ready:     spec.ReadyTimeout,
		byName:    make(map[string]*Host),
		procs:     make(map[string]*process),
	}
	if len(spec.Hosts) == 0 || len(spec.Hosts) > maxHosts {
		return nil, fmt.Errorf("rack %s: %d hosts: want 1..%d", name, len(spec.Hosts), maxHosts)
	}
	if !r.subnet.IsValid() {
		r.subnet = netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 168, byte(200 + rand.IntN(51)), 0}), 24)
	}
	if !r.subnet.Addr().Is4() || r.subnet.Masked() != r.subnet || r.subnet.Bits() > 30 {
		return nil, fmt.Errorf("rack %s: subnet %v: want an IPv4 network address with its prefix length", name, r.subnet)
	}
	if r.fabricDir == "" {
		r.fabricDir = filepath.Join("/dev/shm", "ntstack-"+name)
	}
	if r.stateRoot == "" {
		r.stateRoot = filepath.Join(os.TempDir(), "ntstack-"+name)
	}
	if spec.BinDir != "" {
		if len(spec.Daemons) > 0 {
			return nil, fmt.Errorf("rack %s: both BinDir and Daemons set", name)
		}
		r.daemons = Daemons(spec.BinDir)
	}
	seen := map[string]bool{}
	for _, d := range r.daemons {
		if !hostRE.MatchString(d.Name) || seen[d.Name] || d.Argv == nil {
			return nil, fmt.Errorf("rack %s: daemon %q: want a unique name of letters, digits, '_' or '-' and an Argv", name, d.Name)
		}
		seen[d.Name] = true
	}
	if r.ready <= 0 {
		r.ready = DefaultReadyTimeout
	}

	offRack := map[string]bool{}
	for _, h := range spec.OffRack {
		offRack[h] = true
	}
	addr := r.subnet.Addr()
	for range hostBase {
		addr = addr.Next()
	}
	for i, hn := range spec.Hosts {
		if !hostRE.MatchString(hn) {
			return nil, fmt.Errorf("rack %s: host %q: want up to 32 letters, digits, '_' or '-'", name, hn)
		}
		if r.byName[hn] != nil {
			return nil, fmt.Errorf("rack %s: host %q listed twice", name, hn)
		}
		if !r.subnet.Contains(addr.Next()) { // keep the broadcast address free
			return nil, fmt.Errorf("rack %s: subnet %v has no room for host %d (%s)", name, r.subnet, i, hn)
		}
		a4 := addr.As4()
		stateDir := filepath.Join(r.stateRoot, hn)
		h := &Host{
			Name:       hn,
			Index:      i,
			Netns:      name + "-" + hn,
			IP:         addr,
			Address:    fmt.Sprintf("10.77.%d.%d", a4[2], a4[3]),
			OffRack:    offRack[hn],
			ConfigPath: filepath.Join(stateDir, ConfigFile),
			StateDir:   stateDir,
			KeyPath:    filepath.Join(stateDir, KeyFile),
		}
		// Every host gets a key and pins its peers': a rack runs
		// authenticated and encrypted unless Configure says insecure.
		var err error
		if h.key, h.KeyPin, err = hostauth.Generate(hn); err != nil {
			return nil, fmt.Errorf("rack %s: %w", name, err)
		}
		for _, s := range []string{config.MonitorSocket, config.ProxySocket, config.AdminSocket} {
			if p := filepath.Join(stateDir, s); len(p) >= 108 { // sun_path
				return nil, fmt.Errorf("rack %s: socket path %s: longer than a Unix socket address allows; use a shorter StateRoot", name, p)
			}
		}
		r.hosts = append(r.hosts, h)
		r.byName[hn] = h
		addr = addr.Next()
	}
	for h := range offRack {
		if r.byName[h] == nil {
			return nil, fmt.Errorf("rack %s: off-rack host %q is not in Hosts", name, h)
		}
	}

	links, err := r.linkNames(spec.Links, offRack)
	if err != nil {
		return nil, err
	}
	for _, h := range r.hosts {
		c := &config.Config{
			Host:      h.Name,
			Addresses: []string{h.Address},
			StateDir:  h.StateDir,
			Monitor: config.Monitor{
				Listen:  netip.AddrPortFrom(h.IP, ControlPort).String(),
				Metrics: netip.AddrPortFrom(h.IP, MetricsPort).String(),
			},
			Proxy: config.Proxy{
				FabricDir:  r.fabricDir,
				Window:     spec.Window,
				Partitions: spec.Partitions,
				Fallback:   netip.AddrPortFrom(h.IP, FallbackPort).String(),
				RDMA:       config.RDMA{Listen: netip.AddrPortFrom(h.IP, RDMAPort).String()},
			},
			ACL:  spec.ACL[h.Name],
			Auth: config.Auth{Key: h.KeyPath},
		}
		for _, p := range r.hosts {
			if p == h {
				continue
			}
			c.Peers = append(c.Peers, config.Peer{
				Host:      p.Name,
				Control:   netip.AddrPortFrom(p.IP, ControlPort).String(),
				Addresses: []string{p.Address},
				Link:      links[pairOf(h.Name, p.Name)],
				Fallback:  netip.AddrPortFrom(p.IP, FallbackPort).String(),
				Key:       p.KeyPin,
			})
		}
		if spec.Configure != nil {
			spec.Configure(c)
		}
		h.Config = c
	}
	for hn := range spec.ACL {
		if r.byName[hn] == nil {
			return nil, fmt.Errorf("rack %s: ACL for unknown host %q", name, hn)
		}
	}
	return r, nil
}

// pairOf orders a pair of host names.
func pairOf(a, b string) [2]string {
	if b < a {
		a, b = b, a
	}
	return [2]string{a, b}
}

// linkNames names the rack's links by host pair.
func (r *Rack) linkNames(pairs [][2]string, offRack map[string]bool) (map[[2]string]string, error) {
	if pairs == nil {
		for i, a := range r.hosts {
			for _, b := range r.hosts[i+1:] {
				if !offRack[a.Name] && !offRack[b.Name] {
					pairs = append(pairs, [2]string{a.Name, b.Name})
				}
			}
		}
	}
	links := make(map[[2]string]string, len(pairs))
	for _, p := range pairs {
		for _, h := range p {
			if r.byName[h] == nil {
				return nil, fmt.Errorf("rack %s: link %s-%s: unknown host %q", r.name, p[0], p[1], h)
			}
			if offRack[h] {
				return nil, fmt.Errorf("rack %s: link %s-%s: host %q is off-rack", r.name, p[0], p[1], h)
			}
		}
		if p[0] == p[1] {
			return nil, fmt.Errorf("rack %s: link %s-%s joins a host to itself", r.name, p[0], p[1])
		}
		k := pairOf(p[0], p[1])
		if links[k] != "" {
			return nil, fmt.Errorf("rack %s: link %s-%s listed twice", r.name, k[0], k[1])
		}
		links[k] = r.name + "-" + k[0] + "-" + k[1]
	}
	return links, nil
}

// setupFiles makes the fabric and state directories and writes the
// configs, reading each back as the daemons will.
func (r *Rack) setupFiles() error {
	if err := os.Mkdir(r.fabricDir, 0o755); err == nil {
		r.made.fabric = true
	} else if !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create fabric dir: %w", err)
	} else if ents, err := os.ReadDir(r.fabricDir); err != nil || len(ents) > 0 {
		return fmt.Errorf("create fabric dir %s: exists and is not an empty directory", r.fabricDir)
	} else {
		r.made.fabric = true // empty and ours now: Close removes it
	}
	if _, err := os.Stat(r.stateRoot); errors.Is(err, os.ErrNotExist) {
		r.made.root = true
	}
	if err := os.MkdirAll(r.stateRoot, 0o755); err != nil {
		return fmt.Errorf("create state root: %w", err)
	}
	for _, h := range r.hosts {
		if err := os.Mkdir(h.StateDir, 0o755); err != nil {
			return fmt.Errorf("create state dir of %s: %w", h.Name, err)
		}
		r.made.hostDirs = append(r.made.hostDirs, h.StateDir)
		if err := writeKey(h.KeyPath, h.key); err != nil {
			return fmt.Errorf("write key of %s: %w", h.Name, err)
		}
		c, err := writeConfig(h.ConfigPath, h.Config)
		if err != nil {
			return fmt.Errorf("write config of %s: %w", h.Name, err)
		}
		h.Config = c
	}
	return nil
}

// writeKey writes a host key, readable by its owner only.
func writeKey(path string, key []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(key)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// writeConfig writes c to path and returns it as config.Load reads it.
func writeConfig(path string, c *config.Config) (*config.Config, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, err
	}
	err = c.Encode(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	return config.Load(path)
}

// Name is the rack's name, the prefix of everything it creates.
func (r *Rack) Name() string { return r.name }

// Bridge is the name of the rack's bridge in the root namespace.
func (r *Rack) Bridge() string { return r.bridge }

// Subnet holds the hosts' rack addresses.
func (r *Rack) Subnet() netip.Prefix { return r.subnet }

// FabricDir is where the emulated NTB links live.
func (r *Rack) FabricDir() string { return r.fabricDir }

// StateRoot holds the hosts' state directories.
func (r *Rack) StateRoot() string { return r.stateRoot }

// Hosts returns the hosts in Spec order. The slice is the caller's.
func (r *Rack) Hosts() []*Host { return slices.Clone(r.hosts) }

// Host returns the host called name, or nil.
func (r *Rack) Host(name string) *Host { return r.byName[name] }

// host returns the host called name or an error naming the operation.
func (r *Rack) host(op, name string) (*Host, error) {
	h := r.byName[name]
	if h == nil {
		return nil, fmt.Errorf("%s: rack %s has no host %q", op, r.name, name)
	}
	return h, nil
}
