// Package partition turns an ntb.Device into sessions of ring pairs: the
// window layout, the handshake that brings both ends into the same
// session, and the partitions — one TX and one RX ring each — that upper
// layers multiplex connections over.
//
// Session handshake. The window is only safe to write once its owner has
// formatted it, and only safe to format once the peer has stopped writing
// it. Port 0 leads, port 1 follows, through four scratchpads and doorbell
// bit 63:
//
//	follower                                    leader
//	tear down; pick nonce N
//	hello := N  ─────────────────────────────►  new hello: tear down,
//	                                            format own window, pick epoch E
//	                  ◄───────────────────────  echo := N, epoch := E
//	echo == N: tear down, format own window,
//	attach the leader's, ack := E ───────────►  ack == E: attach the follower's
//	session E established                       session E established
//
// A follower only answers an epoch that echoes its latest nonce, so stale
// scratchpads of a dead incarnation are never mistaken for a live peer. A
// leader whose session fails announces epoch 0; the follower tears down and
// says hello again, so the leader never formats a window the follower is
// still writing. Link down ends the session on both sides.
//
// Concurrency: Link runs one goroutine (runSession). A Session and its
// partitions are used concurrently by the layer above under the locking
// rules documented on Partition.
package partition

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ntstack/ntstack/internal/prim/ring"
	"github.com/ntstack/ntstack/ntb"
)

// Scratchpads and doorbell bits of the handshake; partition i uses
// doorbell bits 2i (data) and 2i+1 (space).
const (
	spadHello = 0 // follower -> leader: the follower's nonce
	spadEcho  = 1 // leader -> follower: the nonce this epoch answers
	spadEpoch = 2 // leader -> follower: session epoch (0: no session)
	spadAck   = 3 // follower -> leader: epoch the follower has attached

	sessionBit = uint64(1) << 63

	recheck            = 100 * time.Millisecond // re-check of the handshake without a session
	establishedRecheck = time.Second            // and with one
)

// ErrSessionEnded is the cause of a session's end when the link went down
// or the peer started a new session.
var ErrSessionEnded = errors.New("ntb session ended")

// DownError is the cause of a session's end when its link went down. It
// wraps ErrSessionEnded. Cause says why, as far as the device can tell
// (ntb.Liveness; CauseNone from a device that cannot): the layer above
// fails its connections when the peer is gone or closed, and keeps them
// for the next session otherwise.
type DownError struct {
	Cause  ntb.Cause
	Reason string
}

func (e *DownError) Error() string {
	if e.Cause == ntb.CauseNone {
		return fmt.Sprintf("link down (%s)", e.Reason)
	}
	return fmt.Sprintf("link down (%s): %s", e.Reason, e.Cause)
}

func (e *DownError) Unwrap() error { return ErrSessionEnded }

// ErrPeerRestarted is wrapped by the cause of a session's end when the peer
// started a new session over a link that stayed up (it re-attached, or
// its session failed): the connections of both ends may resume on the
// new one.
var ErrPeerRestarted = fmt.Errorf("peer started a new session: %w", ErrSessionEnded)

// Config configures a Link.
type Config struct {
	// Partitions is the number of ring pairs (default 1).
	Partitions int
	// HelloTimeout is how long a follower waits for an answer before it
	// says hello again (default 200 ms).
	HelloTimeout time.Duration
	// OnSession is called on the link goroutine with each established
	// session. It must not block.
	OnSession func(*Session)
	// Logf, if set, receives one line per handshake step.
	Logf func(format string, args ...any)
}

// Link runs the session handshake over one device.
type Link struct {
	dev    ntb.Device
	cfg    Config
	layout Layout

	ctx  context.Context // cancelled by Close
	stop context.CancelFunc
	done chan struct{}

	mu sync.Mutex
	// mu protects the following fields.
	cur *Session
}

// Open starts the handshake on dev. The Link does not own dev: close the
// Link first, then the device.
func Open(dev ntb.Device, cfg Config) (*Link, error) {
	if cfg.Partitions == 0 {
		cfg.Partitions = 1
	}
	if cfg.HelloTimeout == 0 {
		cfg.HelloTimeout = 200 * time.Millisecond
	}
	if dev.DoorbellCount() < 64 || dev.ScratchpadCount() < 4 {
		return nil, fmt.Errorf("open link on %s: need 64 doorbell bits and 4 scratchpads, have %d and %d: %w",
			dev.Name(), dev.DoorbellCount(), dev.ScratchpadCount(), ntb.ErrNotSupported)
	}
	layout, err := NewLayout(len(dev.InboundWindow()), cfg.Partitions)
	if err != nil {
		return nil, fmt.Errorf("open link on %s: %w", dev.Name(), err)
	}
	l := &Link{dev: dev, cfg: cfg, layout: layout, done: make(chan struct{})}
	l.ctx, l.stop = context.WithCancel(context.Background())
	go l.runSession()
	return l, nil
}

// Layout is the layout of this side's inbound window.
func (l *Link) Layout() Layout { return l.layout }

// Device is the device the link runs on.
func (l *Link) Device() ntb.Device { return l.dev }

