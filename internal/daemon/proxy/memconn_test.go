package proxy

import (
	"bytes"
	"io"
	"net"
	"sync"
	"time"
)

// memConn is a net.Conn over bytes the far end has already sent: Read
// returns them in reads of at most chunk bytes (0: as many as fit), then
// io.EOF; what is written is kept. It runs no goroutine and arms no timer,
// so a fuzz execution over it stays cheap; deadlines are accepted and
// never fire (reads never block).
type memConn struct {
	mu sync.Mutex
	// mu protects the following fields.
	in     []byte
	chunk  int
	out    bytes.Buffer
	closed bool
}

var _ net.Conn = (*memConn)(nil)

func newMemConn(in []byte, chunk int) *memConn { return &memConn{in: in, chunk: chunk} }

func (c *memConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return 0, net.ErrClosed
	case len(p) == 0:
		return 0, nil
	case len(c.in) == 0:
		return 0, io.EOF
	}
	if c.chunk > 0 && len(p) > c.chunk {
		p = p[:c.chunk]
	}
	n := copy(p, c.in)
	c.in = c.in[n:]
	return n, nil
}

func (c *memConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	return c.out.Write(p)
}

// written is a copy of what was written.
func (c *memConn) written() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.out.Bytes())
}

func (c *memConn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

func (c *memConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	return nil
}

func (c *memConn) LocalAddr() net.Addr              { return memAddr{} }
func (c *memConn) RemoteAddr() net.Addr             { return memAddr{} }
func (c *memConn) SetDeadline(time.Time) error      { return nil }
func (c *memConn) SetReadDeadline(time.Time) error  { return nil }
func (c *memConn) SetWriteDeadline(time.Time) error { return nil }

type memAddr struct{}

func (memAddr) Network() string { return "mem" }
func (memAddr) String() string  { return "mem" }
