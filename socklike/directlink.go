package socklike

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/prim/spingate"
	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/appproto"
	"github.com/ntstack/ntstack/internal/wire/errcode"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/shm"
)

// A direct link carries the direct connections between two applications,
// each a stream of the link: stream 0 is the connection whose dial opened
// it, stream k > 0 a later one, on the link's port appproto.StreamPort(k).
// Opening a link (its files, the session handshake) costs a dial more than
// the proxies' exchange does. So the dialing side keeps the links a dial
// to an address opened, and a later dial to that address takes one that
// carries no open connection (a lingering one, closed by this side and
// not yet by the peer, may still be on it): its dial is the proxies'
// exchange and an OPEN on the live link. Connections open at the same time
// keep a link each, so a workload of many connections has the data path,
// the rings and the quota it has without the reuse. The proxies still
// authorize each dial and hold its lease, and every stream moves to the
// fallback and back on its own (direct.go), named by appproto.StreamName.
//
// The lease of stream 0's dial is the link's: ntproxy holds the link's
// quota on it, and it lasts as long as the link, after stream 0 has
// closed. The dialing side keeps a link with no streams for p.linkIdle
// (Config.DirectIdle), and at most maxIdleLinks of them an address, then
// closes it and its lease; the accepting side closes its end once the
// peer has closed its own (or gone). A link whose peer went, whose lease
// ended or that refused a stream takes no more streams and closes with
// its last.
//
// Locks: a directLink's mu and the Proxy's are never held together; a
// directConn's may be held while a link's is taken.

// defaultLinkIdle is how long the dialing side keeps a direct link that
// carries no connection (Config.DirectIdle): a client that dials the same
// server again soon (a connection per request, a pool refilling) finds
// it; one that does not returns its window to the quota after this.
const defaultLinkIdle = 5 * time.Second

// maxIdleLinks bounds the idle links kept for one address: after a burst
// of connections closes, a few links wait for the next dials and the rest
// return their windows to the quota at once.
const maxIdleLinks = 4

// directLink is one side of a direct link and its streams.
type directLink struct {
	p     *Proxy
	name  string
	side  int
	key   string          // side 0: the address dialed, its key in p.dialLinks
	lease *transport.Conn // the link's lease (stream 0's dial)
	done  chan struct{}   // closed when the link starts closing
	shut  chan struct{}   // closed when it has closed

	// ready is closed once the link's endpoint has opened or failed to
	// (directstart.go): ep (nil if it failed, openErr why) and ln0 are
	// read only after it.
	ready   chan struct{}
	ep      *transport.Endpoint
	ln0     *transport.Listener // side 1, opened behind its first connection: the listener on DirectPort
	openErr error
	wasUp   atomic.Bool // ep's link has been seen up (mayBeUp, runWatch)

	mu sync.Mutex
	// mu protects the following fields.
	streams int  // streams not yet ended (closed by both ends, or failed)
	open    int  // side 0: streams not yet closed by the application
	next    int  // side 0: the last stream number handed out
	dead    bool // takes no more streams; closes with its last
	closed  bool
	idle    *time.Timer
}

// newLink registers side's end of direct link name, open on ep, with one
// stream (0); key is the address side 0 dialed.
func (p *Proxy) newLink(name string, side int, key string, ep *transport.Endpoint, lease *transport.Conn) *directLink {
	l := p.newPendingLink(name, side, key, lease)
	l.opened(ep, nil, nil)
	return l
}

// newPendingLink is newLink for a link whose endpoint is still to open:
// opened gives it.
func (p *Proxy) newPendingLink(name string, side int, key string, lease *transport.Conn) *directLink {
	l := &directLink{p: p, name: name, side: side, key: key, lease: lease, done: make(chan struct{}), shut: make(chan struct{}), ready: make(chan struct{}), streams: 1, open: 1}
	var old *directLink
	p.mu.Lock()
	if side == 0 {
		if p.dialLinks == nil {
			p.dialLinks = map[string][]*directLink{}
		}
		p.dialLinks[key] = append(p.dialLinks[key], l)
	} else {
		if p.acceptLinks == nil {
			p.acceptLinks = map[string]*directLink{}
		}
		old = p.acceptLinks[name]
		p.acceptLinks[name] = l
	}
	p.mu.Unlock()
	if old != nil {
		old.retire()
	}
	return l
}