// Current returns the established session, or nil.
func (l *Link) Current() *Session {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur != nil && l.cur.Err() != nil {
		return nil
	}
	return l.cur
}

// Close stops the handshake and ends the current session.
func (l *Link) Close() error {
	l.stop()
	<-l.done
	return nil
}

func (l *Link) logf(format string, args ...any) {
	if l.cfg.Logf != nil {
		l.cfg.Logf("%s: "+format, append([]any{l.dev.Name()}, args...)...)
	}
}

func nonZero32() uint32 {
	for {
		if v := rand.Uint32(); v != 0 {
			return v
		}
	}
}

// runSession drives the handshake; see the package comment.
func (l *Link) runSession() {
	defer close(l.done)
	h := &handshake{leader: l.dev.Port() == 0}
	defer func() { l.end(h, fmt.Errorf("link closed: %w", ErrSessionEnded)) }()
	for {
		up, err := l.step(h)
		if err != nil {
			l.logf("format window: %v", err)
			return
		}
		if !l.wait(h.s, up, h.retry(up, l.cfg.HelloTimeout)) {
			return
		}
	}
}

// handshake is what runSession remembers between two looks at the link.
type handshake struct {
	leader    bool
	s         *Session  // the established session, or nil
	nonce     uint32    // follower: our latest hello
	helloAt   time.Time // follower: when we said it
	lastHello uint32    // leader: the hello our epoch answers
	epoch     uint32    // leader: the epoch we announced
}

// retry is how long until the follower says hello again, if it waits for
// an answer (0: it does not).
func (h *handshake) retry(up bool, helloTimeout time.Duration) time.Duration {
	if h.leader || h.s != nil || !up || h.nonce == 0 {
		return 0
	}
	return max(time.Until(h.helloAt.Add(helloTimeout)), time.Millisecond)
}

// end ends h's session, if any, with cause.
func (l *Link) end(h *handshake, cause error) {
	if s := h.s; s != nil {
		s.fail(cause)
		s.quiesce()
		l.logf("session %#x ended: %v", s.Epoch, s.Err())
		h.s = nil
	}
}

// step takes one look at the link and at the scratchpads the peer writes,
// and moves the handshake on (see the package comment). It reports whether
// the link was up; it fails only if our own window cannot be formatted.
func (l *Link) step(h *handshake) (up bool, err error) {
	spad := func(i int) uint32 {
		v, _ := l.dev.Scratchpad(i)
		return v
	}
	tell := func(i int, v uint32) { _ = l.dev.SetPeerScratchpad(i, v) }
	l.dev.ClearDoorbells(sessionBit)
	up = l.dev.Link() == ntb.LinkUp
	if !up {
		cause := ntb.CauseNone
		if lv, ok := l.dev.(ntb.Liveness); ok {
			cause = lv.LinkCause()
		}
		l.end(h, &DownError{Cause: cause, Reason: l.dev.LinkReason()})
		h.nonce, h.epoch, h.lastHello = 0, 0, 0
	} else if h.leader {
		if h.s != nil && h.s.Err() != nil { // failed from above: make the follower start over
			l.end(h, nil)
			h.epoch = 0
			tell(spadEpoch, 0)
			_ = l.dev.RingPeer(sessionBit)
		}
		if hello := spad(spadHello); hello != 0 && hello != h.lastHello {
			l.end(h, ErrPeerRestarted)
			h.epoch, h.lastHello = nonZero32(), hello
			if err := l.layout.format(l.dev.InboundWindow()); err != nil {
				return up, err
			}
			tell(spadEcho, hello)
			tell(spadEpoch, h.epoch)
			_ = l.dev.RingPeer(sessionBit)
			l.logf("answered hello %#x with epoch %#x", hello, h.epoch)
		}
		if h.s == nil && h.epoch != 0 && spad(spadAck) == h.epoch {
			h.s = l.attach(h.epoch)
		}
	} else {
		if h.s != nil && h.s.Err() != nil {
			l.end(h, nil)
			h.nonce = 0
		}
		e := spad(spadEpoch)
		if h.s != nil && spad(spadEcho) == h.nonce && e != h.s.Epoch {
			l.end(h, ErrPeerRestarted)
			if e == 0 {
				h.nonce = 0
			}
		}
		if h.s == nil && h.nonce != 0 && spad(spadEcho) == h.nonce && e != 0 {
			if err := l.layout.format(l.dev.InboundWindow()); err != nil {
				return up, err
			}
			if h.s = l.attach(e); h.s != nil {
				tell(spadAck, e)
				_ = l.dev.RingPeer(sessionBit)
			}
		}
		if h.s == nil && (h.nonce == 0 || time.Since(h.helloAt) > l.cfg.HelloTimeout) {
			h.nonce, h.helloAt = nonZero32(), time.Now()
			tell(spadHello, h.nonce)
			_ = l.dev.RingPeer(sessionBit)
			l.logf("hello %#x", h.nonce)
		}
	}
	return up, nil
}

