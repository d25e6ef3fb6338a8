package rdma

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/prim/deadline"
)

// link is the seam between the ring protocol (ringConn) and the verbs
// library: one reliable-connected queue pair, its completion queue and the
// two registered rings, connected to a peer of the same shape. verbs_cgo.go
// implements it over libibverbs; the unit tier uses memLink over Go
// memory. Before it is handed to newRingConn, the link has posted its
// initial receive work requests and its peer is ready to receive.
type link interface {
	// txBuf is the local shadow of the peer's ring; rxBuf the ring the
	// peer writes. Both stay valid until close returns.
	txBuf() []byte
	rxBuf() []byte
	// write posts one signaled RDMA write with immediate of
	// txBuf()[off:off+n] to the same offsets of the peer's ring (n may be
	// 0); id comes back in its completion.
	write(id, off, n uint64, imm uint32) error
	// postRecv posts n receive work requests (each write with immediate
	// consumes one at the receiver).
	postRecv(n int) error
	// poll waits for completions and fills cs with at least one; after
	// close it returns net.ErrClosed.
	poll(cs []completion) (int, error)
	// close ends poll, destroys the queue pair and releases the rings.
	// Idempotent; safe while poll runs.
	close() error
}

// completion is one work completion.
type completion struct {
	recv bool   // a peer's write with immediate arrived; else one of ours completed
	id   uint64 // ours: the work request's id
	imm  uint32 // recv: the immediate
	err  error  // non-nil: the work request failed
}

const (
	// Work request ids: a data write's id is the tx position it ends at
	// (below 2^63); a credit write's is creditID.
	creditID = 1 << 63

	// pollBatch is how many completions one poll (one cgo call) returns
	// at most.
	pollBatch = 32
	// maxWrites bounds the data writes in flight; with the one credit
	// write the send queue needs maxWrites+1 entries (sqDepth).
	maxWrites = 31
	sqDepth   = maxWrites + 1
	// rqDepth receive work requests are kept posted; the poller reposts
	// as many as each batch consumed. A sender that outruns it meets
	// receiver-not-ready NAKs and retries (rnr_retry 7: forever).
	rqDepth = 256
)

// ringConn is the verbs provider's net.Conn: records in the peer's ring
// (ring.go), moved by a link, flow-controlled by credits.
//
// Concurrency: one Read and one Write at a time (readMu, writeMu; more
// wait their turn); deadlines, CloseWrite and Close from any goroutine.
// runPoller owns the link's completions, runSide the side channel's
// reads; both end in Close. Every blocked call waits on a wake channel, its
// deadline and done, so Close and deadlines wake it.
//
// Close waits (at most Linger) until everything written has been
// acknowledged by the peer's NIC, then sends ctlBye with the position the
// peer has all data up to, closes the side channel and destroys the link.
type ringConn struct {
	link         link
	side         net.Conn
	peer         string // the host the bootstrap authenticated ("" = none)
	laddr, raddr *Addr
	linger       time.Duration
	readMu       sync.Mutex
	writeMu      sync.Mutex
	rdl, wdl     *deadline.Deadline
	readWake     chan struct{} // signalled (non-blocking, cap 1) when the state changes
	writeWake    chan struct{}
	closeWake    chan struct{}
	done         chan struct{} // closed by Close
	pollerDone   chan struct{}
	sideDone     chan struct{}
	closeOnce    sync.Once

	mu sync.Mutex
	// mu protects the following fields.
	tx         *txRing
	rx         *rxRing
	writes     int  // data writes in flight
	creditBusy bool // a credit write is in flight
	finWanted  bool // CloseWrite was called
	finPlaced  bool // the recFin is in the ring
	closed     bool
	released   bool   // the link is being closed: its rings may be reused
	err        error  // the peer broke the protocol: every call returns it
	linkErr    error  // the link failed: writes return it, reads after the data that arrived
	peerBye    bool   // the peer closed; it sent everything up to peerFinal
	peerFinal  uint64 // (reset: not everything it had written)
	peerReset  bool
	peerGone   bool // the side channel ended without a ctlBye
}

var _ Conn = (*ringConn)(nil)