// opened gives the link its endpoint ep (and side 1's listener ln on
// DirectPort, if the endpoint opened behind the link's first connection),
// or the error that kept it from opening: then the link takes no more
// streams, and gives its lease back at once (the quota it holds), and its
// streams stay where they are, on the proxied path.
func (l *directLink) opened(ep *transport.Endpoint, ln *transport.Listener, err error) {
	l.ep, l.ln0, l.openErr = ep, ln, err
	close(l.ready)
	if err != nil {
		l.close()
		return
	}
	go l.runWatch()
}

// endpoint waits until the link has opened and returns its endpoint.
func (l *directLink) endpoint(ctx context.Context) (*transport.Endpoint, error) {
	select {
	case <-l.ready:
	case <-ctx.Done():
		return nil, fmt.Errorf("direct link %s: %w", l.name, dialErr(ctx.Err()))
	}
	if l.ep == nil {
		return nil, fmt.Errorf("direct link %s did not open: %w", l.name, l.openErr)
	}
	return l.ep, nil
}

// mayBeUp reports whether the link is up or still opening. Its open ends
// when the link first comes up: after this end's endpoint has opened, the
// far end's attach and the session are still to come, and a link between
// those is as good for a later dial as one whose files are being made.
// Down after it was up (its NTB link pulled, its peer gone), it is not:
// the device then says why (a cause; a down link's cause is none only
// before its first up), and wasUp covers a device that could not tell.
func (l *directLink) mayBeUp() bool {
	select {
	case <-l.ready:
	default:
		return true
	}
	if l.ep == nil {
		return false
	}
	dev := l.ep.Device()
	if dev.Link() == ntb.LinkUp {
		l.wasUp.Store(true)
		return true
	}
	lv, ok := dev.(ntb.Liveness)
	return ok && !l.wasUp.Load() && lv.LinkCause() == ntb.CauseNone
}

// endpointNow is the link's endpoint; nil while it opens, or if it did not.
func (l *directLink) endpointNow() *transport.Endpoint {
	select {
	case <-l.ready:
		return l.ep
	default:
		return nil
	}
}

// reuse returns one of side 0's live links to address that carries no
// open connection, and the number of a new stream on it; nil if there is
// none.
func (p *Proxy) reuse(address string) (*directLink, int) {
	if p.linkIdle < 0 {
		return nil, 0 // every dial opens a link of its own
	}
	p.mu.Lock()
	links := append([]*directLink(nil), p.dialLinks[address]...)
	p.mu.Unlock()
	for i := len(links) - 1; i >= 0; i-- { // the newest first
		l := links[i]
		// A link still opening takes the stream too: its dial waits for
		// the rest of the open, which is under way, not a new one.
		if !l.mayBeUp() {
			continue
		}
		l.mu.Lock()
		free := l.open == 0
		l.mu.Unlock()
		if free {
			if k := l.take(); k > 0 {
				return l, k
			}
		}
	}
	return nil, 0
}

// take returns the number of a new stream on side 0's link l, 0 if it
// takes none.
func (l *directLink) take() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead || l.closed || l.next >= appproto.MaxStream {
		return 0
	}
	l.next++
	l.streams++
	l.open++
	if l.idle != nil {
		l.idle.Stop()
		l.idle = nil
	}
	return l.next
}

// lookup returns side 1's link name with a stream more on it; nil if
// there is none that takes one.
func (p *Proxy) lookup(name string) *directLink {
	p.mu.Lock()
	l := p.acceptLinks[name]
	p.mu.Unlock()
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead || l.closed {
		return nil
	}
	l.streams++
	l.open++
	return l
}

// closedOne is told that the application closed one of l's streams: a later
// dial may take the link.
func (l *directLink) closedOne() {
	l.mu.Lock()
	l.open--
	l.mu.Unlock()
}

// drop gives back a stream that never became a connection.
func (l *directLink) drop() {
	l.closedOne()
	l.release()
}

