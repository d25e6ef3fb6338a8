package ivshmem

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sort"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// oobFDs is how many fds one read can take in; more than one on a message
// is a protocol error, and room for a few lets the client say so instead
// of seeing truncated control data.
const oobFDs = 4

var _ Port = (*Client)(nil)

// Client is one peer of an ivshmem server: the shared memory mapped, the
// eventfds for ringing every other peer and its own eventfds for being
// rung.
type Client struct {
	conn    *net.UnixConn
	id      int
	vectors int
	mem     []byte
	own     []*os.File    // own eventfds, one per vector, netpoller-backed
	done    chan struct{} // closed when runReader returns

	closeOnce sync.Once
	closeErr  error

	// mu protects the following fields.
	mu     sync.RWMutex
	closed bool
	peers  map[int][]int // peer id -> eventfd per vector

	// evMu protects the following fields.
	evMu   sync.Mutex
	events []PeerEvent
	evErr  error         // why no more events will come
	evWake chan struct{} // capacity 1: events or evErr changed
}

// Dial connects to the server at socketPath, reads the handshake and maps
// the shared memory. vectors is the number of vectors the server gives each
// peer; every peer announced with a different count is a protocol error
// (matching ErrProtocol).
func Dial(ctx context.Context, socketPath string, vectors int) (_ *Client, err error) {
	if vectors < 1 || vectors > MaxVectors {
		return nil, fmt.Errorf("dial ivshmem %s: %d vectors, want 1..%d", socketPath, vectors, MaxVectors)
	}
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", socketPath)
	if err != nil {
		return nil, fmt.Errorf("dial ivshmem %s: %w", socketPath, err)
	}
	c := &Client{
		conn:    nc.(*net.UnixConn),
		vectors: vectors,
		done:    make(chan struct{}),
		peers:   make(map[int][]int),
		evWake:  make(chan struct{}, 1),
	}
	shmFD := -1
	var pending []int
	defer func() {
		closeFDs(pending)
		if shmFD >= 0 {
			_ = unix.Close(shmFD)
		}
		if err != nil {
			close(c.done)
			err = errors.Join(fmt.Errorf("dial ivshmem %s: %w", socketPath, err), c.release())
		}
	}()

	stop := context.AfterFunc(ctx, func() { _ = c.conn.SetReadDeadline(time.Unix(1, 0)) })
	dec := newDecoder(vectors)
	for handshake := true; handshake; {
		v, fd, err := readMsg(c.conn)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("read handshake: %w", err)
		}
		m, err := dec.next(v, fd >= 0)
		if err != nil {
			closeFDs([]int{fd})
			return nil, err
		}
		switch m.kind {
		case kindOwnID:
			c.id = m.peer
		case kindShm:
			shmFD = fd
		case kindPeerVector:
			pending = append(pending, fd)
			if m.complete {
				if err := setNonblock(pending); err != nil {
					return nil, err
				}
				c.peers[m.peer], pending = pending, nil
			}
		case kindOwnVector:
			if err := unix.SetNonblock(fd, true); err != nil {
				closeFDs([]int{fd})
				return nil, fmt.Errorf("own vector %d: %w", m.vector, err)
			}
			c.own = append(c.own, os.NewFile(uintptr(fd), fmt.Sprintf("eventfd:ivshmem-%d-%d", c.id, m.vector)))
			handshake = !m.complete
		}
	}
	if !stop() {
		return nil, ctx.Err() // the deadline may already be set
	}
	if c.mem, err = mapShm(shmFD); err != nil {
		return nil, err
	}
	go c.runReader(dec)
	return c, nil
}

// mapShm maps all of the shared memory behind fd.
func mapShm(fd int) ([]byte, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat shared memory: %w", err)
	}
	if st.Size <= 0 || st.Size != int64(int(st.Size)) {
		return nil, protoErr("shared memory of %d bytes", st.Size)
	}
	mem, err := unix.Mmap(fd, 0, int(st.Size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map shared memory: %w", err)
	}
	return mem, nil
}

