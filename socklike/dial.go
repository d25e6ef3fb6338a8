package socklike

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/qos"
)

// Dialer dials connections; its fields choose the mode. Its DialContext
// fits http.Transport.DialContext and gRPC's and Redis clients' dialer
// hooks. The zero Dialer dials through the ntproxy $NTSTACK_PROXY names.
type Dialer struct {
	// Endpoint, if set, dials over this process's own end of a link
	// (embedded mode); the other fields but Priority and Timeout do not
	// apply.
	Endpoint *Endpoint
	// Proxy, if set and Endpoint is not, dials through that attachment to
	// the host's ntproxy (attached mode). With neither set the Dialer uses
	// the ntproxy named by $NTSTACK_PROXY.
	Proxy *Proxy
	// Direct asks ntproxy for a link of the connection's own between the
	// two programs, so that its bytes are copied by neither proxy. It costs
	// window memory (ntproxy's direct_quota) and needs an NTB link or both
	// ends on this host; when the quota is used up or the host is off the
	// fabric, the dial settles for proxy mode (the Route says so).
	Direct bool
	// Pool asks ntproxy for shared-pool mode: the connection's bytes go
	// through a slot of a buffer pool this process shares with ntproxy,
	// two copies fewer per direction than proxy mode. With no slot free,
	// or for a host on this one, the dial settles for proxy mode (the
	// Route says so). $NTSTACK_POOL=1 sets it for the default ntproxy's
	// dials. Direct takes precedence.
	Pool bool
	// Priority is the class of the connections it dials, 0 (highest,
	// default) to 7.
	Priority qos.Class
	// Timeout bounds a dial, including waiting for the link to come up
	// (default: none beyond the context's).
	Timeout time.Duration
	// Transports restricts and orders the paths a connection through
	// ntproxy may take: "ntb", "rdma", "tcp" (default: the host's order).
	// A dial none of them can serve fails with ErrNoPath and the reasons.
	Transports []string
}

// Dial is DialContext with a background context.
func (d *Dialer) Dial(network, address string) (net.Conn, error) {
	return d.DialContext(context.Background(), network, address)
}

// DialContext connects to address, "host:port", and returns a *Conn. An
// embedded Endpoint reaches the one peer at the other end of its link, so
// the host part is not interpreted there; through ntproxy the host is any
// rack host's name or virtual address. network is ignored ("tcp" from
// net/http is fine).
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	_, p, err := net.SplitHostPort(address)
	port, perr := strconv.Atoi(p)
	if err != nil || perr != nil || port < 1 || port > 65535 {
		return nil, &net.OpError{Op: "dial", Net: "ntb", Err: fmt.Errorf("address %q: want host:port with port 1..65535", address)}
	}
	if d.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeout)
		defer cancel()
	}
	if d.Endpoint == nil {
		p := d.Proxy
		if p == nil {
			if p, err = DefaultProxy(); err != nil {
				return nil, &net.OpError{Op: "dial", Net: "ntb", Addr: strAddr(address), Err: err}
			}
		}
		c, err := p.dialAny(ctx, address, dialOpts{class: d.Priority, direct: d.Direct, settle: d.Direct, pool: d.Pool || p.pool, transports: d.Transports})
		if err != nil {
			return nil, err
		}
		return c, nil
	}
	c, err := d.Endpoint.ep.DialClass(ctx, port, d.Priority)
	if err != nil {
		return nil, err
	}
	return embeddedConn(d.Endpoint, c), nil
}

// ListenConfig listens for connections; its fields choose the mode, as a
// Dialer's do. The zero ListenConfig listens through the ntproxy
// $NTSTACK_PROXY names.
type ListenConfig struct {
	// Endpoint, if set, listens on this process's own end of a link
	// (embedded mode), for the peer at its other end.
	Endpoint *Endpoint
	// Proxy, if set and Endpoint is not, listens through that attachment
	// to the host's ntproxy, for connections from this host and every rack
	// peer. With neither set, the ntproxy named by $NTSTACK_PROXY.
	Proxy *Proxy
	// Pool asks ntproxy to hand over connections from rack peers in
	// shared-pool mode where it has a slot free (see Dialer.Pool);
	// $NTSTACK_POOL=1 sets it for the default ntproxy's listeners.
	Pool bool
}

// Listen listens on address's port ("host:port" or ":port"). Through
// ntproxy port 0 picks a free one (Listener.Addr tells which); an embedded
// Endpoint's ports are 1..65535. network is ignored.
func (lc *ListenConfig) Listen(ctx context.Context, network, address string) (net.Listener, error) {
	if lc.Endpoint != nil {
		_, ps, err := net.SplitHostPort(address)
		port, perr := strconv.Atoi(ps)
		if err != nil || perr != nil {
			return nil, &net.OpError{Op: "listen", Net: "ntb", Addr: strAddr(address), Err: fmt.Errorf("address %q: want host:port", address)}
		}
		ln, err := lc.Endpoint.ep.Listen(port)
		if err != nil {
			return nil, err
		}
		return &Listener{ln: ln, ep: lc.Endpoint}, nil
	}
	p := lc.Proxy
	if p == nil {
		var err error
		if p, err = DefaultProxy(); err != nil {
			return nil, &net.OpError{Op: "listen", Net: "ntb", Addr: strAddr(address), Err: err}
		}
	}
	pl, err := p.listen(address, lc.Pool || p.pool)
	if err != nil {
		return nil, err
	}
	return &Listener{pl: pl}, nil
}

// Listen listens, through the ntproxy named by $NTSTACK_PROXY, on
// address's port ("host:port" or ":port"; port 0 picks a free one) of this
// host, for connections from this host and every rack peer. It is
// ListenConfig{}.Listen with a background context.
func Listen(network, address string) (net.Listener, error) {
	var lc ListenConfig
	return lc.Listen(context.Background(), network, address)
}

// Listener accepts connections; Accept returns *Conns.
type Listener struct {
	ln *transport.Listener // embedded mode
	ep *Endpoint
	pl *proxyListener // attached mode
}

var _ net.Listener = (*Listener)(nil)

// Accept waits for the next connection, a *Conn.
func (l *Listener) Accept() (net.Conn, error) {
	if l.ln == nil {
		return l.pl.accept()
	}
	c, err := l.ln.AcceptConn()
	if err != nil {
		return nil, err
	}
	return embeddedConn(l.ep, c), nil
}

// Close stops listening. An embedded listener closes the connections not
// yet accepted; through ntproxy accepted connections carry on.
func (l *Listener) Close() error {
	if l.ln == nil {
		return l.pl.close()
	}
	return l.ln.Close()
}

// Addr is the listened address; through ntproxy its port is the one
// ntproxy allocated for a listen on port 0.
func (l *Listener) Addr() net.Addr {
	if l.ln == nil {
		return l.pl.addrNow()
	}
	a, _ := l.ln.Addr().(transport.Addr)
	return Addr(a)
}