// newRingConn starts the connection's goroutines on a connected link.
func newRingConn(l link, side net.Conn, provider string, linger time.Duration) *ringConn {
	c := &ringConn{
		link:       l,
		side:       side,
		laddr:      &Addr{Provider: provider, TCP: side.LocalAddr()},
		raddr:      &Addr{Provider: provider, TCP: side.RemoteAddr()},
		linger:     linger,
		rdl:        deadline.New(),
		wdl:        deadline.New(),
		readWake:   make(chan struct{}, 1),
		writeWake:  make(chan struct{}, 1),
		closeWake:  make(chan struct{}, 1),
		done:       make(chan struct{}),
		pollerDone: make(chan struct{}),
		sideDone:   make(chan struct{}),
		tx:         newTxRing(l.txBuf()),
		rx:         newRxRing(l.rxBuf()),
	}
	go c.runPoller()
	go c.runSide()
	return c
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func (c *ringConn) wakeAll() {
	signal(c.readWake)
	signal(c.writeWake)
	signal(c.closeWake)
}

// wait blocks, with mu released, until woken, the deadline passes or
// the connection is closed.
func (c *ringConn) waitLocked(wake chan struct{}, dl *deadline.Deadline) {
	c.mu.Unlock()
	select {
	case <-wake:
	case <-dl.Wait():
	case <-c.done:
	}
	c.mu.Lock()
}

func (c *ringConn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: c.laddr.Network(), Source: c.laddr, Addr: c.raddr, Err: err}
}

// failLocked records a failure: a protocol violation ends the
// connection at once; a link failure (a failed work request, e.g. writes
// to a peer that has closed) leaves what already arrived readable.
func (c *ringConn) failLocked(err error) {
	switch {
	case errors.Is(err, errProtocol):
		if c.err == nil {
			c.err = err
		}
	case c.linkErr == nil:
		c.linkErr = err
	}
}

// broken reports whether the link can carry nothing more.
func (c *ringConn) brokenLocked() bool { return c.err != nil || c.linkErr != nil }

// runPoller drains the completion queue, a batch per poll, until the
// link is closed.
func (c *ringConn) runPoller() {
	defer close(c.pollerDone)
	cs := make([]completion, pollBatch)
	for {
		n, err := c.link.poll(cs)
		if err != nil {
			c.mu.Lock()
			if !c.closed {
				c.failLocked(fmt.Errorf("poll completions: %w", err))
			}
			c.mu.Unlock()
			c.wakeAll()
			return
		}
		c.mu.Lock()
		recvs := 0
		for _, comp := range cs[:n] {
			if comp.recv {
				recvs++
			}
			if err := c.completeLocked(comp); err != nil {
				c.failLocked(err)
			}
		}
		if recvs > 0 && !c.brokenLocked() && !c.released {
			if err := c.link.postRecv(recvs); err != nil {
				c.failLocked(fmt.Errorf("post receives: %w", err))
			}
		}
		c.pumpLocked()
		c.mu.Unlock()
		c.wakeAll()
	}
}

func (c *ringConn) completeLocked(comp completion) error {
	switch {
	case comp.err != nil:
		return fmt.Errorf("work request %#x: %w", comp.id, comp.err)
	case comp.recv && comp.imm&immCredit != 0:
		return c.tx.credit(comp.imm)
	case comp.recv:
		return c.rx.publish(comp.imm)
	case comp.id == creditID:
		c.creditBusy = false
	case c.writes > 0 && comp.id > c.tx.acked && comp.id <= c.tx.posted:
		c.writes--
		c.tx.acked = comp.id
	default:
		return fmt.Errorf("completion of unknown write %#x (acked %d, posted %d)", comp.id, c.tx.acked, c.tx.posted)
	}
	return nil
}

// pumpLocked does what the ring state allows: places a wanted recFin,
// posts placed records, sends a due credit.
func (c *ringConn) pumpLocked() {
	if c.brokenLocked() || c.released {
		return
	}
	if c.finWanted && !c.finPlaced {
		c.finPlaced = c.tx.placeFin()
	}
	for c.writes < maxWrites {
		off, n, end := c.tx.next()
		if n == 0 {
			break
		}
		if err := c.link.write(end, off, n, dataImm(end)); err != nil {
			c.failLocked(fmt.Errorf("post write: %w", err))
			return
		}
		c.tx.posted = end
		c.writes++
	}
	if !c.creditBusy && !c.closed && c.rx.creditDue() {
		cons := c.rx.cons
		if err := c.link.write(creditID, 0, 0, creditImm(cons)); err != nil {
			c.failLocked(fmt.Errorf("post credit: %w", err))
			return
		}
		c.rx.credited = cons
		c.creditBusy = true
	}
}

// runSide waits for the peer's ctlBye, or the side channel's end.
func (c *ringConn) runSide() {
	defer close(c.sideDone)
	b := make([]byte, ctlSize)
	_, err := io.ReadFull(c.side, b)
	var m ctlMsg
	if err == nil {
		m, err = parseCtl(b)
		if err == nil && m.typ != ctlBye {
			err = fmt.Errorf("control message %d after setup: %w", m.typ, errProtocol)
		}
	}
	c.mu.Lock()
	switch {
	case err == nil:
		c.peerBye, c.peerFinal, c.peerReset = true, m.final, m.reset
	case errors.Is(err, errProtocol):
		c.failLocked(err)
	case !c.closed:
		c.peerGone = true
	}
	c.mu.Unlock()
	c.wakeAll()
}

