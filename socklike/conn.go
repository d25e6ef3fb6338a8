package socklike

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/ring"
)

// Conn is one connection over the link. It implements net.Conn with the
// standard library's semantics, plus CloseWrite.
type Conn struct {
	ep            *Endpoint
	st            *state
	id            uint32 // ours; frames to us carry it
	peerID        uint32 // theirs; frames we send carry it
	local, remote Addr

	rlock, wlock     sync.Mutex    // serialise Read calls and Write calls
	rnotify, wnotify chan struct{} // cap 1: something changed for readers / writers
	closedCh         chan struct{} // closed by Close
	rdl, wdl         *deadline

	// Receive side. recvd counts bytes taken off the ring for us; read
	// counts bytes the application has read; recvd-read ≤ our window.
	qmu       sync.Mutex
	q         byteQueue // guarded by qmu
	queued    atomic.Int64
	recvd     atomic.Int64
	read      atomic.Int64
	creditOut int64 // read total last sent as CREDIT; guarded by rlock

	// Send side. sent-peerRead ≤ window, the peer's receive window.
	window   int64
	sent     atomic.Int64
	peerRead atomic.Int64

	flags atomic.Uint32 // fast-path summary of the state below

	mu sync.Mutex
	// mu protects the following fields.
	state              connState
	finSent, closeSent bool
	closeRecv, idFreed bool
	err                error // terminal: refused, session ended
	localClosed        bool
}

type connState uint8

const (
	connDialing connState = iota
	connEstablished
	connRefused
)

// flags
const (
	fEOF       = 1 << iota // peer sent FIN or CLOSE: reads end when the queue is empty
	fPeerGone              // peer sent CLOSE: writes fail
	fFailed                // c.err is set
	fClosed                // Close was called
	fWriteShut             // CloseWrite was called
)

var _ net.Conn = (*Conn)(nil)

