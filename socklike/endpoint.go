// Package socklike is ntstack's application API: net.Conn and net.Listener
// over an NTB link, so code written for the standard library's sockets
// (net/http, gRPC, Redis clients) runs over the fabric unchanged.
//
// An Endpoint is this process's end of one link (embedded mode: the
// process maps the fabric itself). It multiplexes any number of
// connections over the link's rings. Semantics follow the standard
// library's TCP connections exactly: io.EOF at the end of the stream,
// net.ErrClosed after Close, deadlines that wake blocked calls with errors
// satisfying os.ErrDeadlineExceeded, every error a *net.OpError.
//
// The data path runs in the caller's goroutine: Write copies straight into
// the peer's ring, Read polls our ring and copies straight out of it, and
// records for other connections are queued for them on the way. A waiting
// call spins for Config.SpinBudget, then parks. One poller goroutine per
// endpoint sleeps on the doorbell while something is parked and nobody
// spins, or once no Read or Write has come for a couple of milliseconds
// (so frames nobody waits for, like an OPEN, are still answered). So a busy
// pair never takes a doorbell or a context switch and an idle pair costs
// next to nothing.
//
// Flow control is by credit: a connection's sender never has more than the
// receiver's window unread, so the receiver can always take a record off the
// ring — one slow reader slows only its own writer, and memory stays
// bounded by connections × window.
//
// Concurrency: Endpoint, Conn and Listener methods are safe for concurrent
// use. Lifetime: closing the Endpoint ends every connection on it; the
// Endpoint owns the device only when it opened it (Open, not Attach).
package socklike

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/ring"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/partition"
)

// Defaults for Config.
const (
	DefaultSpinBudget = 50 * time.Microsecond
	DefaultWindow     = 1 << 20
	DefaultMTU        = 64 << 10
	DefaultBacklog    = 128
	DefaultMaxConns   = 4096

	minWindow = 4 << 10
	maxWindow = 64 << 20
)

// ErrLinkDown is wrapped by errors of connections whose link or session
// went down. It is ntb.ErrLinkDown, so either name matches.
var ErrLinkDown = ntb.ErrLinkDown

// Config configures an Endpoint. The zero value is usable.
type Config struct {
	// SpinBudget is how long a blocked call polls before it parks. Polling
	// keeps a round trip under a microsecond; parking costs a wake-up of
	// ~5-35 µs on this machine class but no CPU. Negative: never spin.
	SpinBudget time.Duration
	// Window is each connection's receive window in bytes (4 KiB..64 MiB).
	Window int
	// MTU is the largest DATA frame; larger writes are cut into MTU-sized
	// frames so small messages interleave with bulk ones.
	MTU int
	// Backlog is the per-listener queue of accepted, unaccepted connections.
	Backlog int
	// MaxConns bounds connections per endpoint (ids are 20 bits).
	MaxConns int
	// Fabric configures the emulated fabric for Open.
	Fabric shm.Options
	// Logf, if set, receives link and session events.
	Logf func(format string, args ...any)
}

func (c *Config) setDefaults() error {
	if c.SpinBudget == 0 {
		c.SpinBudget = DefaultSpinBudget
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
	if c.Backlog == 0 {
		c.Backlog = DefaultBacklog
	}
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	switch {
	case c.Window < minWindow || c.Window > maxWindow:
		return fmt.Errorf("window %d outside [%d, %d]", c.Window, minWindow, maxWindow)
	case c.MTU < 1:
		return fmt.Errorf("mtu %d", c.MTU)
	case c.MaxConns < 1 || c.MaxConns > maxID:
		return fmt.Errorf("max conns %d outside [1, %d]", c.MaxConns, maxID)
	}
	return nil
}

// Endpoint is this process's end of one NTB link.
type Endpoint struct {
	cfg     Config
	dev     ntb.Device
	ownsDev bool
	link    *partition.Link

	pollers sync.WaitGroup // runPoller goroutines
	active  atomic.Int32   // goroutines spin-polling
	parked  atomic.Int32   // goroutines parked, waiting for the poller
	calls   atomic.Uint64  // Read and Write calls: the poller stays off while they come
	kick    chan struct{}  // wakes the poller when it waits for work

	mu sync.Mutex
	// mu protects the following fields.
	listeners map[uint16]*Listener
	cur       *state        // current session, nil while the link is down
	sessCh    chan struct{} // closed when a session is installed or the endpoint closes
	closed    bool

	spaceMu sync.Mutex
	// spaceMu protects the following fields.
	spaceCh chan struct{} // closed when the peer hands back ring space
}

// Open attaches this process to its end of the emulated link called name
// and returns an Endpoint that owns it.
func Open(name string, cfg Config) (*Endpoint, error) {
	dev, err := shm.Open(name, cfg.Fabric)
	if err != nil {
		return nil, err
	}
	ep, err := Attach(dev, cfg)
	if err != nil {
		return nil, errors.Join(err, dev.Close())
	}
	ep.ownsDev = true
	return ep, nil
}

// Attach runs an Endpoint over dev. Closing the Endpoint does not close dev.
func Attach(dev ntb.Device, cfg Config) (*Endpoint, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("attach %s: %w", dev.Name(), err)
	}
	ep := &Endpoint{
		cfg:       cfg,
		dev:       dev,
		listeners: make(map[uint16]*Listener),
		sessCh:    make(chan struct{}),
		spaceCh:   make(chan struct{}),
		kick:      make(chan struct{}, 1),
	}
	link, err := partition.Open(dev, partition.Config{OnSession: ep.install, Logf: cfg.Logf})
	if err != nil {
		return nil, fmt.Errorf("attach %s: %w", dev.Name(), err)
	}
	ep.link = link
	return ep, nil
}