// readMsg reads one server message: its value and its fd, or -1 if none.
func readMsg(conn *net.UnixConn) (int64, int, error) {
	var b [msgSize]byte
	oob := make([]byte, unix.CmsgSpace(oobFDs*4))
	var fds []int
	for n := 0; n < msgSize; {
		nn, oobn, flags, _, err := conn.ReadMsgUnix(b[n:], oob)
		if oobn > 0 {
			got, perr := parseRights(oob[:oobn])
			fds = append(fds, got...)
			if perr != nil {
				closeFDs(fds)
				return 0, -1, perr
			}
		}
		if flags&unix.MSG_CTRUNC != 0 {
			closeFDs(fds)
			return 0, -1, protoErr("more than %d fds attached to one message", oobFDs)
		}
		n += nn
		if err == nil && nn == 0 && oobn == 0 {
			err = io.EOF
		}
		if err != nil {
			closeFDs(fds)
			if n > 0 && errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return 0, -1, err
		}
	}
	if len(fds) > 1 {
		closeFDs(fds)
		return 0, -1, protoErr("%d fds attached to one message", len(fds))
	}
	v := int64(binary.LittleEndian.Uint64(b[:]))
	if len(fds) == 0 {
		return v, -1, nil
	}
	return v, fds[0], nil
}

func parseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, protoErr("control data: %v", err)
	}
	var fds []int
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			return fds, protoErr("control message type %d: %v", m.Header.Type, err)
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

// runReader follows peers connecting and disconnecting until the server
// hangs up, breaks the protocol or the client is closed.
func (c *Client) runReader(dec *decoder) {
	defer close(c.done)
	var pending []int
	defer func() { closeFDs(pending) }()
	for {
		v, fd, err := readMsg(c.conn)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				err = net.ErrClosed
			} else if !errors.Is(err, io.EOF) {
				err = fmt.Errorf("ivshmem peer %d: read: %w", c.id, err)
			}
			c.finish(err)
			return
		}
		m, err := dec.next(v, fd >= 0)
		if err != nil {
			closeFDs([]int{fd})
			_ = c.conn.Close() // the spec: close the connection on error
			c.finish(fmt.Errorf("ivshmem peer %d: %w", c.id, err))
			return
		}
		switch m.kind {
		case kindPeerVector:
			pending = append(pending, fd)
			if !m.complete {
				continue
			}
			fds := pending
			pending = nil
			if err := setNonblock(fds); err != nil {
				closeFDs(fds)
				c.finish(fmt.Errorf("ivshmem peer %d: peer %d: %w", c.id, m.peer, err))
				return
			}
			c.mu.Lock()
			if c.closed {
				closeFDs(fds)
			} else {
				c.peers[m.peer] = fds
			}
			c.mu.Unlock()
			c.push(PeerEvent{ID: m.peer, Up: true})
		case kindPeerGone:
			c.mu.Lock()
			fds := c.peers[m.peer]
			delete(c.peers, m.peer)
			c.mu.Unlock()
			closeFDs(fds)
			c.push(PeerEvent{ID: m.peer})
		}
	}
}

func (c *Client) push(e PeerEvent) {
	c.evMu.Lock()
	c.events = append(c.events, e)
	c.evMu.Unlock()
	c.wake()
}

func (c *Client) finish(err error) {
	c.evMu.Lock()
	if c.evErr == nil {
		c.evErr = err
	}
	c.evMu.Unlock()
	c.wake()
}

func (c *Client) wake() {
	select {
	case c.evWake <- struct{}{}:
	default:
	}
}

// ID is the client's own peer id.
func (c *Client) ID() int { return c.id }

// Vectors is the number of doorbell vectors of every peer.
func (c *Client) Vectors() int { return c.vectors }

// Mem is the shared memory, mapped MAP_SHARED: every peer sees every
// write. The slice is valid until Close; words other peers read concurrently
// must be accessed atomically.
func (c *Client) Mem() []byte { return c.mem }

// Peers lists the ids of the other connected peers, ascending.
func (c *Client) Peers() []int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	ids := make([]int, 0, len(c.peers))
	for id := range c.peers {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	return ids
}