func newConn(ep *Endpoint, local, remote Addr) *Conn {
	return &Conn{
		ep:       ep,
		local:    local,
		remote:   remote,
		rnotify:  make(chan struct{}, 1),
		wnotify:  make(chan struct{}, 1),
		closedCh: make(chan struct{}),
		rdl:      newDeadline(),
		wdl:      newDeadline(),
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// ID is the connection's id on this side of the link, for logs.
func (c *Conn) ID() uint32 { return c.id }

func (c *Conn) LocalAddr() net.Addr  { return c.local }
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

func (c *Conn) SetDeadline(t time.Time) error {
	c.rdl.set(t)
	c.wdl.set(t)
	return nil
}

func (c *Conn) SetReadDeadline(t time.Time) error  { c.rdl.set(t); return nil }
func (c *Conn) SetWriteDeadline(t time.Time) error { c.wdl.set(t); return nil }

func (c *Conn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "ntb", Source: c.local, Addr: c.remote, Err: err}
}

// Read reads what the peer wrote, blocking until at least one byte is
// there, the peer finished (io.EOF), the deadline passed or the
// connection failed.
func (c *Conn) Read(b []byte) (int, error) {
	c.ep.calls.Add(1)
	c.rlock.Lock()
	defer c.rlock.Unlock()
	sp := spinner{ep: c.ep}
	defer sp.stop()
	for {
		if f := c.flags.Load(); f&fClosed != 0 {
			return 0, c.opErr("read", net.ErrClosed)
		}
		if c.rdl.passed() {
			return 0, c.opErr("read", os.ErrDeadlineExceeded)
		}
		if len(b) == 0 {
			return 0, nil
		}
		if c.queued.Load() > 0 {
			c.qmu.Lock()
			n := c.q.pop(b)
			c.qmu.Unlock()
			c.queued.Add(int64(-n))
			c.consumed(n)
			return n, nil
		}
		if f := c.flags.Load(); f&(fEOF|fFailed) != 0 {
			if c.queued.Load() > 0 {
				continue // arrived just before the end
			}
			if f&fEOF != 0 {
				return 0, io.EOF
			}
			return 0, c.opErr("read", c.failure())
		}
		if n, _ := c.st.poll(c, b); n > 0 {
			return n, nil
		}
		if !sp.spin() {
			c.park(&sp, c.rnotify, c.rdl, nil)
		}
	}
}

// creditEvery is the fraction of the window read before credit goes back.
// A sixteenth keeps a streaming writer fed well within its spin budget
// (64 KiB with the default window), at one 16-byte frame per 64 KiB read.
const creditEvery = 16

// consumed accounts n bytes read by the application and hands credit back
// once a sixteenth of the window has been read (rlock held).
func (c *Conn) consumed(n int) {
	total := c.read.Add(int64(n))
	if total-c.creditOut >= int64(c.ep.cfg.Window/creditEvery) {
		c.creditOut = total
		var b [8]byte
		for i := range b {
			b[i] = byte(total >> (8 * i))
		}
		c.send(kindCredit, b[:])
	}
}

// Write writes b in frames of at most the MTU, blocking while the peer's
// window or the ring is full. It returns len(b) or an error.
func (c *Conn) Write(b []byte) (int, error) {
	c.ep.calls.Add(1)
	c.wlock.Lock()
	defer c.wlock.Unlock()
	if err := c.writeErr(); err != nil {
		return 0, err
	}
	sp := spinner{ep: c.ep}
	defer sp.stop()
	n := 0
	for n < len(b) {
		credit := c.window - (c.sent.Load() - c.peerRead.Load())
		chunk := min(int64(len(b)-n), int64(c.ep.cfg.MTU), credit, int64(c.st.part.MaxPayload()))
		if chunk > 0 {
			// Count the bytes before they are visible: the peer may
			// credit them before TrySend returns.
			c.sent.Add(chunk)
			c.mu.Lock() // orders DATA before a racing Close's CLOSE
			err := net.ErrClosed
			if !c.closeSent {
				err = c.st.sendData(c.peerID, b[n:n+int(chunk)])
			}
			c.mu.Unlock()
			if err == nil {
				n += int(chunk)
				continue
			}
			c.sent.Add(-chunk)
			if errors.Is(err, net.ErrClosed) {
				return n, c.writeErr()
			}
			if !errors.Is(err, ring.ErrFull) {
				return n, c.opErr("write", fmt.Errorf("%w: %w", ErrLinkDown, err))
			}
		}
		// Wait for credit or ring space, polling for the frames that bring them.
		if err := c.writeErr(); err != nil {
			return n, err
		}
		c.st.poll(nil, nil)
		if sp.spin() {
			continue
		}
		var space <-chan struct{}
		if chunk > 0 { // waiting for ring space, not credit
			space = c.ep.spaceWait()
			if c.st.part.ArmSpace(int(chunk)) {
				continue
			}
		}
		c.park(&sp, c.wnotify, c.wdl, space)
	}
	return n, nil
}

func (c *Conn) writeErr() error {
	f := c.flags.Load()
	switch {
	case f&fClosed != 0:
		return c.opErr("write", net.ErrClosed)
	case c.wdl.passed():
		return c.opErr("write", os.ErrDeadlineExceeded)
	case f&fWriteShut != 0:
		return c.opErr("write", syscall.EPIPE)
	case f&fFailed != 0:
		return c.opErr("write", c.failure())
	case f&fPeerGone != 0:
		return c.opErr("write", syscall.EPIPE)
	}
	return nil
}

func (c *Conn) failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// park gives up the CPU until notify, the deadline, Close, the end of the
// session or extra; the poller watches the ring meanwhile.
func (c *Conn) park(sp *spinner, notify chan struct{}, dl *deadline, extra <-chan struct{}) {
	sp.stop()
	c.ep.parked.Add(1)
	c.ep.kickPoller()
	select {
	case <-notify:
	case <-dl.wait():
	case <-c.closedCh:
	case <-c.st.sess.Done():
	case <-extra:
	}
	c.ep.parked.Add(-1)
}

// Close closes the connection: blocked calls return net.ErrClosed, the
// peer's reads end with io.EOF and its writes fail.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.localClosed {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	c.localClosed = true
	c.flags.Or(fClosed)
	close(c.closedCh)
	if c.err == nil {
		c.sendLocked(kindClose, nil)
	}
	free := c.freeLocked()
	c.mu.Unlock()
	if free {
		c.st.releaseID(c.id)
	}
	c.qmu.Lock()
	c.q = byteQueue{}
	c.qmu.Unlock()
	return nil
}

