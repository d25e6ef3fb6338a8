package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ntstack/ntstack/internal/prim/ring"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/partition"
)

// ring is the floor: the same shared-memory rings the ntb transport uses,
// driven by busy polling with no socket layer — no framing, connection
// multiplexing, flow control, doorbells or parking. One link per
// connection, each with an equal share of the default window (so that
// their rings together are the size of the ntb transport's one); the
// server opens -conns links up front. A side with nothing to do yields to
// its process's other goroutines: with more connections than CPUs a
// poller that never yields holds its P until the runtime preempts it, and
// the others' links miss their heartbeats.
func init() {
	register(transport{
		name: "ring",
		listen: func(o *options) (net.Listener, string, error) {
			base := fmt.Sprintf("ntbench-ring-%d", os.Getpid())
			n := o.conns + o.idle
			ln := &ringListener{base: base, conns: make(chan net.Conn, n), done: make(chan struct{})}
			for i := range n {
				if err := ln.open(i, n, ringWindow(o)); err != nil {
					ln.Close()
					return nil, "", err
				}
			}
			return ln, base, nil
		},
		dial: func(o *options, base string) (net.Conn, error) {
			ringMu.Lock()
			i := ringDials[base]
			ringDials[base]++
			ringMu.Unlock()
			c, err := openRing(fmt.Sprintf("%s-%d", base, i), ringWindow(o))
			if err != nil {
				return nil, err
			}
			if err := c.waitSession(); err != nil {
				c.Close()
				return nil, err
			}
			return c, nil
		},
	})
}

// ringHeartbeatTimeout is how long a ring link's peer may stay silent
// before the link is down: four times the fabric's default, since a
// baseline's links should outlast a loaded machine's scheduling gaps (16
// links under -race beside other tests missed 250 ms).
const ringHeartbeatTimeout = time.Second

// ringWindow is each link's window: the default one split among the
// connections, idle ones too, at least 256 KiB.
func ringWindow(o *options) int {
	return max(shm.DefaultWindowSize/(o.conns+o.idle), 256<<10) &^ (os.Getpagesize() - 1)
}

// ringDials counts the client's dials per server, which name its links.
var (
	ringMu    sync.Mutex
	ringDials = map[string]int{}
)

// ringListener serves links base-0, base-1, …: the client dials them in
// order, -conns and -idle at a time, so when link i is taken link
// i+conns+idle is opened.
type ringListener struct {
	base  string
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once

	mu  sync.Mutex
	all []*ringConn
}

func (l *ringListener) open(i, stride, window int) error {
	c, err := openRing(fmt.Sprintf("%s-%d", l.base, i), window)
	if err != nil {
		return err
	}
	l.mu.Lock()
	l.all = append(l.all, c)
	l.mu.Unlock()
	go func() {
		select {
		case <-c.ready:
		case <-l.done:
			return
		}
		l.open(i+stride, stride, window)
		select {
		case l.conns <- c:
		case <-l.done:
		}
	}()
	return nil
}

func (l *ringListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *ringListener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, c := range l.all {
			c.Close()
		}
	})
	return nil
}

func (l *ringListener) Addr() net.Addr { return &net.UnixAddr{Name: "ring", Net: "ring"} }

// ringConn is a minimal net.Conn over one partition, busy polling.
type ringConn struct {
	name    string
	dev     *shm.Device
	link    *partition.Link
	part    *partition.Partition
	ready   chan struct{}
	pending []byte // rest of a record larger than the last Read
	closed  atomic.Bool
	once    sync.Once
}

func openRing(name string, window int) (*ringConn, error) {
	dev, err := shm.Open(name, shm.Options{WindowSize: window, HeartbeatTimeout: ringHeartbeatTimeout})
	if err != nil {
		return nil, err
	}
	c := &ringConn{name: name, dev: dev, ready: make(chan struct{})}
	var once sync.Once
	c.link, err = partition.Open(dev, partition.Config{OnSession: func(s *partition.Session) {
		once.Do(func() {
			c.part = s.Partitions()[0]
			close(c.ready)
		})
	}})
	if err != nil {
		dev.Close()
		return nil, err
	}
	return c, nil
}

func (c *ringConn) waitSession() error {
	select {
	case <-c.ready:
		return nil
	case <-time.After(10 * time.Second):
		return errors.New("ring: no session with the peer after 10s")
	}
}

func (c *ringConn) Write(b []byte) (int, error) {
	n := 0
	for n < len(b) {
		chunk := min(len(b)-n, c.part.MaxPayload())
		err := c.part.TrySend(0, nil, b[n:n+chunk])
		switch {
		case err == nil:
			n += chunk
		case errors.Is(err, ring.ErrFull):
			if c.closed.Load() {
				return n, net.ErrClosed
			}
			runtime.Gosched()
		default:
			return n, err
		}
	}
	return n, nil
}

func (c *ringConn) Read(b []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(b, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	p := c.part
	p.LockRX()
	defer p.UnlockRX()
	for {
		_, payload, ok, err := p.Peek()
		if errors.Is(err, partition.ErrSessionEnded) {
			return 0, io.EOF // the peer closed its end
		}
		if err != nil {
			return 0, err
		}
		if ok {
			n := copy(b, payload)
			if n < len(payload) {
				c.pending = append(c.pending[:0], payload[n:]...)
			}
			p.Release()
			return n, nil
		}
		if c.closed.Load() {
			return 0, io.EOF
		}
		p.UnlockRX()
		runtime.Gosched()
		p.LockRX()
	}
}

func (c *ringConn) Close() error {
	c.once.Do(func() {
		c.closed.Store(true)
		c.link.Close()
		c.dev.Close()
		shm.Remove("", c.name)
	})
	return nil
}

func (c *ringConn) LocalAddr() net.Addr                { return &net.UnixAddr{Name: c.name, Net: "ring"} }
func (c *ringConn) RemoteAddr() net.Addr               { return &net.UnixAddr{Name: c.name, Net: "ring"} }
func (c *ringConn) SetDeadline(t time.Time) error      { return nil }
func (c *ringConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *ringConn) SetWriteDeadline(t time.Time) error { return nil }
