package rdma

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/ntstack/ntstack/internal/prim/errs"
)

// ErrNotSupported is matched (errors.Is) by the error Available returns
// when a provider cannot run here: built without the verbs tag, no RDMA
// device, a port that is down. The wrapping error says which and what to
// do about it.
var ErrNotSupported = errs.ErrNotSupported

// ErrProviderMismatch: the peer speaks the other provider, or another
// version of the handshake.
var ErrProviderMismatch = errors.New("rdma provider mismatch")

// Provider is one transport of the off-rack path. Its connections are
// byte streams with the standard library's semantics: deadlines that
// wake blocked calls with an error satisfying net.Error's Timeout and
// matching os.ErrDeadlineExceeded, Close waking blocked calls with
// net.ErrClosed, CloseWrite (see Conn) ending this direction with io.EOF
// at the peer.
type Provider interface {
	// Name is "verbs" or "tcp".
	Name() string
	// Available returns nil if Dial and Listen can work on this host, or
	// an error matching ErrNotSupported that says why not.
	Available() error
	// Dial connects to a Listen of the same provider at addr (host:port
	// of its TCP bootstrap socket). With Config.Auth set it fails: use
	// DialHost.
	Dial(ctx context.Context, addr string) (net.Conn, error)
	// DialHost is Dial to host's listener: with Config.Auth the
	// bootstrap must prove to be host.
	DialHost(ctx context.Context, addr, host string) (net.Conn, error)
	// Listen accepts connections on addr (host:port, TCP). Accept returns
	// connections whose handshake has completed.
	Listen(addr string) (net.Listener, error)
}

// Conn is implemented by every connection the providers return.
type Conn interface {
	net.Conn
	// CloseWrite ends the sending direction: the peer reads io.EOF after
	// the data written before it; this end can still read. Write then
	// fails with EPIPE.
	CloseWrite() error
	// Peer is the host the bootstrap authenticated (Config.Auth), ""
	// without authentication.
	Peer() string
}

// Config tunes a provider. The zero value is usable.
type Config struct {
	// RingSize is the size of each direction's receive ring in the verbs
	// provider, a power of two in [MinRingSize, MaxRingSize]; both ends
	// must agree. 0 means DefaultRingSize.
	RingSize int
	// Device names the RDMA device, as in /sys/class/infiniband ("rxe0",
	// "mlx5_0"); "" takes the first one.
	Device string
	// Port is the device's port number; 0 means 1.
	Port int
	// SGID chooses the source GID by value (for RoCE an IPv4 address
	// matches its IPv4-mapped GID); nil chooses a RoCE v2 GID holding an
	// IPv4 address, else the first valid GID.
	SGID net.IP
	// HandshakeTimeout bounds a connection's setup on both sides; 0
	// means 10 s.
	HandshakeTimeout time.Duration
	// Linger bounds how long Close waits for written data to reach the
	// peer (verbs); 0 means 5 s.
	Linger time.Duration
	// AckTimeout is the verbs queue pair's local ACK timeout, rounded up
	// to 4.096 µs × 2^n; 0 means 268 ms (n = 16), which also suits
	// Soft-RoCE in emulated guests.
	AckTimeout time.Duration
	// Auth authenticates every connection's bootstrap (see
	// Authenticator); nil leaves it plain TCP.
	Auth Authenticator
}

const (
	defaultHandshakeTimeout = 10 * time.Second
	defaultLinger           = 5 * time.Second
	defaultAckTimeout       = 268 * time.Millisecond
)

func (c Config) withDefaults() (Config, error) {
	if c.RingSize == 0 {
		c.RingSize = DefaultRingSize
	}
	if err := checkRingSize(uint64(c.RingSize)); err != nil {
		return c, err
	}
	if c.Port == 0 {
		c.Port = 1
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = defaultHandshakeTimeout
	}
	if c.Linger == 0 {
		c.Linger = defaultLinger
	}
	if c.AckTimeout == 0 {
		c.AckTimeout = defaultAckTimeout
	}
	return c, nil
}

// Select returns the first provider that is available, or an error that
// joins every provider's reason (and matches ErrNotSupported).
func Select(providers ...Provider) (Provider, error) {
	var errs []error
	for _, p := range providers {
		err := p.Available()
		if err == nil {
			return p, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", p.Name(), err))
	}
	if len(errs) == 0 {
		return nil, fmt.Errorf("select rdma provider: none given: %w", ErrNotSupported)
	}
	return nil, fmt.Errorf("select rdma provider: %w", errors.Join(errs...))
}

// Addr is a connection's or listener's address: the provider's name as
// the network, the TCP bootstrap socket's address as the string.
type Addr struct {
	Provider string
	TCP      net.Addr
}

func (a *Addr) Network() string { return "rdma/" + a.Provider }
func (a *Addr) String() string {
	if a.TCP == nil {
		return "<nil>"
	}
	return a.TCP.String()
}

var _ net.Addr = (*Addr)(nil)
