// A leg's failover: the end of a transport, the reconnect over the
// route's next hop, the resume at both ends, and the move back to the NTB
// link when it returns (fail-forward).

package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/wire/appproto"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/ntb"
)

// fail handles the end of transport generation gen: the dialing side
// connects again, the other waits to be resumed.
func (l *leg) fail(gen uint64, err error) {
	l.mu.Lock()
	if l.closed || gen != l.gen {
		l.mu.Unlock()
		return
	}
	c, path, reset := l.cur, l.path, l.resetSent
	l.cur = nil
	l.gen++
	l.down = time.Now()
	l.cond.Broadcast()
	l.mu.Unlock()
	c.Close()
	if reset && closedByPeer(err) {
		l.close(nil) // the peer took the application's reset and ended the leg
		return
	}
	if closedByPeer(err) {
		// The peer's proxy closed the transport on purpose (its leg ended,
		// or it exited): nothing will resume this leg. A failing link or
		// path shows as ErrLinkDown, a timeout or a reset instead.
		l.close(fmt.Errorf("%s transport closed by the peer: %w", path, err))
		return
	}
	l.s.logf("leg %s/%d: %s transport failed: %v", l.key.from, l.key.token, path, err)
	if l.dialer {
		go l.reconnect()
		return
	}
	time.AfterFunc(legResumeWait, func() {
		l.mu.Lock()
		stuck := l.cur == nil && !l.closed
		l.mu.Unlock()
		if stuck {
			l.close(fmt.Errorf("not resumed within %v", legResumeWait))
		}
	})
}

// closedByPeer reports whether a transport error means the peer closed it.
func closedByPeer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.EPIPE)
}