// release ends a stream's hold on the link.
func (l *directLink) release() {
	l.mu.Lock()
	if l.streams--; l.streams > 0 || l.closed {
		l.mu.Unlock()
		return
	}
	trim := false
	switch {
	case l.dead || l.side == 0 && l.p.linkIdle < 0:
		l.dead = true
		go l.close()
	case l.side == 0:
		l.idle = time.AfterFunc(l.p.linkIdle, l.expire)
		trim = true
	}
	l.mu.Unlock()
	if trim {
		l.p.trimIdle(l.key)
	}
}

// trimIdle retires the oldest idle links to address beyond maxIdleLinks.
func (p *Proxy) trimIdle(address string) {
	p.mu.Lock()
	links := append([]*directLink(nil), p.dialLinks[address]...)
	p.mu.Unlock()
	var idle []*directLink
	for _, l := range links {
		l.mu.Lock()
		if l.streams == 0 && !l.dead {
			idle = append(idle, l)
		}
		l.mu.Unlock()
	}
	for len(idle) > maxIdleLinks {
		idle[0].retire()
		idle = idle[1:]
	}
}

// expire closes a link that stayed idle for p.linkIdle.
func (l *directLink) expire() {
	l.mu.Lock()
	idle := l.streams == 0 && !l.closed && l.idle != nil
	if idle {
		l.dead = true // take gives no stream of it from now
	}
	l.mu.Unlock()
	if idle {
		l.close()
	}
}

// retire takes the link out of use: it takes no more streams and closes
// with its last.
func (l *directLink) retire() {
	l.mu.Lock()
	l.dead = true
	idle := l.streams == 0 && !l.closed
	l.mu.Unlock()
	if idle {
		l.close()
	}
}

// close closes the link's endpoint (ending any stream still on it) and
// its lease, and returns once they are closed (by this call or another).
func (l *directLink) close() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		<-l.shut
		return
	}
	l.closed, l.dead = true, true
	if l.idle != nil {
		l.idle.Stop()
	}
	close(l.done)
	l.mu.Unlock()
	defer close(l.shut)
	<-l.ready // an open under way ends first (its time is bounded)
	if l.ep != nil {
		l.ep.Close()
	}
	l.lease.Close()
	p := l.p
	p.mu.Lock()
	if l.side == 0 {
		links := p.dialLinks[l.key]
		for i, o := range links {
			if o == l {
				links = append(links[:i:i], links[i+1:]...)
				break
			}
		}
		if len(links) == 0 {
			delete(p.dialLinks, l.key)
		} else {
			p.dialLinks[l.key] = links
		}
	} else if p.acceptLinks[l.name] == l {
		delete(p.acceptLinks, l.name)
	}
	p.mu.Unlock()
}

// runWatch retires the link once its peer has gone: closed its end,
// exited or gone silent past the link's timeout. A link down for another
// reason (the NTB link under it, on the emulated fabric forced to follow
// it) comes back with it.
func (l *directLink) runWatch() {
	dev := l.ep.Device()
	w, ok := dev.(ntb.LinkWatcher)
	lv, _ := dev.(ntb.Liveness)
	if !ok || lv == nil {
		return
	}
	for {
		ch := w.LinkChanged()
		if dev.Link() == ntb.LinkUp {
			l.wasUp.Store(true)
		} else {
			switch lv.LinkCause() {
			case ntb.CauseClosed, ntb.CauseGone, ntb.CauseSilent:
				l.retire()
				return
			}
		}
		select {
		case <-ch:
		case <-l.done:
			return
		}
	}
}

// retireLinks retires every direct link of the Proxy: the idle ones
// close, the others with their last connection (which, as a connection
// of its own link, outlives the Proxy).
func (p *Proxy) retireLinks() {
	for _, l := range p.allLinks() {
		l.retire()
	}
}

// allLinks lists the Proxy's direct links.
func (p *Proxy) allLinks() []*directLink {
	p.mu.Lock()
	defer p.mu.Unlock()
	var all []*directLink
	for _, links := range p.dialLinks {
		all = append(all, links...)
	}
	for _, l := range p.acceptLinks {
		all = append(all, l)
	}
	return all
}