// CloseWrite shuts down the writing side: the peer reads io.EOF once it has
// read everything written before.
func (c *Conn) CloseWrite() error {
	c.wlock.Lock() // after any Write in progress
	defer c.wlock.Unlock()
	c.mu.Lock()
	if c.localClosed {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	if !c.finSent && c.err == nil {
		c.sendLocked(kindFin, nil)
	}
	c.finSent = true
	c.flags.Or(fWriteShut)
	c.mu.Unlock()
	return nil
}

// send sends a control frame for this connection to the peer.
func (c *Conn) send(kind uint32, body []byte) {
	c.mu.Lock()
	c.sendLocked(kind, body)
	c.mu.Unlock()
}

// sendLocked sends a control frame unless CLOSE has gone already (nothing
// may follow it) or the connection is not established. Holding c.mu while
// queueing orders every frame of the connection.
func (c *Conn) sendLocked(kind uint32, body []byte) {
	if c.closeSent || c.state != connEstablished {
		return
	}
	if kind == kindClose {
		c.closeSent = true
	}
	c.st.sendCtl(kind, c.peerID, body)
}

// freeLocked reports whether the id can be reused now: both CLOSE frames
// have passed, so no frame for it can still arrive.
func (c *Conn) freeLocked() bool {
	if c.idFreed || !c.closeSent || !c.closeRecv {
		return false
	}
	c.idFreed = true
	return true
}

// Frame handlers, called by whoever polls (RX lock held).

// acceptData reports whether n more bytes fit in our receive window.
func (c *Conn) acceptData(n int) bool {
	return c.recvd.Load()+int64(n)-c.read.Load() <= int64(c.ep.cfg.Window)
}

func (c *Conn) enqueue(p []byte) {
	c.recvd.Add(int64(len(p)))
	if c.flags.Load()&fClosed != 0 {
		c.read.Add(int64(len(p))) // nobody will read it
		return
	}
	c.qmu.Lock()
	c.q.push(p)
	c.qmu.Unlock()
	c.queued.Add(int64(len(p)))
	signal(c.rnotify)
}

func (c *Conn) credit(v uint64) error {
	if int64(v) < c.peerRead.Load() || int64(v) > c.sent.Load() {
		return fmt.Errorf("connection %d: credit %d outside [%d, %d]", c.id, v, c.peerRead.Load(), c.sent.Load())
	}
	c.peerRead.Store(int64(v))
	signal(c.wnotify)
	return nil
}

func (c *Conn) established(m acceptMsg) error {
	c.mu.Lock()
	if c.state != connDialing {
		c.mu.Unlock()
		return fmt.Errorf("accept for connection %d, which is not dialing", c.id)
	}
	c.peerID, c.window, c.state = m.id, int64(m.window), connEstablished
	if c.localClosed { // the dialer gave up: close at once
		c.sendLocked(kindClose, nil)
	}
	c.mu.Unlock()
	signal(c.wnotify)
	return nil
}

func (c *Conn) refused(code uint32) error {
	c.mu.Lock()
	if c.state != connDialing {
		c.mu.Unlock()
		return fmt.Errorf("refusal for connection %d, which is not dialing", c.id)
	}
	c.state = connRefused
	switch code {
	case refuseBacklog:
		c.err = fmt.Errorf("listener backlog full: %w", syscall.ECONNREFUSED)
	case refuseNoIDs:
		c.err = fmt.Errorf("peer has no free connection ids: %w", syscall.ECONNREFUSED)
	default:
		c.err = syscall.ECONNREFUSED
	}
	c.flags.Or(fFailed)
	c.idFreed = true // the peer kept no state for us
	c.mu.Unlock()
	c.st.releaseID(c.id)
	signal(c.wnotify)
	return nil
}

func (c *Conn) peerFin() {
	c.flags.Or(fEOF)
	signal(c.rnotify)
}

func (c *Conn) peerClose() {
	c.mu.Lock()
	c.closeRecv = true
	c.sendLocked(kindClose, nil) // our answer, unless we closed first
	free := c.freeLocked()
	c.mu.Unlock()
	c.flags.Or(fEOF | fPeerGone)
	if free {
		c.st.releaseID(c.id)
	}
	signal(c.rnotify)
	signal(c.wnotify)
}

// fail ends the connection with err (the session is gone).
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.flags.Or(fFailed)
	signal(c.rnotify)
	signal(c.wnotify)
}

// spinner runs the spin half of spin-then-park and keeps the endpoint's
// count of spinning goroutines, which tells the poller whether anyone is
// watching the ring.
type spinner struct {
	ep       *Endpoint
	spinning bool
	start    time.Time
	iter     int
}

// spin reports whether to keep polling (true) or park (false).
func (s *spinner) spin() bool {
	if !s.spinning {
		s.spinning = true
		s.ep.active.Add(1)
		s.start = time.Now()
		s.iter = 0
		return s.ep.cfg.SpinBudget > 0
	}
	s.iter++
	if s.iter&63 == 0 {
		if time.Since(s.start) > s.ep.cfg.SpinBudget {
			return false
		}
		runtime.Gosched()
	}
	return true
}

// stop leaves the spinning state; if that leaves parked goroutines with
// nobody polling, the poller takes over.
func (s *spinner) stop() {
	if !s.spinning {
		return
	}
	s.spinning = false
	if s.ep.active.Add(-1) == 0 && s.ep.parked.Load() > 0 {
		s.ep.kickPoller()
	}
}

// dialErr maps a context error as the standard library's dialer does.
func dialErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return os.ErrDeadlineExceeded
	}
	return err
}
