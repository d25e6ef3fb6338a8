package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
)

// Detaching a connection from its link, so that another carrier takes its
// stream over (socklike's direct mode moves to the proxies' path while its
// own link is down, see socklike/direct.go).
//
// Only a paused connection detaches: its session ended with hope, and no
// later session has adopted it. Endpoint.mu, under which a new session
// adopts the paused connections, is held while the connection is marked,
// so no session takes it over afterwards; the ended session's rings carry
// nothing more for it (as for a resume, the bytes they still held are not
// counted received and come again from the peer's retention).

// ErrMoved is wrapped by the errors of a detached connection: its stream
// goes on over another carrier. Read returns what arrived before the
// detach first.
var ErrMoved = errors.New("connection moved off its link")

// errNotPaused is Detach's error for a connection that is not paused.
var errNotPaused = errors.New("connection is not paused")

// Handover is what a detached connection leaves to the carrier that takes
// its stream over. Offsets count the connection's own stream bytes.
type Handover struct {
	// Received is how many of the peer's bytes this side took: Read still
	// returns every one of them (then an error wrapping ErrMoved), and the
	// peer must send again from here.
	Received int64
	// Sent is how many bytes this side sent; Acked how many of them the
	// peer holds for sure: its application read them, or (by reference,
	// see retention) it took them off the rings.
	Sent, Acked int64
	// Unacked is a copy of the bytes from Acked up to Sent: whatever the
	// peer says it received among them goes again over the new carrier.
	Unacked []byte
}

// From returns the bytes retained from offset received (the peer's
// Received) up to Sent, or an error if the peer claims a point outside
// what was retained.
func (h Handover) From(received int64) ([]byte, error) {
	if received < h.Acked || received > h.Sent {
		return nil, fmt.Errorf("peer received %d bytes, outside the retained %d..%d", received, h.Acked, h.Sent)
	}
	return h.Unacked[received-h.Acked:], nil
}

// errEnded is AwaitPause's error for a connection that ended first.
var errEnded = errors.New("connection ended")

// AwaitPause waits until the connection is paused with its session ended
// and no later session has adopted it, so that Detach takes it, and
// returns nil. It fails if the connection ends first (it failed, the
// peer closed it, or Close was called) or ctx ends. The end of a session
// and the end of the connection signal it, so it never polls; one
// goroutine at a time may wait (the session's signal wakes one).
func (c *Conn) AwaitPause(ctx context.Context) error {
	for {
		if c.detachable() {
			return nil
		}
		if c.Ended() {
			return fmt.Errorf("await pause of connection %d: %w", c.id, errEnded)
		}
		select {
		case <-c.pauseNote: // a signal since the look above waits in the channel
		case <-c.ended:
		case <-c.closedCh:
			return fmt.Errorf("await pause of connection %d: %w", c.id, net.ErrClosed)
		case <-ctx.Done():
			return fmt.Errorf("await pause of connection %d: %w", c.id, ctx.Err())
		}
	}
}

// detachable reports whether Detach would take the connection now.
func (c *Conn) detachable() bool {
	c.ep.mu.Lock()
	defer c.ep.mu.Unlock()
	return c.detachableLocked()
}

// detachableLocked is detachable with ep.mu held: the connection is
// paused in the ended session no later one has adopted.
func (c *Conn) detachableLocked() bool {
	st := c.ep.orphan
	return st != nil && c.pausedAt.Load() != 0 && st.lookup(c.id) == c
}

// Detach takes a paused connection off the endpoint for good and returns
// what its stream's new carrier needs. Blocked and later calls fail with
// an error wrapping ErrMoved once the bytes received before are read; the
// connection never resumes, and a RESUME of the peer's for it is answered
// with RESET. On a connection that is not paused Detach fails and changes
// nothing.
func (c *Conn) Detach() (Handover, error) {
	ep := c.ep
	ep.mu.Lock()
	if !c.detachableLocked() {
		ep.mu.Unlock()
		return Handover{}, fmt.Errorf("detach connection %d: %w", c.id, errNotPaused)
	}
	c.mu.Lock()
	ok := c.state == connEstablished && c.err == nil && !c.idFreed
	if ok {
		c.err = fmt.Errorf("%w: its stream goes on elsewhere", ErrMoved)
		c.endedLocked()
	}
	c.mu.Unlock()
	ep.mu.Unlock()
	if !ok {
		return Handover{}, fmt.Errorf("detach connection %d: %w", c.id, errNotPaused)
	}
	c.flags.Or(fFailed)
	var h Handover
	c.smu.Lock()
	h.Sent, h.Acked = c.sent.Load(), c.keep.from(c.peerRead.Load())
	h.Unacked = c.retainedLocked(h.Acked, h.Sent)
	c.resuming = true // no DATA goes out after this count (see serveOnce, sendNow)
	c.smu.Unlock()
	if int64(len(h.Unacked)) != h.Sent-h.Acked {
		return Handover{}, fmt.Errorf("detach connection %d: %d of its %d unacknowledged bytes retained", c.id, len(h.Unacked), h.Sent-h.Acked)
	}
	// As takeOver counts it: what is counted but still in the old rings
	// is lost with them.
	c.rxmu.Lock()
	lost := c.ringRest.Swap(0)
	for _, f := range c.held {
		if f.kind == kindData {
			lost += int64(len(f.payload))
		}
	}
	c.held = nil
	c.restWaits.Store(false)
	h.Received = c.recvd.Add(-lost)
	c.rxmu.Unlock()
	c.pausedAt.Store(0)
	c.wake(c.rnotify)
	c.wake(c.wnotify)
	c.abandon()
	ep.logf("connection %d detached: %d bytes received, %d sent, %d of them unacknowledged", c.id, h.Received, h.Sent, h.Sent-h.Acked)
	return h, nil
}

// retainedLocked copies the retained bytes from offset from up to to
// (c.smu held; peerRead ≤ from ≤ to ≤ sent); short if some are not
// retained.
func (c *Conn) retainedLocked(from, to int64) []byte {
	out := make([]byte, 0, to-from)
	for o := from; o < to; {
		b := c.keep.bytesAt(o, to)
		if len(b) == 0 {
			break
		}
		out = append(out, b...)
		o += int64(len(b))
	}
	return out
}
