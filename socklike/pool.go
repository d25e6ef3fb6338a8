package socklike

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/prim/pool"
	"github.com/ntstack/ntstack/internal/prim/proc"
)

// EnvPool, set to 1, makes DefaultProxy's dials (a Dialer without Proxy)
// and Listen ask for shared-pool mode.
const EnvPool = "NTSTACK_POOL"

// poolChunk is the most a Write publishes at a time, so that ntproxy
// starts sending the front of a large write while the rest is copied.
const poolChunk = 64 << 10

// sharedPool is this process's mapping of an attachment's shared buffer
// pool. It stays mapped while the attachment lives or any of its
// connections is open, whichever is longer.
type sharedPool struct {
	mem   []byte
	ring  int
	slots int

	mu sync.Mutex
	// mu protects the following fields.
	refs  int // open connections, and one for the attachment
	conns map[*poolConn]struct{}
	dead  error // why the attachment ended: no new connections
}

func mapPool(f *os.File, slots, ring int) (*sharedPool, error) {
	if err := pool.CheckGeometry(slots, ring); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrProxy, err)
	}
	size := slots * pool.SlotSize(ring)
	if fi, err := f.Stat(); err != nil || fi.Size() < int64(size) {
		return nil, fmt.Errorf("%w: shared pool file smaller than its %d slots of %d-byte rings (%v)", ErrProxy, slots, ring, err)
	}
	mem, err := proc.MapShared(f, size)
	if err != nil {
		return nil, fmt.Errorf("shared pool: %w", err)
	}
	return &sharedPool{mem: mem, ring: ring, slots: slots, refs: 1, conns: map[*poolConn]struct{}{}}, nil
}

// poolPoller spins for the waits of all this process's shared-pool
// connections, every attachment's: up to GOMAXPROCS of the waits poll
// them all while the others stay parked, holding no P and no thread
// (pool.Poller).
var poolPoller = pool.NewPoller()

// open returns the connection of slot i.
func (sp *sharedPool) open(i int, spin time.Duration, local, remote Addr) (*poolConn, error) {
	if i < 0 || i >= sp.slots {
		return nil, fmt.Errorf("%w: pool slot %d of %d", ErrProxy, i, sp.slots)
	}
	n := pool.SlotSize(sp.ring)
	s, err := pool.NewSlot(sp.mem[i*n:(i+1)*n], sp.ring)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrProxy, err)
	}
	s.Poll(poolPoller)
	c := &poolConn{slot: s, sp: sp, spin: spin, local: local, remote: remote}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.dead != nil { // and perhaps unmapped
		return nil, sp.dead
	}
	sp.refs++
	sp.conns[c] = struct{}{}
	return c, nil
}

// release drops a reference (c's, or the attachment's when c is nil) and
// unmaps the pool after the last.
func (sp *sharedPool) release(c *poolConn) {
	sp.mu.Lock()
	if c != nil {
		delete(sp.conns, c)
	}
	sp.refs--
	last := sp.refs == 0
	sp.mu.Unlock()
	if last {
		proc.Unmap(sp.mem)
	}
}

// failAll fails every open connection with err (ntproxy went away), and
// every later open.
func (sp *sharedPool) failAll(err error) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if sp.dead == nil {
		sp.dead = err
	}
	for c := range sp.conns {
		c.fail(err)
	}
}

// poolConn is the stream of a Conn in shared-pool mode: its bytes go through a
// slot of the pool this process shares with ntproxy (internal/prim/pool). A
// Write copies into the slot's out ring, from which ntproxy sends onto the
// rack link; a Read copies out of the in ring, into which ntproxy reads
// from the rack link — two copies fewer per direction than proxy mode,
// and no memory link or socklike worker in between.
//
// Concurrency: as net.Conn, one Read and one Write may run at once with
// any other method. A call that waits is spun for, Config.SpinBudget,
// by the process's pool poller while it stays parked, then sleeps on a
// futex in the slot, holding its thread.
type poolConn struct {
	slot          *pool.Slot
	sp            *sharedPool
	spin          time.Duration
	local, remote Addr

	rmu    sync.Mutex // one Read at a time
	inTail uint64     // bytes read (rmu)

	wmu     sync.Mutex // one Write at a time
	outHead uint64     // bytes written (wmu)

	rdl, wdl atomic.Int64 // deadlines, Unix nanoseconds; 0: none
	moved    atomic.Int64 // when a Read or Write last moved bytes, Unix nanoseconds
	sporadic atomic.Bool  // the last wait outlasted pool.BusySpin (see pool.Spin)
	closed   atomic.Bool
	finSent  atomic.Bool
	err      atomic.Pointer[error] // set when ntproxy went away
	fmu      sync.Mutex            // serialises this side's flag stores
}

var _ net.Conn = (*poolConn)(nil)