func (ep *Endpoint) logf(format string, args ...any) {
	if ep.cfg.Logf != nil {
		ep.cfg.Logf("%s: "+format, append([]any{ep.dev.Name()}, args...)...)
	}
}

// Device is the device under the endpoint.
func (ep *Endpoint) Device() ntb.Device { return ep.dev }

// Close ends every connection and listener and detaches from the link.
func (ep *Endpoint) Close() error {
	ep.mu.Lock()
	if ep.closed {
		ep.mu.Unlock()
		return nil
	}
	ep.closed = true
	close(ep.sessCh)
	lns := make([]*Listener, 0, len(ep.listeners))
	for _, ln := range ep.listeners {
		lns = append(lns, ln)
	}
	ep.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	errs := []error{ep.link.Close()} // ends the session: connections fail
	ep.pollers.Wait()
	if ep.ownsDev {
		errs = append(errs, ep.dev.Close())
	}
	return errors.Join(errs...)
}

// install is called by the link when a session is established.
func (ep *Endpoint) install(s *partition.Session) {
	st := &state{
		ep:    ep,
		sess:  s,
		part:  s.Partitions()[0],
		conns: make([]atomic.Pointer[Conn], ep.cfg.MaxConns+1),
	}
	st.nextID = 1
	ep.mu.Lock()
	if ep.closed {
		ep.mu.Unlock()
		return
	}
	ep.cur = st
	close(ep.sessCh)
	ep.sessCh = make(chan struct{})
	ep.pollers.Add(1)
	ep.mu.Unlock()
	go st.runPoller()
}

// session waits for an established session, or ctx.
func (ep *Endpoint) session(ctx context.Context) (*state, error) {
	for {
		ep.mu.Lock()
		st, ch, closed := ep.cur, ep.sessCh, ep.closed
		ep.mu.Unlock()
		if closed {
			return nil, net.ErrClosed
		}
		if st != nil && st.sess.Err() == nil {
			return st, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("no session with the peer (%s link %v): %w", ep.dev.Name(), ep.dev.Link(), ctx.Err())
		}
	}
}

// kickPoller wakes the poller if it waits for work.
func (ep *Endpoint) kickPoller() {
	select {
	case ep.kick <- struct{}{}:
	default:
	}
}

// spaceWait returns a channel closed at the next space doorbell.
func (ep *Endpoint) spaceWait() <-chan struct{} {
	ep.spaceMu.Lock()
	defer ep.spaceMu.Unlock()
	return ep.spaceCh
}

func (ep *Endpoint) spaceArrived() {
	ep.spaceMu.Lock()
	close(ep.spaceCh)
	ep.spaceCh = make(chan struct{})
	ep.spaceMu.Unlock()
}

// state is the endpoint's side of one session: its connection table and
// the queue of control frames waiting for ring space.
type state struct {
	ep    *Endpoint
	sess  *partition.Session
	part  *partition.Partition
	conns []atomic.Pointer[Conn] // by local id; nil = free

	mu sync.Mutex
	// mu protects the following fields.
	free   []uint32 // released ids
	nextID uint32   // next never-used id
	ctlq   []ctlFrame

	ctlPending atomic.Bool // len(ctlq) > 0
}

type ctlFrame struct {
	tag  uint32
	n    int
	body [8]byte
}

// newConn allocates an id and registers a connection in the table.
func (st *state) newConn(c *Conn) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	var id uint32
	switch {
	case len(st.free) > 0:
		id = st.free[len(st.free)-1]
		st.free = st.free[:len(st.free)-1]
	case int(st.nextID) < len(st.conns):
		id = st.nextID
		st.nextID++
	default:
		return fmt.Errorf("%d connections open: %w", len(st.conns)-1, syscall.EMFILE)
	}
	c.id = id
	c.st = st
	st.conns[id].Store(c)
	return nil
}

