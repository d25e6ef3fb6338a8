package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/prim/deadline"

	"github.com/ntstack/ntstack/qos"
)

// Conn is one connection over the link. It implements net.Conn with the
// standard library's semantics, plus CloseWrite.
//
// Its state is in parts, each with its own lock, so that the reader, the
// writer and whoever polls or serves for them meet only where they must:
//
//   - recvHalf (recv.go): the peer's frames delivered in order, the queue
//     and a blocked Read's posted buffer;
//   - grants (credit.go, turns.go): the credit this side hands back to
//     the peer's writer as the application reads;
//   - sendHalf (send.go): the posted write, the peer's credit, and the
//     connection's place on a unit, served by whoever holds the unit;
//   - the lifecycle below (mu): dialing, established, refused, closed,
//     failed, and the frames that end a connection.
//
// flags summarises the lifecycle for the fast paths, which read no lock.
type Conn struct {
	ep            *Endpoint
	stp           atomic.Pointer[state] // the session it runs on; replaced when it resumes on a new one
	id            uint32                // ours; frames to us carry it
	peerID        uint32                // theirs; frames we send carry it
	gen, peerGen  uint32                // incarnations of id and peerID
	nonce         uint64                // identity both ends agreed at OPEN, for RESUME (0: the peer cannot resume)
	local, remote Addr

	rlock, wlock     sync.Mutex    // serialise Read calls and Write calls
	rnotify, wnotify chan struct{} // cap 1: something changed for readers / writers
	pauseNote        chan struct{} // cap 1: its session ended with it kept for resume (AwaitPause)
	ended            chan struct{} // closed once Ended turns true (endedLocked)
	closedCh         chan struct{} // closed by Close
	rdl, wdl         *deadline.Deadline

	recvHalf
	grants
	sendHalf

	sleepers atomic.Int32 // goroutines parked on this connection
	pausedAt atomic.Int64 // ep.now()+1 since when it waits for a session or the peer's RESUME (0: it does not)
	sporadic atomic.Bool  // its last park outlasted busySpin: its waits keep SpinBudget (see spinner)

	flags atomic.Uint32 // fast-path summary of the state below

	mu sync.Mutex
	// mu protects the following fields.
	state              connState
	finSent, closeSent bool
	closeAborts        bool // the CLOSE sent is Abort's (resume sends it again as one)
	closeRecv, idFreed bool
	quotaHeld          int64 // receive-window memory reserved (Config.MemoryQuota)
	err                error // terminal: refused, session ended
	localClosed        bool
	endedShut          bool // ended is closed
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
	c := &Conn{
		ep:        ep,
		local:     local,
		remote:    remote,
		rnotify:   make(chan struct{}, 1),
		wnotify:   make(chan struct{}, 1),
		pauseNote: make(chan struct{}, 1),
		ended:     make(chan struct{}),
		closedCh:  make(chan struct{}),
		rdl:       deadline.New(),
		wdl:       deadline.New(),
	}
	c.rxPart.Store(-1)
	c.movedAt.Store(-1)
	return c
}

// st is the session state the connection runs on now. A connection that
// resumes after a session restart moves to the new one (resume.go), so
// callers load it once per use rather than keep it.
func (c *Conn) st() *state { return c.stp.Load() }

// wake signals ch, one of c's notify channels; if a goroutine of c is
// parked, the endpoint's spinner yields soon so that it runs (see spin).
func (c *Conn) wake(ch chan struct{}) {
	signal(ch)
	if c.sleepers.Load() > 0 {
		c.ep.handoffs.Add(1)
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

// Setting a deadline wakes a parked call, which parks again watching it
// (see park).
func (c *Conn) SetDeadline(t time.Time) error {
	c.SetReadDeadline(t)
	c.SetWriteDeadline(t)
	return nil
}

func (c *Conn) SetReadDeadline(t time.Time) error {
	c.rdl.Set(t)
	signal(c.rnotify)
	return nil
}

func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.wdl.Set(t)
	signal(c.wnotify)
	return nil
}

func (c *Conn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "ntb", Source: c.local, Addr: c.remote, Err: err}
}

// free releases what the connection holds on this side: its place, its
// window quota and its id.
func (c *Conn) releaseLocal() {
	c.smu.Lock()
	if c.unit != nil && !c.unplaced {
		c.unit.unplace(c.slot)
		c.unplaced = true
	}
	c.keep.reset() // nothing will be sent again
	c.smu.Unlock()
	c.mu.Lock()
	held := c.quotaHeld
	c.quotaHeld = 0
	c.mu.Unlock()
	if held > 0 {
		c.ep.quota.Release(held)
	}
	c.cmu.Lock()
	c.turnsDone = true
	c.retireAhead(0)
	c.cmu.Unlock()
	c.st().releaseID(c)
}

func (c *Conn) class() qos.Class { return qos.Class(c.prio.Load()) }

// Priority is the connection's priority class.
func (c *Conn) Priority() qos.Class { return c.class() }

// SetPriority sets the connection's class (0 highest, 7 lowest). With
// Config.QoS the connection moves to its class's partition, in order.
func (c *Conn) SetPriority(class qos.Class) error {
	if !class.Valid() {
		return fmt.Errorf("set priority: class %d outside 0..%d", class, qos.Lowest)
	}
	c.prio.Store(uint32(class))
	c.smu.Lock()
	u := c.unit
	c.smu.Unlock()
	if u != nil && u.partFor(class) != c.slotNow() {
		c.moveTo(u, u.partFor(class))
	}
	return nil
}