func (c *poolConn) LocalAddr() net.Addr  { return c.local }
func (c *poolConn) RemoteAddr() net.Addr { return c.remote }

func (c *poolConn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "ntb", Source: c.local, Addr: c.remote, Err: err}
}

func (c *poolConn) fail(err error) {
	c.err.CompareAndSwap(nil, &err)
	c.slot.Kick(pool.App)
}

func (c *poolConn) failure() error {
	if p := c.err.Load(); p != nil {
		return *p
	}
	return nil
}

var errPoolCorrupt = errors.New("shared pool slot indices out of range")

// corrupt is the error of indices out of range: the connection's failure,
// if ntproxy went away meanwhile (and may have taken the slot back), else
// errPoolCorrupt.
func (c *poolConn) corrupt() error {
	if err := c.failure(); err != nil {
		return err
	}
	return errPoolCorrupt
}

// Read reads what the peer wrote, blocking until at least one byte is
// there, the peer finished (io.EOF), the deadline passed or the connection
// failed. What arrived before a reset is still read first.
func (c *poolConn) Read(b []byte) (int, error) {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	for {
		if c.closed.Load() {
			return 0, c.opErr("read", net.ErrClosed)
		}
		dl := c.rdl.Load()
		if dl != 0 && time.Now().UnixNano() >= dl {
			return 0, c.opErr("read", os.ErrDeadlineExceeded)
		}
		if err := c.failure(); err != nil {
			// Not the slot's bytes first: ntproxy may have taken it back.
			return 0, c.opErr("read", err)
		}
		pf := c.slot.ProxyFlags()
		head := c.slot.InHead()
		if avail := head - c.inTail; avail > 0 {
			if avail > uint64(len(c.slot.In)) || head < c.inTail {
				return 0, c.opErr("read", c.corrupt())
			}
			if len(b) == 0 {
				return 0, nil
			}
			n := ringCopyOut(b, c.slot.In, c.inTail, int(avail))
			c.inTail += uint64(n)
			c.slot.SetInTail(c.inTail)
			if c.inTail >= c.slot.InWant() {
				c.slot.Notify(pool.Proxy)
			}
			c.moved.Store(time.Now().UnixNano())
			return n, nil
		}
		switch {
		case pf&pool.FlagFin != 0: // set after the last byte's head: none is left
			return 0, io.EOF
		case pf&pool.FlagReset != 0:
			return 0, c.opErr("read", syscall.ECONNRESET)
		}
		c.sporadic.Store(c.slot.Wait(pool.App, func() bool {
			return c.slot.InHead() != head || c.slot.ProxyFlags() != pf || c.closed.Load() || c.err.Load() != nil || c.rdl.Load() != dl
		}, pool.Spin(c.spin, c.moved.Load(), c.sporadic.Load()), unixTime(dl)))
	}
}

// Write writes b, blocking while the out ring is full (the peer has not
// acknowledged enough), until all is written, the deadline passes or the
// connection fails.
func (c *poolConn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	n := 0
	for n < len(b) {
		room, err := c.writeRoom(min(len(b)-n, poolChunk), true)
		if err != nil {
			return n, err
		}
		k := copy(room, b[n:])
		c.wrote(k)
		n += k
	}
	return n, nil
}

// ReadFrom writes what r holds until io.EOF, as io.Copy does, reading it
// straight into the out ring: one copy, where io.Copy's buffer and Write
// take two. While the ring is full it reads into a buffer of its own
// instead and writes that, so that, as with io.Copy, a source that is done
// ends the call without waiting for room. It returns the bytes written
// and the first error other than io.EOF. It holds wmu throughout, r's
// Reads included: r must not block (see readsAtOnce).
func (c *poolConn) ReadFrom(r io.Reader) (int64, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	var total int64
	var staged *[]byte
	defer func() {
		if staged != nil {
			readFromPool.Put(staged)
		}
	}()
	for {
		room, err := c.writeRoom(poolChunk, false)
		if err != nil {
			return total, err
		}
		var k int
		var rerr error
		if len(room) > 0 {
			k, rerr = r.Read(room)
			if k > 0 {
				c.wrote(k)
			}
		} else {
			if staged == nil {
				staged = readFromPool.Get().(*[]byte)
			}
			buf := (*staged)[:poolChunk]
			k, rerr = r.Read(buf)
			for n := 0; n < k; {
				if room, err = c.writeRoom(k-n, true); err != nil {
					return total + int64(n), err
				}
				m := copy(room, buf[n:k])
				c.wrote(m)
				n += m
			}
		}
		total += int64(k)
		switch {
		case rerr == io.EOF:
			return total, nil
		case rerr != nil:
			return total, rerr
		}
	}
}

