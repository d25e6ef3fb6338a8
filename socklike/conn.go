package socklike

import (
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/qos"
)

// Conn is one connection, whatever its mode. It implements net.Conn with
// the standard library's semantics, plus CloseWrite.
//
// A Write returns len(b) or an error; b is read until Write returns. A Read
// blocks until at least one byte is there, the peer finished (io.EOF), the
// deadline passed or the connection failed; what arrived before a failure
// is still read first in shared-pool mode.
type Conn struct {
	c             *transport.Conn // the connection's stream; nil in shared-pool and direct mode
	pc            *poolConn       // shared-pool mode's stream
	d             *directConn     // direct mode's stream (direct.go)
	local, remote Addr
	route         Route
}

var _ net.Conn = (*Conn)(nil)

// newConn wraps an engine connection, with the addresses it reports.
func newConn(c *transport.Conn, local, remote Addr, route Route) *Conn {
	return &Conn{c: c, local: local, remote: remote, route: route}
}

// embeddedConn wraps a connection of an Endpoint, reporting the engine's
// addresses.
func embeddedConn(e *Endpoint, c *transport.Conn) *Conn {
	l, _ := c.LocalAddr().(transport.Addr)
	r, _ := c.RemoteAddr().(transport.Addr)
	return newConn(c, Addr(l), Addr(r), e.embeddedRoute())
}

// opErr gives an engine error this Conn's addresses (the engine knows a
// proxied connection by its memory link's).
func (c *Conn) opErr(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) {
		oe.Source, oe.Addr = c.local, c.remote
	}
	return err
}

// dErr gives an error of direct mode's stream the standard library's
// form.
func (c *Conn) dErr(op string, err error) error {
	if err == nil || err == io.EOF {
		return err
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		oe.Op, oe.Source, oe.Addr = op, c.local, c.remote
		return err
	}
	return &net.OpError{Op: op, Net: "ntb", Source: c.local, Addr: c.remote, Err: err}
}

// Read reads what the peer wrote into b.
func (c *Conn) Read(b []byte) (int, error) {
	if c.d != nil {
		n, err := c.d.Read(b)
		return n, c.dErr("read", err)
	}
	if c.c == nil {
		return c.pc.Read(b)
	}
	n, err := c.c.Read(b)
	if err != nil {
		err = c.opErr(err)
	}
	return n, err
}

// Write writes b, blocking while the peer's window or the ring is full.
func (c *Conn) Write(b []byte) (int, error) {
	if c.d != nil {
		n, err := c.d.Write(b)
		return n, c.dErr("write", err)
	}
	if c.c == nil {
		return c.pc.Write(b)
	}
	n, err := c.c.Write(b)
	if err != nil {
		err = c.opErr(err)
	}
	return n, err
}

// Close closes the connection: blocked calls return net.ErrClosed and the
// peer reads io.EOF after everything written before.
func (c *Conn) Close() error {
	if c.d != nil {
		return c.dErr("close", c.d.Close())
	}
	if c.c == nil {
		return c.pc.Close()
	}
	if err := c.c.Close(); err != nil {
		return c.opErr(err)
	}
	return nil
}

// Abort closes the connection as a TCP reset does (SetLinger(0), then
// Close): the peer's calls fail with an error matching
// syscall.ECONNRESET once it has read what came before, rather than
// reading io.EOF. It says the stream ends short, as a relay does that
// lost its other side. In direct mode the reset follows the stream onto
// whichever carrier it is on: its direct link, or the proxied path it
// takes while that link is down or began on. In shared-pool mode ntproxy
// ends the leg with a reset once it has sent what was written.
func (c *Conn) Abort() error {
	if c.d != nil {
		return c.dErr("close", c.d.Abort())
	}
	if c.c == nil && c.pc != nil {
		return c.pc.Abort()
	}
	if c.c == nil {
		return c.Close()
	}
	if err := c.c.Abort(); err != nil {
		return c.opErr(err)
	}
	return nil
}

// CloseWrite shuts down the writing side: the peer reads io.EOF once it
// has read everything written before.
func (c *Conn) CloseWrite() error {
	if c.d != nil {
		return c.dErr("close", c.d.CloseWrite())
	}
	if c.c == nil {
		return c.pc.CloseWrite()
	}
	if err := c.c.CloseWrite(); err != nil {
		return c.opErr(err)
	}
	return nil
}

func (c *Conn) LocalAddr() net.Addr  { return c.local }
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// Route returns the connection's path and the reason it was chosen. A
// direct-mode connection whose link is down runs through the proxies, and
// its Route says so until it is back on its link.
func (c *Conn) Route() Route {
	if c.d != nil {
		if r, ok := c.d.route(); ok {
			return r
		}
	}
	return c.route
}

// SetDeadline sets both deadlines. Setting a deadline wakes a blocked call,
// which then waits for the new one.
func (c *Conn) SetDeadline(t time.Time) error {
	if c.d != nil {
		c.d.SetReadDeadline(t)
		return c.d.SetWriteDeadline(t)
	}
	if c.c == nil {
		return c.pc.SetDeadline(t)
	}
	return c.c.SetDeadline(t)
}

func (c *Conn) SetReadDeadline(t time.Time) error {
	if c.d != nil {
		return c.d.SetReadDeadline(t)
	}
	if c.c == nil {
		return c.pc.SetReadDeadline(t)
	}
	return c.c.SetReadDeadline(t)
}

func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.d != nil {
		return c.d.SetWriteDeadline(t)
	}
	if c.c == nil {
		return c.pc.SetWriteDeadline(t)
	}
	return c.c.SetWriteDeadline(t)
}

// SetPriority sets the class (0 highest, 7 lowest) of what this side
// sends from now on; with Config.QoS the connection moves to its class's
// partition, keeping its bytes in order. In shared-pool mode the class is
// fixed at the dial (Dialer.Priority), and SetPriority fails with an error
// wrapping errors.ErrUnsupported.
func (c *Conn) SetPriority(class qos.Class) error {
	if c.d != nil {
		return c.d.SetPriority(class)
	}
	if c.c == nil {
		return &net.OpError{Op: "set priority", Net: "ntb", Source: c.local, Addr: c.remote,
			Err: fmt.Errorf("shared-pool mode: %w", errors.ErrUnsupported)}
	}
	return c.c.SetPriority(class)
}
