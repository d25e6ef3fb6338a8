// Package config is the host configuration shared by ntmon and ntproxy: one
// TOML file names this host, its virtual addresses, its rack peers with the
// links that join them, the fallback endpoints and the access-control list.
// Both daemons of a host read the same file. example.toml beside this file
// is the commented reference; Load validates everything it reads.
//
// A Config is plain data: safe to share once loaded, never mutated.
package config

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/ntstack/ntstack/internal/prim/pool"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/internal/wire/hostauth"
)

// Defaults for fields left out of the file.
const (
	DefaultStateDir      = "/run/ntstack"
	DefaultFabricDir     = "/dev/shm/ntstack"
	DefaultHeartbeat     = 500 * time.Millisecond
	DefaultPeerTimeout   = 2 * time.Second
	DefaultWindow        = 16 << 20
	DefaultAppWindow     = 4 << 20
	DefaultPartitions    = 1
	DefaultControlPort   = 7470
	DefaultMaxAppsPerUID = 64
	DefaultDirectWindow  = 4 << 20
	DefaultDirectQuota   = 256 << 20
	// A shared pool of 32 slots of two 4 MiB rings is 256 MiB of address
	// space per application; only the rings' written pages take memory
	// (up to 8 MiB for a connection that streams, as a proxied one's leg
	// buffers take in each proxy). 4 MiB rings stream about 40 % faster
	// than 1 MiB ones on the 2-vCPU test machine (a 1 MiB-write stream
	// 4.0 vs 2.8 GB/s, medians of 3), at the same round-trip latency.
	DefaultPoolSlots = 32
	DefaultPoolRing  = 4 << 20
)

// Config is one host's configuration.
type Config struct {
	// Host is this host's name in the rack, unique among its peers.
	Host string `toml:"host"`
	// Addresses are this host's virtual addresses: a dial to any of them
	// (or to Host) from another rack host reaches this host.
	Addresses []string `toml:"addresses"`
	// StateDir holds the daemons' Unix sockets (SocketPaths).
	StateDir string `toml:"state_dir"`

	Monitor Monitor `toml:"monitor"`
	Proxy   Proxy   `toml:"proxy"`
	Gateway Gateway `toml:"gateway"`
	Peers   []Peer  `toml:"peers"`
	ACL     []Rule  `toml:"acl"`
	// Quota bounds each local user's applications (quota.go).
	Quota Quota `toml:"quota"`

	// Auth is this host's identity on the channels between hosts.
	Auth Auth `toml:"auth"`
}

// Gateway configures ntproxy's TCP gateway, which carries the connections
// of unmodified TCP clients and servers over the fabric.
type Gateway struct {
	// Mode is how forwarded connections cross the fabric: "trunk" (the
	// default: connections on one link shared by the two hosts' gateways,
	// or as in direct mode where there is none), "direct" (a granted link
	// of their own) or "proxy" (through ntproxy).
	Mode string `toml:"mode"`
	// RedirectCgroup is a cgroup2 directory: connects from its processes
	// to a forward's rack addresses are rewritten, by an eBPF program, to
	// the forward's listen address ("" = no redirect).
	RedirectCgroup string    `toml:"redirect_cgroup"`
	Forward        []Forward `toml:"forward"`
	Export         []Export  `toml:"export"`
}

// Forward is a local TCP port whose connections the gateway carries to a
// rack address.
type Forward struct {
	// Listen is the local TCP address ("127.0.0.1:16379").
	Listen string `toml:"listen"`
	// To is the rack address ("b:6379" or "10.77.0.2:6379").
	To string `toml:"to"`
}

// Export is a rack port of this host whose connections the gateway
// carries to a local TCP server.
type Export struct {
	Port int `toml:"port"`
	// Target is the TCP server's address ("127.0.0.1:6379").
	Target string `toml:"target"`
}

// Gateway modes.
const (
	GatewayTrunk  = "trunk"
	GatewayDirect = "direct"
	GatewayProxy  = "proxy"
)

// GatewayTrunkPort is the rack port a gateway with exports listens on
// for its peers' gateways to open a trunk (gateway.mode "trunk"): below
// 1024, so that only a privileged process — ntproxy — may listen on it.
const GatewayTrunkPort = 1023

// Monitor configures ntmon.
type Monitor struct {
	// Listen is the TCP address peer ntmons reach this one on.
	Listen string `toml:"listen"`
	// Metrics is the TCP address of the Prometheus endpoint ("" disables).
	Metrics string `toml:"metrics"`
	// Heartbeat is the interval of liveness messages to peers.
	Heartbeat Duration `toml:"heartbeat"`
	// PeerTimeout declares a silent peer down.
	PeerTimeout Duration `toml:"peer_timeout"`
}