// openDirect attaches side (0: dial, 1: listen) of a direct link and
// returns its connection, stream 0 of the link; closing that connection
// closes the link's endpoint and the lease once the peer has closed too
// and (side 0) the link has been idle for p.linkIdle. pending (side 0):
// the grant came before the far side was brought in, and the verdict is
// still to come on the lease (see dialEarly). address (side 0) is the
// address dialed, under which later dials find the link.
func (p *Proxy) openDirect(ctx context.Context, dl *appproto.DirectLink, side int, lease *transport.Conn, pending bool, address string) (*Conn, error) {
	if dl.Stream != 0 {
		if side == 0 {
			return nil, fmt.Errorf("%w: stream %d of direct link %s granted unasked", ErrProxy, dl.Stream, dl.Name)
		}
		return p.openStream(dl, lease)
	}
	if dl.Window <= 0 || dl.Name == "" {
		return nil, fmt.Errorf("%w: direct link %+v", ErrProxy, *dl)
	}
	// The link's meeting, session handshake and dial wake this process
	// through the runtime's poller (the link's FIFOs, its socket).
	defer spingate.Await()()
	ep, err := transport.Open(dl.Name, transport.Config{SpinBudget: p.cfg.SpinBudget, Window: p.cfg.Window, MTU: p.cfg.MTU, Sockets: p.cfg.Sockets,
		Fabric: shm.Options{Dir: dl.Dir, WindowSize: dl.Window, Side: shm.Side0 + shm.Side(side), HeartbeatTimeout: appproto.LinkHeartbeatTimeout}})
	if err != nil {
		return nil, fmt.Errorf("direct link %s: %w", dl.Name, err)
	}
	var dc *transport.Conn
	var ln *transport.Listener // side 1's, kept for the way back from the fallback
	if side == 0 {
		var verdict error
		if pending {
			dc, verdict, err = dialEarly(ctx, ep, lease)
		} else {
			dc, err = ep.DialContext(ctx, appproto.DirectPort)
		}
		// Both ends hold the link now, or it failed: its files go (ntproxy
		// removes them too, but may have done so before this end made
		// them).
		shm.Remove(dl.Dir, dl.Name)
		if verdict != nil {
			ep.Close()
			return nil, verdict
		}
	} else if ln, err = ep.Listen(appproto.DirectPort); err == nil {
		if _, err = lease.Write([]byte{appproto.DirectReady}); err == nil {
			dc, err = acceptWithin(ln, 10*time.Second)
		}
	}
	if err != nil {
		ep.Close()
		return nil, fmt.Errorf("direct link %s: %w", dl.Name, err)
	}
	l := p.newLink(dl.Name, side, address, ep, lease)
	return &Conn{d: p.newDirect(l, 0, ln, dc, lease)}, nil
}

// openStream is openDirect for side 1 of stream dl.Stream of a live
// link: it finds the link by name, listens on the stream's port and says
// so on the stream's lease.
func (p *Proxy) openStream(dl *appproto.DirectLink, lease *transport.Conn) (*Conn, error) {
	k := dl.Stream
	if k < 1 || k > appproto.MaxStream {
		return nil, fmt.Errorf("%w: direct link %+v", ErrProxy, *dl)
	}
	l := p.lookup(dl.Name)
	if l == nil {
		return nil, fmt.Errorf("%w: no direct link %s for stream %d", ErrProxy, dl.Name, k)
	}
	ctx, cancel := context.WithTimeout(context.Background(), moveTimeout)
	ep, err := l.endpoint(ctx)
	cancel()
	var ln *transport.Listener
	if err == nil {
		ln, err = ep.Listen(appproto.StreamPort(k))
	}
	var dc *transport.Conn
	if err == nil {
		if _, err = lease.Write([]byte{appproto.DirectReady}); err == nil {
			dc, err = acceptWithin(ln, 10*time.Second)
		}
		if err != nil {
			ln.Close()
		}
	}
	if err != nil {
		l.drop()
		return nil, fmt.Errorf("direct link %s stream %d: %w", dl.Name, k, err)
	}
	return &Conn{d: p.newDirect(l, k, ln, dc, lease)}, nil
}

