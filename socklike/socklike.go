// Package socklike is ntstack's application API: net.Conn and net.Listener
// over an NTB rack, so code written for the standard library's sockets
// (net/http, gRPC, Redis clients) runs over the fabric unchanged.
//
// A program reaches the rack in one of two modes:
//
//   - Attached (the usual one): the program attaches to its host's ntproxy
//     (a Proxy; by default the one $NTSTACK_PROXY names), which owns the
//     links, and dials or listens by host name or virtual address across
//     the rack. A connection goes through ntproxy (proxy mode), gets a link
//     of its own between the two programs (Dialer.Direct), or goes through a
//     buffer pool the program shares with ntproxy (Dialer.Pool).
//   - Embedded: the program maps its end of one link itself (an Endpoint)
//     and talks to the one peer at the other end.
//
// Either way there is one way in for each direction: a Dialer dials (its
// fields choose the mode), a ListenConfig listens, and every connection is
// a *Conn that says which path it took and why (Conn.Route).
//
// Semantics follow the standard library's TCP connections: io.EOF at the
// end of the stream, net.ErrClosed after Close, deadlines that wake
// blocked calls with errors satisfying os.ErrDeadlineExceeded, every other
// error a *net.OpError; a refused connection wraps syscall.ECONNREFUSED and
// a taken port syscall.EADDRINUSE. A connection outlives its link's
// outages: a link that flaps or restarts its session costs a pause, and
// the connection resumes, losing nothing. It fails only when its peer is
// gone — its process exited, or it closed its Endpoint: the error wraps
// syscall.ECONNRESET, and says which — or unreachable for longer than
// Config.UserTimeout (syscall.ETIMEDOUT); every such error also wraps
// ErrLinkDown.
//
// Flow control is by credit: a connection's writer never has more than the
// reader's receive window (Config.Window) unread, so one slow reader slows
// only its own writer, and memory stays bounded by connections × window. A
// blocked call spins for Config.SpinBudget before it sleeps: a busy pair of
// programs never waits for a wake-up, an idle one costs next to nothing.
//
// Concurrency: every method is safe for concurrent use; as with net.Conn,
// one Read and one Write may run at once on a connection. Lifetime:
// closing an Endpoint or a Proxy ends every connection and listener made
// through it; an Endpoint closes its device only if Open opened it.
package socklike

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/shm"
)

// Defaults for Config.
const (
	DefaultSpinBudget = 50 * time.Microsecond
	DefaultWindow     = 4 << 20
	DefaultMTU        = 64 << 10
)

// Config configures this process's side of a link: an Endpoint's, or in
// attached mode the memory link to ntproxy (where the partition and fabric
// fields are ntproxy's business and ignored). The zero value is usable.
type Config struct {
	// SpinBudget is how long a blocked call polls before it sleeps
	// (default DefaultSpinBudget). Polling answers within a microsecond;
	// sleeping costs a wake-up but no CPU. Negative: never spin.
	SpinBudget time.Duration
	// Window is each connection's receive window in bytes, 4 KiB..64 MiB
	// (default DefaultWindow). A connection is granted less while many
	// share the link's rings, never more than half a ring.
	Window int
	// MTU is the largest record; larger writes are cut into MTU-sized
	// records so that small messages interleave with bulk ones (default
	// DefaultMTU).
	MTU int
	// Backlog is the per-listener queue of connections not yet accepted
	// (default 128).
	Backlog int
	// UserTimeout is how long a connection waits for a peer it cannot
	// reach (link down, peer silent) before it fails with ETIMEDOUT
	// (default 10 s, the order of TCP's). A shorter outage, or the peer's
	// link restarting, costs a pause: the connection resumes where it
	// was. A peer that is gone (its process exited, its endpoint closed)
	// fails connections at once, with ECONNRESET.
	UserTimeout time.Duration
	// Partitions is the number of data partitions (ring pairs) of the
	// link, 1..30; both ends must agree (default 1). Connections are
	// spread over them.
	Partitions int
	// QoS gives each priority class (Dialer.Priority, Conn.SetPriority)
	// its own partition within a group of 8, so a class-0 message never
	// queues behind a lower class's records.
	QoS bool
	// CoreModel says who drives the partitions (default CoreInline).
	CoreModel CoreModel
	// MemoryQuota bounds the receive-window memory of all the Endpoint's
	// connections together (0: none); a dial beyond it fails, wrapping
	// qos.ErrQuota.
	MemoryQuota int64
	// Sockets says this process also waits on sockets (it serves or dials
	// TCP beside the fabric, as a gateway or relay does). It applies to the
	// whole process once one Endpoint or Proxy sets it: at most
	// GOMAXPROCS−1 goroutines then spin while they wait, so a processor is
	// left to the runtime's network poller; with GOMAXPROCS 1 nobody spins
	// (see transport.Config.Sockets).
	Sockets bool
	// DirectIdle (attached mode) is how long a direct link that carries no
	// connection any more is kept for the next direct dial to the same
	// address, which then skips opening a link of its own (default 5 s;
	// negative: no dial takes a link another opened, and a link closes
	// with its connection). The link's window stays charged to the
	// application's quota while it is kept.
	DirectIdle time.Duration
	// Fabric configures the emulated fabric for Open.
	Fabric shm.Options
	// Logf, if set, receives link and session events.
	Logf func(format string, args ...any)
}

