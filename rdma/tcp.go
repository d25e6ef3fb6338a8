package rdma

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"
)

// TCP is the last-resort provider: records (record.go) back to back on a
// TCP connection, with the same stream semantics as the verbs provider.
// It is always available.
type TCP struct {
	cfg    Config
	cfgErr error
}

var _ Provider = (*TCP)(nil)

// NewTCP returns the TCP provider. Of cfg it uses HandshakeTimeout.
func NewTCP(cfg Config) *TCP {
	cfg, err := cfg.withDefaults()
	return &TCP{cfg: cfg, cfgErr: err}
}

func (p *TCP) Name() string { return "tcp" }

// Available returns nil unless the configuration is invalid.
func (p *TCP) Available() error { return p.cfgErr }

func (p *TCP) Dial(ctx context.Context, addr string) (net.Conn, error) {
	return p.DialHost(ctx, addr, "")
}

func (p *TCP) DialHost(ctx context.Context, addr, host string) (net.Conn, error) {
	if p.cfgErr != nil {
		return nil, p.cfgErr
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.HandshakeTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	bc, err := p.cfg.secureDial(ctx, c, host)
	var conn *tcpConn
	if err == nil {
		conn, err = tcpHandshake(ctx, bc, host)
	}
	if err != nil {
		c.Close()
		return nil, &net.OpError{Op: "dial", Net: "rdma/tcp", Addr: c.RemoteAddr(), Err: err}
	}
	return conn, nil
}

func (p *TCP) Listen(addr string) (net.Listener, error) {
	if p.cfgErr != nil {
		return nil, p.cfgErr
	}
	return newListener("tcp", addr, p.cfg.HandshakeTimeout, func(ctx context.Context, c net.Conn) (net.Conn, error) {
		bc, peer, err := p.cfg.secureAccept(ctx, c)
		if err != nil {
			return nil, err
		}
		return tcpHandshake(ctx, bc, peer)
	})
}

// tcpHandshake runs the hello on c, whose far end is peer ("": not
// authenticated).
func tcpHandshake(ctx context.Context, c bootConn, peer string) (*tcpConn, error) {
	if _, err := exchangeHello(ctx, c, hello{provider: provTCP}); err != nil {
		return nil, err
	}
	tc := newTCPConn(c)
	tc.peer = peer
	return tc, nil
}

// tcpConn frames a TCP connection into records. A Write cut short by a
// deadline may end inside a record; the record's remaining payload bytes
// (owed) are the first bytes of the next Write, so the stream stays well
// framed whatever the caller does next.
//
// Concurrency: one Read and one Write may run at once (readMu, writeMu);
// deadlines and Close come from any goroutine and act through the TCP
// connection's own.
type tcpConn struct {
	tcp          bootConn // TCP, or TLS over it (Config.Auth)
	peer         string   // the authenticated peer host ("" = none)
	laddr, raddr *Addr
	readMu       sync.Mutex
	writeMu      sync.Mutex

	// readMu protects the following field.
	sr streamReader

	// writeMu protects the following fields.
	owed    int  // payload bytes the last record's header promised and no Write has sent yet
	wclosed bool // CloseWrite was called
}

var _ Conn = (*tcpConn)(nil)

const tcpReadBuffer = 64 << 10

func newTCPConn(c bootConn) *tcpConn {
	return &tcpConn{
		tcp:   c,
		laddr: &Addr{Provider: "tcp", TCP: c.LocalAddr()},
		raddr: &Addr{Provider: "tcp", TCP: c.RemoteAddr()},
		sr:    streamReader{br: bufio.NewReaderSize(c, tcpReadBuffer)},
	}
}

func (c *tcpConn) opErr(op string, err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) || err == io.EOF {
		return err // the TCP connection's own, already an OpError
	}
	return &net.OpError{Op: op, Net: c.laddr.Network(), Source: c.laddr, Addr: c.raddr, Err: err}
}

// Read returns payload bytes of the records the peer sent. The returned
// bytes are the caller's; nothing is retained.
func (c *tcpConn) Read(p []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	n, err := c.sr.read(p)
	if err != nil && err != io.EOF {
		err = c.opErr("read", err)
	}
	return n, err
}