// dialStream dials stream k of side 0's link l, which ntproxy granted on
// lease: the far side listens on its port.
func (p *Proxy) dialStream(ctx context.Context, l *directLink, k int, lease *transport.Conn) (*Conn, error) {
	ep, err := l.endpoint(ctx)
	var dc *transport.Conn
	if err == nil {
		dc, err = ep.DialContext(ctx, appproto.StreamPort(k))
	}
	if err != nil {
		return nil, fmt.Errorf("direct link %s stream %d: %w", l.name, k, err)
	}
	return &Conn{d: p.newDirect(l, k, nil, dc, lease)}, nil
}

// awaitVerdict reads the far side's verdict on a pending grant from its
// lease: nil if it took the link, else why not.
func awaitVerdict(ctx context.Context, lease *transport.Conn) error {
	var reply appproto.DialReply
	switch err := await(ctx, lease, &reply); {
	case err != nil:
		return err
	case reply.Code != errcode.OK:
		return codeErr(reply.Code, reply.Error)
	case reply.Pending:
		return fmt.Errorf("%w: a second pending reply", ErrProxy)
	}
	return nil
}

// dialEarly dials the direct link of a pending grant while ntproxy
// brings in the far side, and reads the verdict from lease meanwhile: the
// link's session and the dial overlap the proxies' exchange. A dial that
// reaches the far side before it listens is refused; the far side listens
// before its proxy answers, so that dial is made again once the verdict
// is OK. A failed verdict comes back as verdict (the dial is dropped).
func dialEarly(ctx context.Context, ep *transport.Endpoint, lease *transport.Conn) (dc *transport.Conn, verdict, err error) {
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		c   *transport.Conn
		err error
	}
	dialed := make(chan result, 1)
	go func() {
		c, err := ep.DialContext(dctx, appproto.DirectPort)
		dialed <- result{c, err}
	}()
	verdict = awaitVerdict(ctx, lease)
	if verdict != nil {
		cancel()
		if r := <-dialed; r.c != nil {
			r.c.Close()
		}
		return nil, verdict, nil
	}
	r := <-dialed
	if errors.Is(r.err, syscall.ECONNREFUSED) {
		r.c, r.err = ep.DialContext(ctx, appproto.DirectPort)
	}
	return r.c, nil, r.err
}

func acceptWithin(ln *transport.Listener, d time.Duration) (*transport.Conn, error) {
	t := time.AfterFunc(d, func() { ln.Close() })
	defer t.Stop()
	return ln.AcceptConn()
}

// lingerMax bounds linger's wait for a peer that never closes.
const lingerMax = time.Minute

// linger waits until the peer has closed its end of c too (or the link
// died), so that what was written before Close is delivered, then runs
// done.
func linger(c *transport.Conn, done func()) {
	ctx, cancel := context.WithTimeout(context.Background(), lingerMax)
	c.AwaitEnd(ctx)
	cancel()
	done()
}

// runContinue takes the connections ntproxy opens on PortContinue to carry
// on direct connections, each introduced by an Incoming frame.
func (p *Proxy) runContinue(ln *transport.Listener) {
	for {
		c, err := ln.AcceptConn()
		if err != nil {
			return
		}
		go func() {
			var in appproto.Incoming
			c.SetReadDeadline(time.Now().Add(moveTimeout))
			err := appproto.ReadFrame(c, &in)
			c.SetReadDeadline(time.Time{})
			if err != nil || in.Continue == "" {
				c.Close()
				return
			}
			p.continued(in.Continue, c, Route{Path: in.Path, Mode: "proxy", Reason: in.Reason})
		}()
	}
}

// continued hands fallback f of direct link name to its connection.
func (p *Proxy) continued(name string, f *transport.Conn, route Route) {
	if p.started(name, f) {
		return
	}
	p.mu.Lock()
	d := p.directs[name]
	p.mu.Unlock()
	if d == nil {
		f.Close()
		return
	}
	d.fromFallback(f, route)
}

// force sets the direct link's emulated state to follow the NTB link
// under it (on hardware it follows by itself).
func (l *directLink) force(down bool) {
	ep := l.endpointNow()
	if ep == nil {
		return // not open yet; an emulated link that opens meanwhile follows from the next change
	}
	f, ok := ep.Device().(interface {
		ForceLinkDown()
		ForceLinkUp()
	})
	switch {
	case !ok:
	case down:
		f.ForceLinkDown()
	default:
		f.ForceLinkUp()
	}
}