// Proxy configures ntproxy.
type Proxy struct {
	// FabricDir is where emulated NTB link files live.
	FabricDir string `toml:"fabric_dir"`
	// Window is each side's window of a rack link, in bytes.
	Window int `toml:"window"`
	// Partitions is the data partitions per rack link (both ends agree).
	Partitions int `toml:"partitions"`
	// AppWindow is each side's window of an application's attachment.
	AppWindow int `toml:"app_window"`
	// SpinBudget is socklike's spin-before-park budget ("" = socklike's).
	SpinBudget Duration `toml:"spin_budget"`
	// LinkTimeout makes a rack link suspect when the peer's heartbeat
	// stops for this long ("" = the fabric's default, 500 ms); the link
	// goes down as silent only after transport.DefaultUserTimeout. A dead
	// peer process is seen sooner, from its released locks.
	LinkTimeout Duration `toml:"link_timeout"`
	// MaxAppsPerUID bounds attachments per local user.
	MaxAppsPerUID int `toml:"max_apps_per_uid"`
	// DirectWindow is each side's window of a direct connection's link.
	// Half its ring is the most a stream has in flight: the 4 MiB default
	// keeps 1 MiB, which one 64 KiB stream on the 2-vCPU VM drives at
	// 16.3 GB/s; 16 MiB keeps 4 MiB, 21.8 GB/s (more than an L2 in
	// flight; see socklike Config.Window), at four times the memory, so
	// DirectQuota admits a quarter of the connections (medians of 3).
	DirectWindow int `toml:"direct_window"`
	// DirectQuota bounds the window memory of one application's direct
	// connections (both sides of each link count).
	DirectQuota int64 `toml:"direct_quota"`
	// PoolSlots is how many shared-pool connections one application may
	// have at a time (its pool's slots; -1: no pool, shared-pool mode
	// off). Beyond them a shared-pool dial settles for proxy mode.
	PoolSlots int `toml:"pool_slots"`
	// PoolRing is each direction's ring of a shared-pool connection, in
	// bytes (a power of two, 4 KiB-64 MiB).
	PoolRing int `toml:"pool_ring"`
	// Fallback is the TCP address this ntproxy accepts connections from
	// peers that cannot use an NTB link to reach it ("" = none); peers
	// name it as this host's peers[].fallback.
	Fallback string `toml:"fallback"`
	// RDMA is this ntproxy's RDMA listener, the path to and from hosts off
	// the NTB fabric that have an RDMA device too.
	RDMA RDMA `toml:"rdma"`
}

// RDMA configures the verbs provider of ntproxy's RDMA path (rdma.Verbs;
// the daemons must be built with -tags verbs). The peers learn the
// listener's address from ntmon's capability exchange, and only while
// this host has a usable RDMA device.
type RDMA struct {
	// Listen is the TCP address of the connection bootstrap, on the
	// RDMA-capable interface ("" = no RDMA path).
	Listen string `toml:"listen"`
	// Device names the RDMA device ("rxe0", "mlx5_0"; "" = the first).
	Device string `toml:"device"`
	// Port is the device's port (0 = 1).
	Port int `toml:"port"`
}

// Peer is another host of the rack.
type Peer struct {
	Host string `toml:"host"`
	// Control is the peer ntmon's TCP address.
	Control string `toml:"control"`
	// Addresses are the peer's virtual addresses.
	Addresses []string `toml:"addresses"`
	// Link names the emulated NTB link to the peer ("" = no NTB link).
	Link string `toml:"link"`
	// Fallback is a TCP address that reaches the peer off the fabric.
	Fallback string `toml:"fallback"`
	// Transports restricts and orders the paths to the peer: a subset of
	// "ntb", "rdma", "tcp" (default: all three, in that order).
	Transports []string `toml:"transports"`
	// Key pins the peer's host key: "ed25519:<base64>" as `ntmon keygen`
	// prints it, or "sha256:<base64>" of its SubjectPublicKeyInfo ("" =
	// vouched for by auth.ca).
	Key string `toml:"key"`
}

// Paths is p as route choice sees it (ctlapi.PickRoute).
func (p Peer) Paths() ctlapi.Paths {
	return ctlapi.Paths{Host: p.Host, Link: p.Link, Fallback: p.Fallback, Transports: p.Transports}
}