func (st *state) releaseID(id uint32) {
	st.conns[id].Store(nil)
	st.mu.Lock()
	st.free = append(st.free, id)
	st.mu.Unlock()
}

func (st *state) lookup(id uint32) *Conn {
	if id == 0 || int(id) >= len(st.conns) {
		return nil
	}
	return st.conns[id].Load()
}

// sendCtl sends a control frame without blocking: if the ring is full it
// is queued, in order, and everything sent later waits behind it.
func (st *state) sendCtl(kind, id uint32, body []byte) {
	f := ctlFrame{tag: makeTag(kind, id), n: len(body)}
	copy(f.body[:], body)
	st.mu.Lock()
	st.ctlq = append(st.ctlq, f)
	st.ctlPending.Store(true)
	st.mu.Unlock()
	if !st.flushCtl() {
		st.ep.kickPoller()
	}
}

// flushCtl sends queued control frames; it reports whether the queue is
// empty.
func (st *state) flushCtl() bool {
	if !st.ctlPending.Load() {
		return true
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	sent := 0
	for _, f := range st.ctlq {
		if err := st.part.TrySend(f.tag, f.body[:f.n], nil); err != nil {
			break
		}
		sent++
	}
	st.ctlq = st.ctlq[:copy(st.ctlq, st.ctlq[sent:])]
	st.ctlPending.Store(len(st.ctlq) > 0)
	return len(st.ctlq) == 0
}

// sendData publishes one DATA frame without blocking (ring.ErrFull when
// there is no room, or control frames are still queued ahead of it).
func (st *state) sendData(peerID uint32, b []byte) error {
	if !st.flushCtl() {
		return ring.ErrFull
	}
	return st.part.TrySend(makeTag(kindData, peerID), nil, b)
}

// pollBatch bounds the records one poll takes, so a caller whose record
// arrived returns promptly even under a flood for other connections.
const pollBatch = 64

// poll consumes records if nobody else is. DATA for self goes straight
// into b (self and b may be nil). It returns the bytes copied into b and
// the records consumed.
func (st *state) poll(self *Conn, b []byte) (n, records int) {
	p := st.part
	if !p.TryLockRX() {
		return 0, 0
	}
	n, records = st.pollLocked(self, b)
	p.UnlockRX()
	if n > 0 {
		self.consumed(n)
	}
	return n, records
}

func (st *state) pollLocked(self *Conn, b []byte) (n, records int) {
	p := st.part
	for records < pollBatch {
		tag, payload, ok, err := p.Peek()
		if err != nil || !ok {
			return 0, records
		}
		records++
		kind, id := splitTag(tag)
		if kind == kindData && self != nil && id == self.id && b != nil && self.queued.Load() == 0 && self.acceptData(len(payload)) {
			n = copy(b, payload)
			self.recvd.Add(int64(n))
			if n < len(payload) {
				self.enqueue(payload[n:])
			}
			p.Release()
			return n, records
		}
		err = st.dispatch(kind, id, payload)
		p.Release()
		if err != nil {
			err = fmt.Errorf("protocol violation from peer: %w", err)
			st.ep.logf("%v", err)
			st.sess.Fail(err)
			return 0, records
		}
	}
	return 0, records
}

// dispatch acts on one frame from the peer (RX lock held). An error is a
// protocol violation; it fails the session.
func (st *state) dispatch(kind, id uint32, payload []byte) error {
	switch kind {
	case kindOpen:
		m, err := decodeOpen(payload)
		if err != nil {
			return err
		}
		st.accept(id, m)
		return nil
	}
	c := st.lookup(id)
	if c == nil {
		return fmt.Errorf("frame kind %d for connection %d, which does not exist", kind, id)
	}
	switch kind {
	case kindData:
		if !c.acceptData(len(payload)) {
			return fmt.Errorf("connection %d: %d bytes beyond the window", id, len(payload))
		}
		c.enqueue(payload)
	case kindCredit:
		v, err := decodeU64(payload, "credit")
		if err != nil {
			return err
		}
		return c.credit(v)
	case kindAccept:
		m, err := decodeAccept(payload)
		if err != nil {
			return err
		}
		return c.established(m)
	case kindRefuse:
		code, err := decodeU32(payload, "refuse")
		if err != nil {
			return err
		}
		return c.refused(code)
	case kindFin:
		c.peerFin()
	case kindClose:
		c.peerClose()
	default:
		return fmt.Errorf("unknown frame kind %d", kind)
	}
	return nil
}

// accept handles OPEN: a connection is established as soon as a listener
// has room for it in its backlog, as with TCP.
func (st *state) accept(peerID uint32, m openMsg) {
	st.ep.mu.Lock()
	ln := st.ep.listeners[m.port]
	st.ep.mu.Unlock()
	if ln == nil {
		st.sendCtl(kindRefuse, peerID, le32(refuseNoListener))
		return
	}
	c := newConn(st.ep, ln.addr, Addr{Host: st.ep.dev.Name() + "-peer", Port: int(peerID)})
	c.peerID, c.window = peerID, int64(m.window)
	c.state = connEstablished
	if err := st.newConn(c); err != nil {
		st.sendCtl(kindRefuse, peerID, le32(refuseNoIDs))
		return
	}
	if !ln.offer(c) {
		st.releaseID(c.id)
		st.sendCtl(kindRefuse, peerID, le32(refuseBacklog))
		return
	}
	st.sendCtl(kindAccept, peerID, acceptMsg{id: c.id, window: uint32(st.ep.cfg.Window)}.encode(nil))
}

func le32(v uint32) []byte { return []byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)} }