// engine is the transport configuration c stands for.
func (c Config) engine() transport.Config {
	return transport.Config{
		SpinBudget:  c.SpinBudget,
		Window:      c.Window,
		MTU:         c.MTU,
		Backlog:     c.Backlog,
		UserTimeout: c.UserTimeout,
		Partitions:  c.Partitions,
		QoS:         c.QoS,
		CoreModel:   transport.CoreModel(c.CoreModel),
		MemoryQuota: c.MemoryQuota,
		Sockets:     c.Sockets,
		Fabric:      c.Fabric,
		Logf:        c.Logf,
	}
}

// CoreModel says who drives a link's partitions.
type CoreModel int

const (
	// CoreInline: no worker threads. The program's own Read and Write calls
	// send and receive, whoever finds a partition free serving everybody
	// queued on it. Best when cores are scarce.
	CoreInline CoreModel = iota
	// CoreShared: one worker thread per partition sends and receives.
	CoreShared
	// CoreSplit: a sending and a receiving worker thread per partition.
	CoreSplit
)

func (m CoreModel) String() string { return transport.CoreModel(m).String() }

// Errors. Dial, Listen and connection errors wrap them in a *net.OpError
// (in attached mode with ntproxy's explanation).
var (
	ErrLinkDown    = ntb.ErrLinkDown // the link or the session under the connection went down
	ErrDenied      = errors.New("denied by access control")
	ErrNoPath      = errors.New("no path to host")
	ErrUnknownHost = errors.New("unknown host")
	ErrVersion     = errors.New("protocol version mismatch")
	ErrProxy       = errors.New("ntproxy failure")
	ErrProxyGone   = errors.New("ntproxy went away")
)

// Addr is an ntstack address: a host (a rack host's name or virtual
// address; in embedded mode the link end) and a port.
type Addr struct {
	Host string
	Port int
}

var _ net.Addr = Addr{}

func (a Addr) Network() string { return "ntb" }
func (a Addr) String() string  { return net.JoinHostPort(a.Host, strconv.Itoa(a.Port)) }

// Route is the path a connection took, in which mode, and why. A fallback
// nobody can see is the commonest complaint about socket-compatible
// stacks; every Conn says which path it is on.
type Route struct {
	// Path is "shm" (both ends on one host, shared memory), "ntb" (a rack
	// peer over an NTB link), "rdma" or "tcp" (off the rack).
	Path string
	// Mode is "embedded" (an Endpoint's), "proxy", "direct" or "pool" (see
	// Dialer); a dial that settled for proxy mode says "proxy".
	Mode   string
	Reason string
}

// Endpoint is this process's own end of one NTB link (embedded mode). Dial
// and listen on it with a Dialer and a ListenConfig.
type Endpoint struct {
	ep *transport.Endpoint
}

// Open attaches this process to its end of the emulated link called name
// and returns an Endpoint that owns it.
func Open(name string, cfg Config) (*Endpoint, error) {
	ep, err := transport.Open(name, cfg.engine())
	if err != nil {
		return nil, err
	}
	return &Endpoint{ep: ep}, nil
}

// Attach runs an Endpoint over dev. Closing the Endpoint does not close dev.
func Attach(dev ntb.Device, cfg Config) (*Endpoint, error) {
	ep, err := transport.Attach(dev, cfg.engine())
	if err != nil {
		return nil, err
	}
	return &Endpoint{ep: ep}, nil
}

// Close ends every connection and listener and detaches from the link.
func (e *Endpoint) Close() error { return e.ep.Close() }

// embeddedRoute is the Route of an Endpoint's connections.
func (e *Endpoint) embeddedRoute() Route {
	return Route{Path: "ntb", Mode: "embedded", Reason: fmt.Sprintf("embedded endpoint on link %s", e.ep.Device().Name())}
}