// Rule is one access-control entry. Rules are tried in order and the first
// that matches decides; a connection no rule matches is allowed.
type Rule struct {
	Action string `toml:"action"` // "allow" or "deny"
	// Direction is "out" (connects from this host), "in" (connects to this
	// host) or "" (both).
	Direction string `toml:"direction"`
	// UID is the local user, outbound only; absent or -1 matches anyone.
	UID *int `toml:"uid"`
	// Host is the remote host name; "" or "*" matches any.
	Host string `toml:"host"`
	// Port is the destination port; 0 matches any.
	Port int `toml:"port"`
}

// Auth is a host's identity: its key, and how its peers' keys are known.
// Every channel between two hosts (ntmon's peer sessions, the proxies'
// fallback legs, the RDMA bootstrap) runs TLS 1.3, authenticated both ways
// (package hostauth).
type Auth struct {
	// Key is this host's key file (private key and certificate, PEM, mode
	// 0600), as `ntmon keygen` writes it.
	Key string `toml:"key"`
	// CA is a rack CA's certificate file: a peer without a pinned key
	// (peers[].key) is trusted if the CA signed a certificate naming it.
	CA string `toml:"ca"`
	// Insecure runs without a key: nothing between hosts is authenticated
	// or encrypted, and status and doctor say so. Without a key the
	// daemons refuse to start unless this is set.
	Insecure bool `toml:"insecure"`
}

// Secure reports whether the host authenticates its peers: it has a key.
func (c *Config) Secure() bool { return c.Auth.Key != "" }

// HostAuth loads the host's identity (nil when Insecure and keyless). A
// host with no key that is not explicitly insecure is an error, as is a
// peer with neither a pin nor a CA.
func (c *Config) HostAuth() (*hostauth.Auth, error) {
	if c.Auth.Key == "" {
		if c.Auth.Insecure {
			return nil, nil
		}
		return nil, fmt.Errorf("host %s has no key (auth.key): run `ntmon keygen -host %s -out FILE` and pin its key in the peers' configurations, or set auth.insecure = true to run unauthenticated", c.Host, c.Host)
	}
	cert, err := hostauth.LoadKey(c.Auth.Key)
	if err != nil {
		return nil, err
	}
	var ca *x509.CertPool
	if c.Auth.CA != "" {
		if ca, err = hostauth.LoadCA(c.Auth.CA); err != nil {
			return nil, err
		}
	}
	pins := map[string]string{}
	for _, p := range c.Peers {
		pins[p.Host] = p.Key
	}
	a, err := hostauth.New(c.Host, cert, pins, ca)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	return a, nil
}

// InsecureWarning is the line status and doctor print for a host that
// runs without authentication ("" for one that authenticates).
func (c *Config) InsecureWarning() string {
	if c.Secure() {
		return ""
	}
	return "WARNING: INSECURE: auth.insecure is set and this host has no key: any host on the network can pose as a peer, resume or read its connections; run `ntmon keygen`"
}

// Matches reports whether r applies to a connection.
func (r Rule) Matches(dir string, uid int, host string, port int) bool {
	return (r.Direction == "" || r.Direction == dir) &&
		(r.UID == nil || *r.UID == -1 || dir != "out" || *r.UID == uid) &&
		(r.Host == "" || r.Host == "*" || r.Host == host) &&
		(r.Port == 0 || r.Port == port)
}

// Allowed applies the ACL to a connection: the first matching rule wins,
// no match allows. It returns the deciding rule's index, or -1.
func (c *Config) Allowed(dir string, uid int, host string, port int) (bool, int) {
	for i, r := range c.ACL {
		if r.Matches(dir, uid, host, port) {
			return r.Action == "allow", i
		}
	}
	return true, -1
}

// Duration is a time.Duration written as a Go duration string ("500ms").
type Duration struct{ time.Duration }

// UnmarshalText parses a duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return err
	}
	d.Duration = v
	return nil
}

// MarshalText formats the duration.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// Load reads, defaults and validates the file at path.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	c, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("load config %s: %w", path, err)
	}
	return c, nil
}