// drainLocked consumes everything queued in the RX ring (RX lock held).
func (st *state) drainLocked() {
	for {
		if _, records := st.pollLocked(nil, nil); records == 0 {
			return
		}
	}
}

// idleGrace is how long the endpoint must go without a spinning caller or
// a new Read or Write before the poller arms the doorbell for frames nobody waits for (an OPEN
// for a listener with no Accept pending, data for a connection not being
// read). A parked caller arms it at once. Arming while callers come and go
// between round trips would make every message ring a doorbell.
const idleGrace = 2 * time.Millisecond

// runPoller sleeps on the doorbell while nobody else watches the ring, and
// keeps control frames moving. It ends with the session, failing its
// connections.
func (st *state) runPoller() {
	ep, p := st.ep, st.part
	bits := p.DataBit() | p.SpaceBit()
	ctx, cancel := context.WithCancel(context.Background())
	defer context.AfterFunc(st.sess.Context(), cancel)()
	defer cancel()
	defer ep.pollers.Done()
	defer st.failAll()
	timer := time.NewTimer(idleGrace)
	defer timer.Stop()
	pause := func(d time.Duration) {
		timer.Reset(d)
		select {
		case <-ep.kick:
		case <-timer.C:
		case <-ctx.Done():
		}
	}
	var idleSince time.Time
	var calls uint64
	for ctx.Err() == nil {
		ctlDone := st.flushCtl()
		if ctlDone {
			// Somebody polls, or calls keep coming: nothing to do.
			if c := ep.calls.Load(); ep.active.Load() > 0 || (c != calls && ep.parked.Load() == 0) {
				calls, idleSince = c, time.Time{}
				pause(idleGrace)
				continue
			}
			if ep.parked.Load() == 0 {
				if idleSince.IsZero() {
					idleSince = time.Now()
				}
				if wait := idleGrace - time.Since(idleSince); wait > 0 {
					pause(wait)
					continue
				}
			}
		}
		if !p.TryLockRX() {
			pause(100 * time.Microsecond) // a caller is polling; look again soon
			continue
		}
		p.ArmData() // then look once more before sleeping
		st.drainLocked()
		p.UnlockRX()
		if !ctlDone && p.ArmSpace(64) {
			continue // room appeared: flush at the top
		}
		if _, err := ep.dev.WaitDoorbell(ctx, bits); err != nil && ctx.Err() == nil {
			st.sess.Fail(fmt.Errorf("wait for doorbell: %w", err))
			return
		}
		pending := ep.dev.Doorbells() & bits
		ep.dev.ClearDoorbells(pending)
		if pending&p.SpaceBit() != 0 {
			ep.spaceArrived()
		}
		if p.TryLockRX() {
			st.drainLocked()
			p.UnlockRX()
		}
	}
}

// failAll ends every connection of a finished session.
func (st *state) failAll() {
	err := fmt.Errorf("%w: %w", ErrLinkDown, st.sess.Err())
	st.ep.spaceArrived()
	for i := range st.conns {
		if c := st.conns[i].Load(); c != nil {
			c.fail(err)
		}
	}
	st.ep.mu.Lock()
	if st.ep.cur == st {
		st.ep.cur = nil
	}
	st.ep.mu.Unlock()
	if st.ep.cfg.Logf != nil {
		st.ep.cfg.Logf("%s: connections of session %#x closed: %v", st.ep.dev.Name(), st.sess.Epoch, err)
	}
}
