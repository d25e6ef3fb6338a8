package rdma

import (
	"context"
	"fmt"
	"net"
	"sync"
)

// Verbs is the RDMA provider: a reliable-connected queue pair per
// connection, records written with RDMA write-with-immediate into the
// peer's ring (ring.go), over libibverbs through cgo. It is compiled only
// with the verbs build tag (and cgo, on Linux); otherwise Available says
// so and Dial and Listen fail with an error matching ErrNotSupported.
//
// The device (verbs context and protection domain) is opened by the first
// Dial or Listen and shared by the provider's connections; it is closed
// when the provider and every connection are closed. Registered rings are
// pooled on the device: a connection takes a pair at setup and returns it
// at Close, so no ring is registered per message, nor per connection in a
// steady state.
type Verbs struct {
	cfg    Config
	cfgErr error

	mu sync.Mutex
	// mu protects the following fields.
	dev    *device
	closed bool
}

var _ Provider = (*Verbs)(nil)

// NewVerbs returns the verbs provider. Nothing is opened until the first
// Dial or Listen.
func NewVerbs(cfg Config) *Verbs {
	cfg, err := cfg.withDefaults()
	return &Verbs{cfg: cfg, cfgErr: err}
}

func (v *Verbs) Name() string { return "verbs" }

// Available returns nil if the provider was built in, the configured
// device exists and its port is active; otherwise an error matching
// ErrNotSupported that says which.
func (v *Verbs) Available() error {
	if v.cfgErr != nil {
		return v.cfgErr
	}
	return verbsAvailable(v.cfg)
}

// device returns the shared device with a reference for the caller.
func (v *Verbs) device() (*device, error) {
	if v.cfgErr != nil {
		return nil, v.cfgErr
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return nil, net.ErrClosed
	}
	if v.dev == nil {
		d, err := openDevice(v.cfg)
		if err != nil {
			return nil, err
		}
		v.dev = d // the provider's reference
	}
	v.dev.ref()
	return v.dev, nil
}

// Dial connects to a verbs Listen at addr: TCP to addr, the handshake
// (hello.go), then the connection's queue pair.
func (v *Verbs) Dial(ctx context.Context, addr string) (net.Conn, error) {
	return v.DialHost(ctx, addr, "")
}

// DialHost is Dial to host's listener; with Config.Auth the bootstrap
// must prove to be host before any queue pair is set up.
func (v *Verbs) DialHost(ctx context.Context, addr, host string) (net.Conn, error) {
	dev, err := v.device()
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: "rdma/verbs", Err: err}
	}
	ctx, cancel := context.WithTimeout(ctx, v.cfg.HandshakeTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		dev.unref()
		return nil, err
	}
	bc, err := v.cfg.secureDial(ctx, c, host)
	var conn net.Conn
	if err == nil {
		conn, err = v.handshake(ctx, dev, bc, host)
	} else {
		dev.unref()
	}
	if err != nil {
		c.Close()
		return nil, &net.OpError{Op: "dial", Net: "rdma/verbs", Addr: c.RemoteAddr(), Err: err}
	}
	return conn, nil
}

func (v *Verbs) Listen(addr string) (net.Listener, error) {
	// Open the device now, so a listener on a host without one fails here.
	dev, err := v.device()
	if err != nil {
		return nil, &net.OpError{Op: "listen", Net: "rdma/verbs", Err: err}
	}
	defer dev.unref() // each handshake takes its own reference
	l, err := newListener("verbs", addr, v.cfg.HandshakeTimeout, func(ctx context.Context, c net.Conn) (net.Conn, error) {
		// The peer proves its host before this side sets up anything.
		bc, peer, err := v.cfg.secureAccept(ctx, c)
		if err != nil {
			return nil, err
		}
		dev, err := v.device()
		if err != nil {
			return nil, err
		}
		return v.handshake(ctx, dev, bc, peer)
	})
	return l, err
}

// handshake sets up a connection's queue pair over the bootstrap socket
// c, whose far end is peer ("": not authenticated). It consumes the
// caller's reference to dev: the link holds it until it closes, and a
// failed setup drops it.
func (v *Verbs) handshake(ctx context.Context, dev *device, c bootConn, peer string) (net.Conn, error) {
	l, err := dev.connect(ctx, c, v.cfg)
	if err != nil {
		return nil, fmt.Errorf("verbs handshake: %w", err)
	}
	rc := newRingConn(l, c, "verbs", v.cfg.Linger)
	rc.peer = peer
	return rc, nil
}

// Close drops the provider's reference to the device; the device closes
// once the last connection has. Listeners are closed by their owners.
func (v *Verbs) Close() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.closed {
		return nil
	}
	v.closed = true
	if v.dev == nil {
		return nil
	}
	return v.dev.unref()
}