// Parse decodes, defaults and validates a TOML document.
func Parse(b []byte) (*Config, error) {
	var c Config
	md, err := toml.Decode(string(b), &c)
	if err != nil {
		return nil, err
	}
	if un := md.Undecoded(); len(un) > 0 {
		return nil, fmt.Errorf("unknown key %q", un[0].String())
	}
	c.setDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

func (c *Config) setDefaults() {
	if c.StateDir == "" {
		c.StateDir = filepath.Join(DefaultStateDir, c.Host)
	}
	if c.Monitor.Heartbeat.Duration == 0 {
		c.Monitor.Heartbeat.Duration = DefaultHeartbeat
	}
	if c.Monitor.PeerTimeout.Duration == 0 {
		c.Monitor.PeerTimeout.Duration = DefaultPeerTimeout
	}
	if c.Proxy.FabricDir == "" {
		c.Proxy.FabricDir = DefaultFabricDir
	}
	if c.Proxy.Window == 0 {
		c.Proxy.Window = DefaultWindow
	}
	if c.Proxy.Partitions == 0 {
		c.Proxy.Partitions = DefaultPartitions
	}
	if c.Proxy.AppWindow == 0 {
		c.Proxy.AppWindow = DefaultAppWindow
	}
	if c.Proxy.DirectWindow == 0 {
		c.Proxy.DirectWindow = DefaultDirectWindow
	}
	if c.Proxy.DirectQuota == 0 {
		c.Proxy.DirectQuota = DefaultDirectQuota
	}
	if c.Proxy.PoolSlots == 0 {
		c.Proxy.PoolSlots = DefaultPoolSlots
	}
	if c.Proxy.PoolRing == 0 {
		c.Proxy.PoolRing = DefaultPoolRing
	}
	if c.Proxy.MaxAppsPerUID == 0 {
		c.Proxy.MaxAppsPerUID = DefaultMaxAppsPerUID
	}
	if c.Gateway.Mode == "" {
		c.Gateway.Mode = GatewayTrunk
	}
	c.Quota.setDefaults()
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// Validate checks the configuration for mistakes a daemon cannot run with.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if !nameRE.MatchString(c.Host) {
		bad("host %q: want a name of letters, digits, '.', '_' or '-'", c.Host)
	}
	if c.Monitor.Listen != "" {
		if _, _, err := net.SplitHostPort(c.Monitor.Listen); err != nil {
			bad("monitor.listen %q: %v", c.Monitor.Listen, err)
		}
	}
	if c.Proxy.Fallback != "" {
		if _, _, err := net.SplitHostPort(c.Proxy.Fallback); err != nil {
			bad("proxy.fallback %q: %v", c.Proxy.Fallback, err)
		}
	}
	if c.Proxy.RDMA.Listen != "" {
		if _, _, err := net.SplitHostPort(c.Proxy.RDMA.Listen); err != nil {
			bad("proxy.rdma.listen %q: %v", c.Proxy.RDMA.Listen, err)
		}
	}
	if c.Proxy.RDMA.Port < 0 || c.Proxy.RDMA.Port > 255 {
		bad("proxy.rdma.port %d outside 0..255", c.Proxy.RDMA.Port)
	}
	if c.Proxy.Window <= 0 || c.Proxy.Window%4096 != 0 {
		bad("proxy.window %d: want a positive multiple of 4096", c.Proxy.Window)
	}
	if c.Proxy.AppWindow <= 0 || c.Proxy.AppWindow%4096 != 0 {
		bad("proxy.app_window %d: want a positive multiple of 4096", c.Proxy.AppWindow)
	}
	if c.Proxy.DirectWindow < 0 || c.Proxy.DirectWindow%4096 != 0 {
		bad("proxy.direct_window %d: want a positive multiple of 4096", c.Proxy.DirectWindow)
	}
	if c.Proxy.PoolSlots < -1 {
		bad("proxy.pool_slots %d: want -1 (no pool) or a count of slots", c.Proxy.PoolSlots)
	}
	if c.Proxy.PoolSlots > 0 {
		if err := pool.CheckGeometry(c.Proxy.PoolSlots, c.Proxy.PoolRing); err != nil {
			bad("proxy.pool_slots %d, proxy.pool_ring %d: %v", c.Proxy.PoolSlots, c.Proxy.PoolRing, err)
		}
	}
	if c.Proxy.Partitions < 1 || c.Proxy.Partitions > 30 {
		bad("proxy.partitions %d outside 1..30", c.Proxy.Partitions)
	}
	owner := map[string]string{}
	claim := func(addr, host string) {
		if prev, ok := owner[addr]; ok && prev != host {
			bad("address %q belongs to both %s and %s", addr, prev, host)
		}
		owner[addr] = host
	}
	claim(c.Host, c.Host)
	for _, a := range c.Addresses {
		claim(a, c.Host)
	}
	links := map[string]bool{}
	for i, p := range c.Peers {
		if !nameRE.MatchString(p.Host) || p.Host == c.Host {
			bad("peers[%d].host %q: want a name other than this host's", i, p.Host)
		}
		if p.Control != "" {
			if _, _, err := net.SplitHostPort(p.Control); err != nil {
				bad("peers[%d].control %q: %v", i, p.Control, err)
			}
		}
		if p.Fallback != "" {
			if _, _, err := net.SplitHostPort(p.Fallback); err != nil {
				bad("peers[%d].fallback %q: %v", i, p.Fallback, err)
			}
		}
		if p.Link != "" {
			if !nameRE.MatchString(p.Link) {
				bad("peers[%d].link %q: not a valid link name", i, p.Link)
			}
			if links[p.Link] {
				bad("peers[%d].link %q: used twice", i, p.Link)
			}
			links[p.Link] = true
		}
		for _, t := range p.Transports {
			if !slices.Contains(ctlapi.Transports, t) {
				bad("peers[%d].transports: %q is none of %v", i, t, ctlapi.Transports)
			}
		}
		if p.Key != "" {
			if _, err := hostauth.ParsePin(p.Key); err != nil {
				bad("peers[%d].key: %v", i, err)
			}
		}
		claim(p.Host, p.Host)
		for _, a := range p.Addresses {
			claim(a, p.Host)
		}
	}
	for i, r := range c.ACL {
		if r.Action != "allow" && r.Action != "deny" {
			bad("acl[%d].action %q: want allow or deny", i, r.Action)
		}
		if r.Direction != "" && r.Direction != "in" && r.Direction != "out" {
			bad("acl[%d].direction %q: want in, out or empty", i, r.Direction)
		}
		if r.Port < 0 || r.Port > 65535 {
			bad("acl[%d].port %d outside 0..65535", i, r.Port)
		}
	}
	c.validateGateway(bad)
	c.Quota.validate(bad)
	return errors.Join(errs...)
}

