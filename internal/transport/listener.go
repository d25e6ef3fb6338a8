package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/qos"
)

// Addr is an ntstack address: a host (in embedded mode, the link end) and
// a port.
type Addr struct {
	Host string
	Port int
}

var _ net.Addr = Addr{}

func (a Addr) Network() string { return "ntb" }
func (a Addr) String() string  { return net.JoinHostPort(a.Host, strconv.Itoa(a.Port)) }

func (ep *Endpoint) localHost() string { return ep.dev.Name() }
func (ep *Endpoint) peerHost() string  { return "peer-of-" + ep.dev.Name() }

// Listener accepts connections to one port of an Endpoint.
type Listener struct {
	ep      *Endpoint
	port    uint16
	addr    Addr
	acceptq chan *Conn

	prio atomic.Uint32 // class of accepted connections

	mu sync.Mutex
	// mu protects the following fields.
	closed bool
	done   chan struct{}
}

// Priority is the class accepted connections start with.
func (ln *Listener) Priority() qos.Class { return qos.Class(ln.prio.Load()) }

// SetPriority sets the class accepted connections start with (default 0).
func (ln *Listener) SetPriority(class qos.Class) error {
	if !class.Valid() {
		return fmt.Errorf("listener priority: class %d outside 0..%d", class, qos.Lowest)
	}
	ln.prio.Store(uint32(class))
	return nil
}

var _ net.Listener = (*Listener)(nil)

// Listen listens on port (1..65535) of the endpoint.
func (ep *Endpoint) Listen(port int) (*Listener, error) {
	addr := Addr{Host: ep.localHost(), Port: port}
	if port < 1 || port > 65535 {
		return nil, &net.OpError{Op: "listen", Net: "ntb", Addr: addr, Err: fmt.Errorf("port %d outside 1..65535", port)}
	}
	ln := &Listener{ep: ep, port: uint16(port), addr: addr, acceptq: make(chan *Conn, ep.cfg.Backlog), done: make(chan struct{})}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.closed {
		return nil, &net.OpError{Op: "listen", Net: "ntb", Addr: addr, Err: net.ErrClosed}
	}
	if ep.listeners[ln.port] != nil {
		return nil, &net.OpError{Op: "listen", Net: "ntb", Addr: addr, Err: syscall.EADDRINUSE}
	}
	ep.listeners[ln.port] = ln
	return ln, nil
}

// Accept waits for the next connection.
func (ln *Listener) Accept() (net.Conn, error) {
	c, err := ln.AcceptConn()
	if err != nil {
		return nil, err
	}
	return c, nil
}

// AcceptConn is Accept returning the concrete type.
func (ln *Listener) AcceptConn() (*Conn, error) {
	select { // fast path: already queued
	case c := <-ln.acceptq:
		return c, nil
	default:
	}
	ln.ep.accepting.Add(1) // the poller must watch the ring for OPEN frames
	ln.ep.kickPoller()
	defer ln.ep.accepting.Add(-1)
	select {
	case c := <-ln.acceptq:
		return c, nil
	case <-ln.done:
		return nil, &net.OpError{Op: "accept", Net: "ntb", Addr: ln.addr, Err: net.ErrClosed}
	}
}

// offer queues an established connection; false if the backlog is full or
// the listener closed.
func (ln *Listener) offer(c *Conn) bool {
	ln.mu.Lock()
	defer ln.mu.Unlock()
	if ln.closed {
		return false
	}
	select {
	case ln.acceptq <- c:
		return true
	default:
		return false
	}
}

// Close stops listening and closes connections not yet accepted.
func (ln *Listener) Close() error {
	ln.mu.Lock()
	if ln.closed {
		ln.mu.Unlock()
		return &net.OpError{Op: "close", Net: "ntb", Addr: ln.addr, Err: net.ErrClosed}
	}
	ln.closed = true
	close(ln.done)
	ln.mu.Unlock()
	ln.ep.mu.Lock()
	if ln.ep.listeners[ln.port] == ln {
		delete(ln.ep.listeners, ln.port)
	}
	ln.ep.mu.Unlock()
	for {
		select {
		case c := <-ln.acceptq:
			c.Close()
		default:
			return nil
		}
	}
}

func (ln *Listener) Addr() net.Addr { return ln.addr }

// Dial connects to port on the peer, waiting up to a minute for the link.
func (ep *Endpoint) Dial(port int) (*Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return ep.DialContext(ctx, port)
}

// DialContext connects to port on the peer. It waits for the link to come
// up and the peer to accept, until ctx ends.
func (ep *Endpoint) DialContext(ctx context.Context, port int) (*Conn, error) {
	return ep.DialClass(ctx, port, qos.Default)
}

// DialClass is DialContext for a connection of priority class.
func (ep *Endpoint) DialClass(ctx context.Context, port int, class qos.Class) (*Conn, error) {
	remote := Addr{Host: ep.peerHost(), Port: port}
	opErr := func(err error) error {
		return &net.OpError{Op: "dial", Net: "ntb", Addr: remote, Err: err}
	}
	if port < 1 || port > 65535 {
		return nil, opErr(fmt.Errorf("port %d outside 1..65535", port))
	}
	if !class.Valid() {
		return nil, opErr(fmt.Errorf("class %d outside 0..%d", class, qos.Lowest))
	}
	for {
		c, err := ep.dial(ctx, port, class, remote)
		if errors.Is(err, errSessionLost) && ctx.Err() == nil {
			continue // the session ended before the peer answered: dial again on the next
		}
		if err != nil {
			return nil, opErr(err)
		}
		return c, nil
	}
}

// dial is one attempt of DialClass, on the current session.
func (ep *Endpoint) dial(ctx context.Context, port int, class qos.Class, remote Addr) (*Conn, error) {
	opErr := func(err error) error { return err }
	st, err := ep.session(ctx)
	if err != nil {
		return nil, opErr(dialErr(err))
	}
	c := newConn(ep, Addr{Host: ep.localHost()}, remote)
	c.state = connDialing
	c.nonce = newNonce()
	c.prio.Store(uint32(class))
	if err := ep.quota.Acquire(st.window); err != nil {
		return nil, opErr(err)
	}
	if err := st.newConn(c); err != nil {
		ep.quota.Release(st.window)
		return nil, opErr(err)
	}
	c.quotaHeld = st.window
	if err := c.placeLocked(); err != nil {
		c.releaseLocal()
		return nil, opErr(err)
	}
	c.local.Port = int(c.id)
	c.queueFrame(kindOpen, openMsg{port: uint16(port), window: uint32(st.window), gen: c.gen, nonce: c.nonce}.encode(nil))
	sp := spinner{ep: ep}
	defer sp.stop()
	for {
		c.mu.Lock()
		state, cerr := c.state, c.err
		c.mu.Unlock()
		switch {
		case state == connEstablished:
			return c, nil
		case cerr != nil:
			return nil, opErr(cerr)
		case ctx.Err() != nil:
			c.Close() // an ACCEPT still in flight is answered with CLOSE
			return nil, opErr(dialErr(ctx.Err()))
		}
		st.poll(nil, nil)
		if !sp.spin() {
			c.park(&sp, c.wnotify, c.wdl, ctx.Done())
		}
	}
}