// writeRoom returns the free part of the out ring at outHead that is
// contiguous in memory, at most max bytes (wmu held); if the ring is full
// it waits for room when wait is set, and returns none otherwise. Its
// error ends the write.
func (c *poolConn) writeRoom(max int, wait bool) ([]byte, error) {
	for {
		if c.closed.Load() {
			return nil, c.opErr("write", net.ErrClosed)
		}
		if c.finSent.Load() {
			return nil, c.opErr("write", syscall.EPIPE)
		}
		dl := c.wdl.Load()
		if dl != 0 && time.Now().UnixNano() >= dl {
			return nil, c.opErr("write", os.ErrDeadlineExceeded)
		}
		if err := c.failure(); err != nil {
			return nil, c.opErr("write", err)
		}
		pf := c.slot.ProxyFlags()
		if pf&pool.FlagReset != 0 {
			return nil, c.opErr("write", syscall.ECONNRESET)
		}
		tail := c.slot.OutTail()
		used := c.outHead - tail
		if tail > c.outHead || used > uint64(len(c.slot.Out)) {
			return nil, c.opErr("write", c.corrupt())
		}
		if free := len(c.slot.Out) - int(used); free > 0 {
			i := int(c.outHead & uint64(len(c.slot.Out)-1))
			return c.slot.Out[i : i+min(free, len(c.slot.Out)-i, max)], nil
		}
		if !wait {
			return nil, nil
		}
		c.sporadic.Store(c.slot.Wait(pool.App, func() bool {
			return c.slot.OutTail() != tail || c.slot.ProxyFlags() != pf || c.closed.Load() || c.err.Load() != nil || c.wdl.Load() != dl
		}, pool.Spin(c.spin, c.moved.Load(), c.sporadic.Load()), unixTime(dl)))
	}
}

// wrote publishes n bytes put into the out ring at outHead (wmu held).
func (c *poolConn) wrote(n int) {
	c.outHead += uint64(n)
	c.slot.SetOutHead(c.outHead)
	c.slot.Notify(pool.Proxy)
	c.moved.Store(time.Now().UnixNano())
}

// ringCopyOut copies up to avail bytes of ring from stream position pos
// into b and returns how many.
func ringCopyOut(b, ring []byte, pos uint64, avail int) int {
	n := 0
	for n < len(b) && n < avail {
		i := int((pos + uint64(n)) & uint64(len(ring)-1))
		n += copy(b[n:min(len(b), avail)], ring[i:])
	}
	return n
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

func (c *poolConn) setDeadline(d *atomic.Int64, t time.Time) {
	if t.IsZero() {
		d.Store(0)
	} else {
		d.Store(t.UnixNano())
	}
	c.slot.Notify(pool.App) // a waiting call takes the new deadline
}

func (c *poolConn) SetDeadline(t time.Time) error {
	c.setDeadline(&c.rdl, t)
	c.setDeadline(&c.wdl, t)
	return nil
}

func (c *poolConn) SetReadDeadline(t time.Time) error  { c.setDeadline(&c.rdl, t); return nil }
func (c *poolConn) SetWriteDeadline(t time.Time) error { c.setDeadline(&c.wdl, t); return nil }

// CloseWrite finishes this side's stream: the peer reads io.EOF after
// everything written before.
func (c *poolConn) CloseWrite() error {
	if c.closed.Load() {
		return c.opErr("close", net.ErrClosed)
	}
	c.wmu.Lock() // after any Write in progress
	defer c.wmu.Unlock()
	c.fmu.Lock()
	defer c.fmu.Unlock()
	if !c.finSent.Swap(true) {
		c.slot.SetFlags(pool.App, pool.FlagFin)
		c.slot.Notify(pool.Proxy)
	}
	return nil
}

// Close closes the connection: what was written is still delivered (then
// the peer reads io.EOF), what arrives from now on is dropped. Blocked
// calls return net.ErrClosed.
func (c *poolConn) Close() error { return c.close(0) }

// Abort closes the connection as a reset: what was written is still
// delivered, then the peer's calls fail with ECONNRESET instead of
// reading io.EOF (ntproxy ends the leg with a reset after the last byte).
// What arrives from now on is dropped; blocked calls return
// net.ErrClosed.
func (c *poolConn) Abort() error { return c.close(pool.FlagAbort) }

// close closes the connection, setting the flags of a close and extra
// with one store: ntproxy never sees the close without them.
func (c *poolConn) close(extra uint32) error {
	if c.closed.Swap(true) {
		return c.opErr("close", net.ErrClosed)
	}
	c.slot.Kick(pool.App)
	// Once the flags say closed, ntproxy may take the slot back: wait for
	// this side's calls to leave it first.
	c.rmu.Lock()
	c.wmu.Lock()
	c.fmu.Lock()
	c.slot.SetFlags(pool.App, pool.FlagFin|pool.FlagClosed|extra)
	c.slot.Notify(pool.Proxy)
	c.fmu.Unlock()
	c.wmu.Unlock()
	c.rmu.Unlock()
	c.sp.release(c)
	return nil
}