// Ring interrupts peer's vector (the client's own id rings itself). It
// never blocks.
func (c *Client) Ring(peer, vector int) error {
	if vector < 0 || vector >= c.vectors {
		return fmt.Errorf("ring peer %d vector %d: vector outside 0..%d", peer, vector, c.vectors-1)
	}
	var one [8]byte
	binary.NativeEndian.PutUint64(one[:], 1) // eventfd counters are native endian
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.closed {
		return fmt.Errorf("ring peer %d vector %d: %w", peer, vector, net.ErrClosed)
	}
	if peer == c.id {
		_, err := c.own[vector].Write(one[:])
		if err != nil {
			return fmt.Errorf("ring own vector %d: %w", vector, err)
		}
		return nil
	}
	fds, ok := c.peers[peer]
	if !ok {
		return fmt.Errorf("ring peer %d vector %d: %w", peer, vector, ErrNoPeer)
	}
	_, err := unix.Write(fds[vector], one[:])
	if err != nil && err != unix.EAGAIN { // EAGAIN: counter saturated, an interrupt is pending anyway
		return fmt.Errorf("ring peer %d vector %d: %w", peer, vector, err)
	}
	return nil
}

// Wait blocks until the client's own vector has been rung at least once
// since the last Wait on it, or ctx is done. Rings that arrive before Wait
// are not lost; several rings may be consumed by one Wait. At most one
// goroutine may Wait on a vector at a time.
func (c *Client) Wait(ctx context.Context, vector int) error {
	if vector < 0 || vector >= c.vectors {
		return fmt.Errorf("wait vector %d: vector outside 0..%d", vector, c.vectors-1)
	}
	f := c.own[vector]
	var b [8]byte
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := f.SetReadDeadline(time.Time{}); err != nil {
			return c.waitErr(vector, err)
		}
		stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(time.Unix(1, 0)) })
		_, err := f.Read(b[:])
		stop()
		if err == nil {
			return nil
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return c.waitErr(vector, err)
		}
		// ctx is done (checked above), or a late deadline from an earlier
		// Wait's context: clear it and wait again.
	}
}

func (c *Client) waitErr(vector int, err error) error {
	c.mu.RLock()
	closed := c.closed
	c.mu.RUnlock()
	if closed || errors.Is(err, os.ErrClosed) {
		err = net.ErrClosed
	}
	return fmt.Errorf("wait vector %d: %w", vector, err)
}

// NextEvent returns the next peer connect or disconnect, blocking until
// there is one or ctx is done. Events queue up until taken. Once no more
// can come it returns io.EOF (the server hung up), net.ErrClosed (Close)
// or the error that stopped the client (for instance one matching
// ErrProtocol).
func (c *Client) NextEvent(ctx context.Context) (PeerEvent, error) {
	for {
		c.evMu.Lock()
		if len(c.events) > 0 {
			e := c.events[0]
			c.events = c.events[1:]
			more := len(c.events) > 0 || c.evErr != nil
			c.evMu.Unlock()
			if more {
				c.wake() // for another waiting goroutine
			}
			return e, nil
		}
		err := c.evErr
		c.evMu.Unlock()
		if err != nil {
			c.wake()
			return PeerEvent{}, err
		}
		select {
		case <-c.evWake:
		case <-ctx.Done():
			return PeerEvent{}, ctx.Err()
		}
	}
}

// Close disconnects from the server (the others hear of it), unmaps the
// shared memory and closes every fd. Close is idempotent.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		_ = c.conn.Close() // stops runReader; release reports errors
		<-c.done
		c.finish(net.ErrClosed)
		c.closeErr = c.release()
	})
	return c.closeErr
}

// release closes the connection and everything received over it; the
// reader must have stopped.
func (c *Client) release() error {
	var errs []error
	if err := c.conn.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
		errs = append(errs, fmt.Errorf("close ivshmem connection: %w", err))
	}
	c.mu.Lock()
	c.closed = true
	for id, fds := range c.peers {
		closeFDs(fds)
		delete(c.peers, id)
	}
	c.mu.Unlock()
	for _, f := range c.own {
		if err := f.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close own eventfd: %w", err))
		}
	}
	if c.mem != nil {
		if err := unix.Munmap(c.mem); err != nil {
			errs = append(errs, fmt.Errorf("unmap shared memory: %w", err))
		}
		c.mem = nil
	}
	return errors.Join(errs...)
}

func setNonblock(fds []int) error {
	for _, fd := range fds {
		if err := unix.SetNonblock(fd, true); err != nil {
			return fmt.Errorf("set eventfd nonblocking: %w", err)
		}
	}
	return nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		if fd >= 0 {
			_ = unix.Close(fd)
		}
	}
}