// reconnect finds the leg a new transport among its hops — the NTB link
// if it is up, RDMA, TCP, in the route's order — until legResumeWait has
// passed.
func (l *leg) reconnect() {
	deadline := time.Now().Add(legResumeWait)
	for attempt := 0; time.Now().Before(deadline); attempt++ {
		if l.isClosed() {
			return
		}
		for _, h := range l.hops() {
			if err := l.resume(h, 250*time.Millisecond); err == nil {
				return
			} else if attempt == 0 {
				l.s.logf("leg %s/%d: resume over %s: %v", l.key.from, l.key.token, h.Path, err)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	l.close(fmt.Errorf("no transport to %s within %v", l.peer.Host, legResumeWait))
}

func (l *leg) isClosed() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.closed
}

// hops lists the transports to try, in the route's order: the NTB link
// only while it is up.
func (l *leg) hops() []ctlapi.Hop {
	var hs []ctlapi.Hop
	for _, h := range l.pc.hops {
		if h.Path != ctlapi.PathNTB || l.linkUp() {
			hs = append(hs, h)
		}
	}
	return hs
}

// linkUp reports whether the NTB link to the peer is up.
func (l *leg) linkUp() bool {
	link := l.s.links[l.peer.Host]
	return link != nil && link.ep.Device().Link() == ntb.LinkUp
}

// resume connects over h and moves the leg onto that transport.
func (l *leg) resume(h ctlapi.Hop, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(l.s.ctx, timeout)
	defer cancel()
	var c net.Conn
	var err error
	if h.Path == ctlapi.PathNTB {
		c, err = l.s.links[l.peer.Host].ep.DialContext(ctx, resumePort)
	} else {
		c, err = l.s.connect(ctx, l.peer.Host, h)
	}
	if err != nil {
		return err
	}
	// Stop using the current transport, if any (moving back to the NTB
	// link): from here on only the new one delivers. It is closed once the
	// peer has answered, so that the peer does not take its end for a
	// deliberate close first.
	l.mu.Lock()
	old := l.cur
	l.cur = nil
	l.gen++
	if l.down.IsZero() {
		l.down = time.Now()
	}
	l.mu.Unlock()
	if old != nil {
		defer old.Close()
	}
	l.dmu.Lock()
	rx := l.rxSeq
	l.dmu.Unlock()
	c.SetDeadline(time.Now().Add(requestTimeout))
	var reply appproto.DialReply
	err = appproto.WriteFrame(c, appproto.RackOpen{From: l.s.cfg.Host, Resume: l.key.token, RxSeq: rx, Secret: l.secret})
	if err == nil {
		err = appproto.ReadFrame(c, &reply)
	}
	if err == nil && reply.Code != ctlapi.OK {
		err = &ctlapi.Error{Code: reply.Code, Message: reply.Error}
	}
	if err != nil {
		c.Close()
		if ctlapi.CodeOf(err) == ctlapi.CodeRefused { // the peer has forgotten the leg
			l.close(err)
		}
		return err
	}
	c.SetDeadline(time.Time{})
	return l.install(c, h.Path, reply.RxSeq)
}

// accept is the other side of resume: c carries a RackOpen resuming this
// leg, which has received peerRx bytes.
func (l *leg) accept(c net.Conn, path string, peerRx uint64) error {
	l.mu.Lock()
	old := l.cur
	l.cur = nil
	l.gen++
	if l.down.IsZero() {
		l.down = time.Now()
	}
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return ctlapi.Errorf(ctlapi.CodeRefused, "connection %s/%d has ended", l.key.from, l.key.token)
	}
	if old != nil {
		old.Close()
	}
	l.dmu.Lock()
	rx := l.rxSeq
	l.dmu.Unlock()
	if err := appproto.WriteFrame(c, appproto.DialReply{RxSeq: rx}); err != nil {
		return err
	}
	c.SetDeadline(time.Time{})
	return l.install(c, path, peerRx)
}

// install makes c the transport: what the peer has not received is sent
// again, from peerRx on.
func (l *leg) install(c net.Conn, path string, peerRx uint64) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		c.Close()
		return net.ErrClosed
	}
	// The peer holds what it received (peerRx) but frees our memory only
	// as it delivers (acknowledgements), so that what waits for its
	// application never exceeds legMaxUnacked: resend from peerRx, keep
	// the rest until acknowledged.
	if peerRx < l.tx.base || peerRx > l.tx.end() {
		l.mu.Unlock()
		c.Close()
		err := fmt.Errorf("%w: peer resumes at %d, outside %d..%d", errLegProtocol, peerRx, l.tx.base, l.tx.end())
		l.close(err)
		return err
	}
	l.finSent = false // a FIN (or reset) is sent again: it may have been lost with the old transport
	l.resetSent = false
	// So is the last acknowledgement. Lost with the old transport, it
	// would not be repeated until another legAckEvery bytes were
	// delivered — and with both directions' buffers full and each
	// application waiting on the other (an echo), that never happens.
	if l.ackWanted > 0 {
		l.ackSent = 0
	}
	l.sent = peerRx
	from := l.path
	l.cur, l.path = c, path
	l.gen++
	gen := l.gen
	pause := time.Since(l.down)
	l.down = time.Time{}
	l.switches++
	l.s.pathSwitches.Add(1)
	l.lastPause = pause
	l.cond.Broadcast()
	l.busy.Add(1)
	l.mu.Unlock()
	l.s.logf("leg %s/%d: moved from %s to %s, paused %v", l.key.from, l.key.token, from, path, pause.Round(time.Microsecond))
	l.s.wg.Add(1)
	go func() { defer l.s.wg.Done(); defer l.busy.Done(); l.runRecv(c, gen) }()
	return nil
}

// runFailForward moves a leg that left the NTB link back onto it once the
// link is up again (if the NTB is among its hops).
func (l *leg) runFailForward() {
	if !slices.ContainsFunc(l.pc.hops, func(h ctlapi.Hop) bool { return h.Path == ctlapi.PathNTB }) {
		return
	}
	ntbHop := ctlapi.Hop{Path: ctlapi.PathNTB, Addr: l.peer.Link}
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-l.s.ctx.Done():
			return
		case <-t.C:
		}
		l.mu.Lock()
		closed, path, cur := l.closed, l.path, l.cur
		l.mu.Unlock()
		if closed {
			return
		}
		if cur != nil && path != ctlapi.PathNTB && l.linkUp() {
			if err := l.resume(ntbHop, time.Second); err != nil {
				l.s.logf("leg %s/%d: back to NTB: %v", l.key.from, l.key.token, err)
				l.mu.Lock()
				lost := l.cur == nil && !l.closed
				l.mu.Unlock()
				if lost {
					go l.reconnect()
				}
			}
		}
	}
}