// Read copies payload of the records the peer wrote into p: as many
// records as are there, at least one byte unless at the end of the stream.
func (c *ringConn) Read(p []byte) (int, error) {
	c.readMu.Lock()
	defer c.readMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		switch {
		case c.closed:
			return 0, c.opErr("read", net.ErrClosed)
		case c.err != nil:
			return 0, c.opErr("read", c.err)
		case len(p) == 0:
			return 0, nil
		case c.rx.readable():
			n, err := c.rx.read(p)
			if err != nil {
				c.failLocked(err)
				return n, c.opErr("read", err)
			}
			if n > 0 {
				c.pumpLocked() // a credit may be due
				return n, nil
			}
			if c.rx.fin {
				return 0, io.EOF
			}
			continue // only a pad was consumed
		case c.peerBye && c.rx.cons >= c.peerFinal:
			if c.peerReset || c.rx.cons > c.peerFinal {
				return 0, c.opErr("read", syscall.ECONNRESET)
			}
			return 0, io.EOF
		case c.linkErr != nil:
			return 0, c.opErr("read", c.linkErr)
		case c.peerGone:
			return 0, c.opErr("read", syscall.ECONNRESET)
		case c.rdl.Passed():
			return 0, c.opErr("read", os.ErrDeadlineExceeded)
		}
		c.waitLocked(c.readWake, c.rdl)
	}
}

// Write places p in the peer's ring as records and posts them; it waits
// only for ring space. p is not retained.
func (c *ringConn) Write(p []byte) (int, error) {
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for {
		switch {
		case c.closed:
			return n, c.opErr("write", net.ErrClosed)
		case c.err != nil:
			return n, c.opErr("write", c.err)
		case c.finWanted || c.peerBye:
			return n, c.opErr("write", syscall.EPIPE)
		case c.linkErr != nil:
			return n, c.opErr("write", c.linkErr)
		case c.peerGone:
			return n, c.opErr("write", syscall.ECONNRESET)
		case n == len(p):
			return n, nil
		case c.wdl.Passed():
			return n, c.opErr("write", os.ErrDeadlineExceeded)
		}
		placed := 0
		for n < len(p) {
			k := c.tx.placeData(p[n:])
			if k == 0 {
				break
			}
			n += k
			placed += k
		}
		if placed > 0 {
			c.pumpLocked()
			continue
		}
		c.waitLocked(c.writeWake, c.wdl)
	}
}

// CloseWrite places a recFin after everything written (at once, or as
// soon as the ring has room); the peer reads io.EOF after the data.
func (c *ringConn) CloseWrite() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return c.opErr("close", net.ErrClosed)
	}
	c.finWanted = true
	c.pumpLocked()
	if err := errors.Join(c.err, c.linkErr); err != nil {
		return c.opErr("close", err)
	}
	return nil
}

// Close wakes blocked calls with net.ErrClosed, lingers until the peer
// has what was written, says goodbye on the side channel and destroys the
// link. A second Close returns net.ErrClosed.
func (c *ringConn) Close() error {
	err := c.opErr("close", net.ErrClosed)
	c.closeOnce.Do(func() { err = c.shutdown() })
	return err
}

func (c *ringConn) shutdown() error {
	c.mu.Lock()
	c.closed = true
	close(c.done)
	limit := time.NewTimer(c.linger)
	defer limit.Stop()
	expired := false
	for !expired && !c.brokenLocked() && !c.peerBye && !c.peerGone && c.tx.acked < c.tx.prod {
		c.pumpLocked()
		c.mu.Unlock()
		select {
		case <-c.closeWake:
		case <-limit.C:
			expired = true
		}
		c.mu.Lock()
	}
	bye := ctlMsg{typ: ctlBye, final: c.tx.acked, reset: c.tx.acked < c.tx.prod || c.brokenLocked()}
	sayBye := !c.peerGone
	c.released = true
	c.mu.Unlock()

	if sayBye {
		// The peer may have gone meanwhile; a failed goodbye is no error.
		c.side.SetWriteDeadline(time.Now().Add(time.Second))
		c.side.Write(bye.marshal())
	}
	errs := []error{c.side.Close(), c.link.close()}
	<-c.pollerDone
	<-c.sideDone
	c.wakeAll()
	if err := errors.Join(errs...); err != nil {
		return c.opErr("close", err)
	}
	return nil
}

func (c *ringConn) LocalAddr() net.Addr  { return c.laddr }
func (c *ringConn) Peer() string         { return c.peer }
func (c *ringConn) RemoteAddr() net.Addr { return c.raddr }

func (c *ringConn) SetDeadline(t time.Time) error {
	c.rdl.Set(t)
	c.wdl.Set(t)
	return nil
}

func (c *ringConn) SetReadDeadline(t time.Time) error  { c.rdl.Set(t); return nil }
func (c *ringConn) SetWriteDeadline(t time.Time) error { c.wdl.Set(t); return nil }