// streamReader decodes records from a byte stream, keeping its place
// across errors (a deadline may strike inside a header or a payload).
type streamReader struct {
	br     *bufio.Reader
	hdr    [recHdrSize]byte
	hdrN   int   // header bytes read so far
	remain int   // payload bytes of the current record still to read
	err    error // sticky: the end of the stream or a framing error
}

func (r *streamReader) read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for r.remain == 0 {
		if r.err != nil {
			return 0, r.err
		}
		n, err := io.ReadFull(r.br, r.hdr[r.hdrN:])
		r.hdrN += n
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			// The peer's write side ended, possibly inside a header it
			// never reported as written.
			r.err = io.EOF
			return 0, io.EOF
		}
		if err != nil {
			return 0, err
		}
		r.hdrN = 0
		h, err := parseHeader(r.hdr[:])
		if err == nil && h.typ == recPad {
			err = fmt.Errorf("pad record on a stream: %w", errProtocol)
		}
		if err != nil {
			r.err = err
			return 0, err
		}
		if h.typ == recFin {
			r.err = io.EOF
			return 0, io.EOF
		}
		r.remain = h.n
	}
	n, err := r.br.Read(p[:min(len(p), r.remain)])
	r.remain -= n
	if err == io.EOF {
		// Inside a record: the peer's write was cut short, then it
		// closed; what it sent is all it reported as written.
		r.err = io.EOF
		if n > 0 {
			err = nil
		}
	}
	return n, err
}

// Write sends p as records of at most MaxRecordPayload bytes, in one
// writev per record.
func (c *tcpConn) Write(p []byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if c.wclosed {
		return 0, c.opErr("write", syscall.EPIPE)
	}
	var hdr [recHdrSize]byte
	n := 0
	for n < len(p) {
		var bufs net.Buffers
		var k int
		if c.owed > 0 {
			k = min(c.owed, len(p)-n)
			bufs = net.Buffers{p[n : n+k]}
		} else {
			k = min(MaxRecordPayload, len(p)-n)
			putHeader(hdr[:], recData, k)
			bufs = net.Buffers{hdr[:], p[n : n+k]}
		}
		hdrLen := len(hdr)
		if c.owed > 0 {
			hdrLen = 0
		}
		w, err := bufs.WriteTo(c.tcp)
		sent := int(w) - hdrLen
		switch {
		case sent >= 0:
			if c.owed > 0 {
				c.owed -= sent
			} else {
				c.owed = k - sent
			}
			n += sent
		case w > 0:
			// Only part of a header went out: the stream cannot be
			// framed again. Fail the write side for good.
			c.wclosed = true
			return n, c.opErr("write", fmt.Errorf("record header cut short (%w)", err))
		}
		if err != nil {
			return n, c.opErr("write", err)
		}
	}
	return n, nil
}

// CloseWrite sends a recFin (at a record boundary) and shuts down the
// TCP connection's write side. It waits for a Write in progress.
func (c *tcpConn) CloseWrite() error {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	if c.wclosed {
		return nil
	}
	c.wclosed = true
	if c.owed == 0 {
		var hdr [recHdrSize]byte
		putHeader(hdr[:], recFin, 0)
		if _, err := c.tcp.Write(hdr[:]); err != nil {
			return c.opErr("close", err)
		}
	}
	return c.tcp.CloseWrite()
}

func (c *tcpConn) Close() error                       { return c.tcp.Close() }
func (c *tcpConn) Peer() string                       { return c.peer }
func (c *tcpConn) LocalAddr() net.Addr                { return c.laddr }
func (c *tcpConn) RemoteAddr() net.Addr               { return c.raddr }
func (c *tcpConn) SetDeadline(t time.Time) error      { return c.tcp.SetDeadline(t) }
func (c *tcpConn) SetReadDeadline(t time.Time) error  { return c.tcp.SetReadDeadline(t) }
func (c *tcpConn) SetWriteDeadline(t time.Time) error { return c.tcp.SetWriteDeadline(t) }