// wait sleeps until the session bit rings, the link changes, the session
// fails, the Link closes or a re-check is due, and reports whether to go
// on. WaitDoorbell notices link changes only from the moment it is
// called, so a change between the caller's look at the link and the call
// would be missed until the next doorbell: a device that can say when its
// link changes (ntb.LinkWatcher) is asked before the look, so every step
// of the handshake — the link coming up, each scratchpad write and its
// doorbell — wakes the wait at once, and the only timer is the follower's
// hello retry (retry, 0 for none). With any other device the wait also
// re-checks on a timer, frequently while there is no session, once a
// second with one. (A re-check costs more than a wake-up: a wait entered
// anew keeps the runtime's sysmon polling for 10 ms. An idle pair of
// processes spent ~0.25 % of a core on it.)
func (l *Link) wait(s *Session, up bool, retry time.Duration) bool {
	var changed <-chan struct{}
	period := recheck
	if w, ok := l.dev.(ntb.LinkWatcher); ok {
		changed, period = w.LinkChanged(), retry
	} else if s != nil {
		period = establishedRecheck
	}
	var ctx context.Context
	var cancel context.CancelFunc
	if period > 0 {
		ctx, cancel = context.WithTimeout(l.ctx, period)
	} else {
		ctx, cancel = context.WithCancel(l.ctx)
	}
	defer cancel()
	if s != nil {
		defer context.AfterFunc(s.ctx, cancel)()
	}
	if (l.dev.Link() == ntb.LinkUp) != up {
		return l.ctx.Err() == nil // changed since we looked: look again
	}
	if changed != nil {
		go func() {
			select {
			case <-changed:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	_, err := l.dev.WaitDoorbell(ctx, sessionBit)
	return l.ctx.Err() == nil && !errors.Is(err, ntb.ErrClosed)
}

// attach builds the session over the peer's window; nil if the peer's
// layout is unacceptable (the reason is logged and the handshake retried).
func (l *Link) attach(epoch uint32) *Session {
	peer, err := peerLayout(l.dev.OutboundWindow(), l.layout.Partitions)
	if err != nil {
		l.logf("attach epoch %#x: %v", epoch, err)
		return nil
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	s := &Session{Epoch: epoch, ctx: ctx, cancel: cancel}
	in, out := l.dev.InboundWindow(), l.dev.OutboundWindow()
	for i := range l.layout.Partitions + 1 {
		tx, err := ring.NewProducer(peer.Data(out, i), l.layout.Ctl(in, i))
		if err == nil {
			var rx *ring.Consumer
			rx, err = ring.NewConsumer(l.layout.Data(in, i), peer.Ctl(out, i))
			p := &Partition{Index: i, sess: s, dev: l.dev, tx: tx, rx: rx,
				dataBit: 1 << (2 * i), spaceBit: 1 << (2*i + 1)}
			if i < l.layout.Partitions {
				s.parts = append(s.parts, p)
			} else {
				s.control = p
			}
		}
		if err != nil {
			l.logf("attach epoch %#x partition %d: %v", epoch, i, err)
			return nil
		}
	}
	l.mu.Lock()
	l.cur = s
	l.mu.Unlock()
	l.logf("session %#x established, %d partitions of %d-byte rings", epoch, len(s.parts), peer.RingSize)
	if l.cfg.OnSession != nil {
		l.cfg.OnSession(s)
	}
	return s
}

// Session is one agreement between the two ends on the rings' state.
// Everything sent in a session is delivered in order within it, or the
// session fails for both ends.
type Session struct {
	Epoch   uint32
	parts   []*Partition
	control *Partition
	ctx     context.Context
	cancel  context.CancelCauseFunc
	dead    atomic.Bool // set under every ring lock; cheap to test on hot paths
}

// Partitions are the session's data ring pairs.
func (s *Session) Partitions() []*Partition { return s.parts }

// Control is the session's control ring pair, for flow-control signals.
func (s *Session) Control() *Partition { return s.control }

// Context is cancelled, with the session's error as cause, when it ends.
func (s *Session) Context() context.Context { return s.ctx }

// Done is closed when the session ends.
func (s *Session) Done() <-chan struct{} { return s.ctx.Done() }

// Err is why the session ended, or nil while it lives.
func (s *Session) Err() error {
	if s.ctx.Err() == nil {
		return nil
	}
	return context.Cause(s.ctx)
}

// Fail ends the session with cause (for example corruption found in a
// ring); the link then starts a new one. It may be called with ring locks
// held.
func (s *Session) Fail(cause error) { s.fail(cause) }

func (s *Session) fail(cause error) {
	if cause == nil {
		cause = ErrSessionEnded
	}
	if s.dead.CompareAndSwap(false, true) {
		s.cancel(cause)
	}
}

// quiesce waits until nobody is mid-operation on the session's rings.
// Ring operations test dead under their lock, so after quiesce nothing
// writes the peer's window again. Lock order is RX before TX, as in the
// layer above, which sends control frames while it consumes.
func (s *Session) quiesce() {
	for _, p := range append(s.parts[:len(s.parts):len(s.parts)], s.control) {
		p.rxMu.Lock()
		p.txMu.Lock()
		//lint:ignore SA2001 waiting out the holders is the point
		p.txMu.Unlock()
		p.rxMu.Unlock()
	}
}