func (c *Config) validateGateway(bad func(string, ...any)) {
	g := c.Gateway
	if g.Mode != "" && g.Mode != GatewayTrunk && g.Mode != GatewayDirect && g.Mode != GatewayProxy {
		bad("gateway.mode %q: want %s, %s or %s", g.Mode, GatewayTrunk, GatewayDirect, GatewayProxy)
	}
	for i, f := range g.Forward {
		if _, _, err := net.SplitHostPort(f.Listen); err != nil {
			bad("gateway.forward[%d].listen %q: %v", i, f.Listen, err)
		}
		host, port, err := net.SplitHostPort(f.To)
		if err != nil {
			bad("gateway.forward[%d].to %q: %v", i, f.To, err)
			continue
		}
		if h, ok := c.HostOf(host); !ok || h == c.Host {
			bad("gateway.forward[%d].to %q: %s is not a rack peer", i, f.To, host)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			bad("gateway.forward[%d].to %q: bad port", i, f.To)
		}
	}
	for i, e := range g.Export {
		if e.Port < 1 || e.Port > 65534 {
			bad("gateway.export[%d].port %d outside 1..65534", i, e.Port)
		}
		if e.Port == GatewayTrunkPort {
			bad("gateway.export[%d].port %d is the gateways' trunk port", i, e.Port)
		}
		if _, _, err := net.SplitHostPort(e.Target); err != nil {
			bad("gateway.export[%d].target %q: %v", i, e.Target, err)
		}
	}
}

// HostOf returns the host that owns a dial target (a host name or a
// virtual address), and whether it is known.
func (c *Config) HostOf(target string) (string, bool) {
	if target == c.Host {
		return c.Host, true
	}
	for _, a := range c.Addresses {
		if a == target {
			return c.Host, true
		}
	}
	for _, p := range c.Peers {
		if target == p.Host {
			return p.Host, true
		}
		for _, a := range p.Addresses {
			if a == target {
				return p.Host, true
			}
		}
	}
	return "", false
}

// Peer returns the peer called host.
func (c *Config) Peer(host string) (Peer, bool) {
	for _, p := range c.Peers {
		if p.Host == host {
			return p, true
		}
	}
	return Peer{}, false
}

// Socket paths under StateDir.
const (
	MonitorSocket = "ntmon.sock"         // ntmon's local API (HTTP+JSON)
	ProxySocket   = "ntproxy.sock"       // applications attach here
	AdminSocket   = "ntproxy-admin.sock" // ntproxy's snapshot API (HTTP+JSON)
)

// Path returns the path of one of the sockets under StateDir.
func (c *Config) Path(socket string) string { return filepath.Join(c.StateDir, socket) }