func (c *Conn) failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close closes the connection: blocked calls return net.ErrClosed, the
// peer's reads end with io.EOF and its writes fail.
func (c *Conn) Close() error { return c.closeWith(nil) }

// Abort closes the connection as a TCP reset does: once it has read what
// came before, the peer's calls fail with an error matching
// syscall.ECONNRESET instead of reading io.EOF. It says the stream ends
// short: ntproxy aborts an application's connection whose far end went
// without closing it.
func (c *Conn) Abort() error { return c.closeWith(closeAbort) }

// closeAbort is the body of an aborting CLOSE.
var closeAbort = []byte{1}

func (c *Conn) closeWith(body []byte) error {
	c.mu.Lock()
	if c.localClosed {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	c.localClosed = true
	c.flags.Or(fClosed)
	close(c.closedCh)
	signal(c.rnotify) // for calls parked on notify alone (see park)
	signal(c.wnotify)
	if c.err == nil {
		c.sendLocked(kindClose, body)
	}
	free := c.freeLocked()
	c.mu.Unlock()
	if free {
		c.releaseLocal()
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

// sendLocked sends a control frame unless CLOSE has gone already (nothing
// may follow it) or the connection is not established. Holding c.mu while
// queueing orders every frame of the connection.
func (c *Conn) sendLocked(kind uint32, body []byte) {
	if c.closeSent || c.state != connEstablished {
		return
	}
	if kind == kindClose {
		c.closeSent, c.closeAborts = true, len(body) > 0
	}
	c.queueFrame(kind, body)
}

// Ended reports whether the peer has closed its end (its CLOSE arrived) or
// the connection failed: nothing more will arrive for it.
func (c *Conn) Ended() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeRecv || c.err != nil
}

// endedLocked closes c.ended once Ended holds (c.mu held): every change
// that can make it hold calls it.
func (c *Conn) endedLocked() {
	if (c.closeRecv || c.err != nil) && !c.endedShut {
		c.endedShut = true
		close(c.ended)
	}
}

// AwaitEnd waits until Ended holds, or ctx ends (its error). Close does
// not end the wait: after it, the wait is for the peer's CLOSE (its
// answer to ours), so that what was written before has reached the peer.
func (c *Conn) AwaitEnd(ctx context.Context) error {
	select {
	case <-c.ended:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("await end of connection %d: %w", c.id, ctx.Err())
	}
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

func (c *Conn) established(m acceptMsg) error {
	c.mu.Lock()
	if m.echoed && m.dialGen != c.gen {
		// A late ACCEPT for an earlier connection with our id, which gave
		// up dialing: not ours, ignore it. (Ids are reused oldest-first, so
		// this takes thousands of connections between the two.)
		c.mu.Unlock()
		return nil
	}
	if c.state != connDialing {
		c.mu.Unlock()
		return fmt.Errorf("accept for connection %d, which is not dialing", c.id)
	}
	c.peerID, c.window, c.peerGen, c.state = m.id, int64(m.window), m.gen, connEstablished
	if c.localClosed { // the dialer gave up: close at once
		c.sendLocked(kindClose, nil)
	}
	c.mu.Unlock()
	c.wake(c.wnotify)
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
	case refuseQuota:
		c.err = fmt.Errorf("peer's receive-window memory quota is used up: %w", syscall.ECONNREFUSED)
	case refusePartitions:
		c.err = fmt.Errorf("peer's partitions are at their connection quota: %w", syscall.ECONNREFUSED)
	default:
		c.err = syscall.ECONNREFUSED
	}
	c.endedLocked()
	c.flags.Or(fFailed)
	c.idFreed = true // the peer kept no state for us
	c.mu.Unlock()
	c.releaseLocal()
	c.wake(c.wnotify)
	return nil
}

func (c *Conn) peerFin() {
	c.flags.Or(fEOF)
	c.wake(c.rnotify)
}

func (c *Conn) peerClose(abort bool) {
	c.mu.Lock()
	c.closeRecv = true
	if abort && c.err == nil {
		c.err = errPeerAborted
	}
	c.endedLocked()
	c.sendLocked(kindClose, nil) // our answer, unless we closed first
	free := c.freeLocked()
	c.mu.Unlock()
	if abort {
		c.flags.Or(fFailed | fPeerGone)
	} else {
		c.flags.Or(fEOF | fPeerGone)
	}
	if free {
		c.releaseLocal()
	}
	c.wake(c.rnotify)
	c.wake(c.wnotify)
}

// fail ends the connection with err (the session is gone).
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.endedLocked()
	c.mu.Unlock()
	c.flags.Or(fFailed)
	c.wake(c.rnotify)
	c.wake(c.wnotify)
}

// dialErr maps a context error as the standard library's dialer does.
func dialErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return os.ErrDeadlineExceeded
	}
	return err
}

// WriteRoom returns how many bytes a Write may send now without waiting
// for the peer's credit: the peer's window less what it has not yet
// read. A Write of that much can still wait briefly for ring space.
func (c *Conn) WriteRoom() int64 {
	c.smu.Lock()
	defer c.smu.Unlock()
	return c.window - (c.sent.Load() - c.peerRead.Load())
}
