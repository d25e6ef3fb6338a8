package socklike

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/prim/spingate"
	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/appproto"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/qos"
)

// A direct connection whose dial opens a link over NTB begins on the
// proxied path and moves onto its link once that is up. Opening a link
// (its files, the far side's attach, the session handshake) and a first
// OPEN on it come after the proxies' exchange, each a wake-up of another
// process, so a dial that waited for them took several times a proxied
// dial. Instead, as soon as its proxy has granted the link (the pending
// grant), the dialer continues it through the proxies (DialRequest.
// Continue, the path a move to the fallback takes) beside the far side's
// verdict: each proxy holds the continuation until it has the grant on
// record, and the far application takes it once it has taken the link.
// With the verdict and the continuation back, the dial returns with the
// connection on that proxied connection. Then both ends open the link in
// the background (not before: the open's CPU would come out of the
// dial's exchanges, on the dialer's P and the far side's); when
// it is up, the dialer dials its port and the two move the stream
// onto it as from the fallback (back, direct.go): no byte lost, sent twice
// or reordered, the same Conn. Route says "direct", on the proxied path
// until the link is up; a link that does not come up leaves the
// connection there, and Route says why.
//
// The lease, the ACL check and the quota are the proxies' as for any
// direct dial: the grant comes first, the continuation is checked against
// it. A link that fails to open gives its lease (and quota) back at once.
// A connection that closes before its link is up leaves the link to
// finish opening and, on the dialing side, to wait DirectIdle for a later
// dial to the same address (directlink.go): its open is under way and
// paid for, and a client that dials a server once tends to dial it again
// (a connection a request, a pool refilling). A later dial that takes
// the link while it is still opening waits for the rest of its open.
//
// Same-host direct links have no proxied path to continue on (their
// fallback is not needed: no NTB link goes down under them) and open
// before their dial returns (openDirect).

// startReason begins the reason of a connection on its proxied path while
// its direct link opens.
const startReason = "on the proxied path until its direct link is up; "

// startDirect is dialOn's part for a pending grant of a new link over NTB
// (side 0): it continues the link through the proxies beside the verdict
// it reads from lease, returns the connection on that path, and leaves
// the link to open behind it.
func (p *Proxy) startDirect(ctx context.Context, dl *appproto.DirectLink, lease *transport.Conn, address string, class qos.Class, route Route) (*Conn, error) {
	if dl.Window <= 0 || dl.Name == "" || dl.Stream != 0 {
		return nil, fmt.Errorf("%w: direct link %+v", ErrProxy, *dl)
	}
	l := p.newPendingLink(dl.Name, 0, address, lease)
	abandon := func(err error) (*Conn, error) {
		l.opened(nil, nil, err)
		l.drop()
		return nil, err
	}
	// The continuation goes at once, beside the verdict: both proxies
	// hold it until the grant is on record (or refused).
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type continued struct {
		c   *Conn
		err error
	}
	contc := make(chan continued, 1)
	go func() {
		fc, err := p.dialOnce(cctx, address, dialOpts{class: class, cont: dl.Name})
		contc <- continued{fc, err}
	}()
	verdict := awaitVerdict(ctx, lease)
	if verdict != nil {
		cancel()
		go func() {
			if r := <-contc; r.c != nil {
				r.c.Close()
			}
		}()
		return abandon(verdict)
	}
	r := <-contc
	fc, err := r.c, r.err
	if err != nil {
		return abandon(fmt.Errorf("direct link %s: the proxied path to begin on: %w", dl.Name, err))
	}
	d := p.newDirectOn(l, 0, nil, &carrier{c: fc.c, fb: true}, lease, class)
	d.starting = true
	d.fallback = &Route{Path: fc.route.Path, Mode: "direct", Reason: startReason + route.Reason}
	go d.openBehind(dl, spingate.Await())
	go d.moveOnto(dl, route.Reason)
	return &Conn{d: d}, nil
}

// openBehind opens this end of d's link, dl, once the connection is on
// the proxied path: earlier, the open would take the CPU (the files, the
// mappings, the far side's attach) from the dial's exchanges, on this
// process's P and the far side's. On side 1 the link's first stream
// listens on it at once. done runs when d has moved onto the link, or
// will not.
func (d *directConn) openBehind(dl *appproto.DirectLink, done func()) {
	l := d.link
	ep, err := d.p.openEnd(dl, l.side)
	var ln *transport.Listener
	if err == nil && l.side == 1 {
		if ln, err = ep.Listen(appproto.DirectPort); err != nil {
			ep.Close()
			ep = nil
		}
	}
	l.opened(ep, ln, err)
	d.awaitStarted(done)
}

// openEnd opens side's end of direct link dl.
func (p *Proxy) openEnd(dl *appproto.DirectLink, side int) (*transport.Endpoint, error) {
	ep, err := transport.Open(dl.Name, transport.Config{SpinBudget: p.cfg.SpinBudget, Window: p.cfg.Window, MTU: p.cfg.MTU, Sockets: p.cfg.Sockets,
		Fabric: shm.Options{Dir: dl.Dir, WindowSize: dl.Window, Side: shm.Side0 + shm.Side(side), HeartbeatTimeout: appproto.LinkHeartbeatTimeout}})
	if err != nil {
		return nil, fmt.Errorf("direct link %s: %w", dl.Name, err)
	}
	return ep, nil
}

// moveOnto waits until side 0's link is up, dials the stream's port on
// it and moves the stream there; if the link does not come up, the
// stream stays on the proxied path. reason is the direct route's.
func (d *directConn) moveOnto(dl *appproto.DirectLink, reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), moveTimeout)
	defer cancel()
	ep, err := d.link.endpoint(ctx)
	var nc *transport.Conn
	if err == nil {
		nc, err = d.dialUp(ctx, ep)
		// Both ends hold the link now, or it failed: its files go
		// (ntproxy removes them too, but may have done so before this
		// end made them).
		shm.Remove(dl.Dir, dl.Name)
	}
	if errors.Is(err, errClosedEarly) {
		return // the link stays for a later dial (see above)
	}
	if err == nil {
		d.moveMu.Lock()
		moved := d.back(nc)
		d.moveMu.Unlock()
		if moved {
			return
		}
		d.mu.Lock()
		closed := d.closed
		d.mu.Unlock()
		if closed {
			return // the link stays for a later dial (see above)
		}
		err = errors.New("the move onto it failed")
	}
	d.notUp(err, reason)
	d.link.close() // its lease, and the quota on it, go now
}

// errClosedEarly ends dialUp for a connection that closed before its
// link came up: there is nothing left to move, and the far side, closed
// too, no longer listens on the port.
var errClosedEarly = errors.New("the connection closed before its link came up")

// dialUp dials d's port on a link whose far side listens on it once its
// endpoint has opened: a dial that reaches it a moment before is refused,
// and is made again, until d closes.
func (d *directConn) dialUp(ctx context.Context, ep *transport.Endpoint) (*transport.Conn, error) {
	for wait := 50 * time.Microsecond; ; wait = min(2*wait, 5*time.Millisecond) {
		nc, err := ep.DialContext(ctx, d.port)
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nc, err
		}
		d.mu.Lock()
		closed, changed := d.closed, d.changed
		d.mu.Unlock()
		if closed {
			return nil, errClosedEarly
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-changed:
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return nil, err
		}
	}
}

// notUp records that the stream stays on the proxied path it began on,
// its link not up for err; reason is the direct route's.
func (d *directConn) notUp(err error, reason string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.starting || d.closed {
		return
	}
	d.starting = false
	d.fallback = &Route{Path: d.fallback.Path, Mode: "proxy", Reason: fmt.Sprintf("direct link %s did not come up (%v): through the proxies; %s", d.link.name, err, reason)}
	d.bumpLocked()
	d.logf("direct link %s did not come up, the connection stays on the proxied path: %v", d.name, err)
}

// acceptStart is openDirect for side 1 of a new link over NTB: it opens
// the link's end in the background, tells ntproxy it takes the link, and
// returns the connection once the dialer's continuation through the
// proxies has come (within ctx), on that path. route is the direct
// connection's.
func (p *Proxy) acceptStart(ctx context.Context, dl *appproto.DirectLink, lease *transport.Conn, route Route) (*Conn, error) {
	if dl.Window <= 0 || dl.Name == "" {
		return nil, fmt.Errorf("%w: direct link %+v", ErrProxy, *dl)
	}
	l := p.newPendingLink(dl.Name, 1, "", lease)
	ch := make(chan *transport.Conn, 1)
	p.mu.Lock()
	if p.starts == nil {
		p.starts = map[string]chan *transport.Conn{}
	}
	p.starts[dl.Name] = ch
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.starts, dl.Name)
		p.mu.Unlock()
	}()
	var f *transport.Conn
	_, err := lease.Write([]byte{appproto.DirectReady})
	if err == nil {
		select {
		case f = <-ch:
		case <-ctx.Done():
			err = fmt.Errorf("no continuation through the proxies came: %w", dialErr(ctx.Err()))
		}
	}
	if err != nil {
		err = fmt.Errorf("direct link %s: %w", dl.Name, err)
		l.opened(nil, nil, err)
		l.drop()
		return nil, err
	}
	d := p.newDirectOn(l, 0, nil, &carrier{c: f, fb: true}, lease, f.Priority())
	d.starting = true
	d.fallback = &Route{Path: route.Path, Mode: "direct", Reason: startReason + route.Reason}
	go d.openBehind(dl, spingate.Await())
	go d.acceptOnto(route.Reason)
	return &Conn{d: d}, nil
}

// started hands continuation f of link name to the side 1 waiting for it
// in acceptStart, and reports whether one was.
func (p *Proxy) started(name string, f *transport.Conn) bool {
	p.mu.Lock()
	ch := p.starts[name]
	p.mu.Unlock()
	if ch == nil {
		return false
	}
	select {
	case ch <- f:
		return true
	default:
		return false
	}
}

// acceptOnto waits until side 1's link is up and takes the stream onto
// it when side 0 dials it (runAccept). reason is the direct route's.
func (d *directConn) acceptOnto(reason string) {
	ctx, cancel := context.WithTimeout(context.Background(), moveTimeout)
	_, err := d.link.endpoint(ctx)
	cancel()
	if err != nil {
		d.notUp(err, reason)
		return
	}
	d.mu.Lock()
	closed := d.closed
	if !closed {
		d.ln = d.link.ln0
	}
	d.mu.Unlock()
	if closed {
		d.link.ln0.Close()
		return
	}
	d.runAccept()
	d.notUp(errors.New("it closed before the connection moved onto it"), reason)
}

// awaitStarted runs done once d has left the proxied path it began on
// (or closed, or will not leave it), or after moveTimeout.
func (d *directConn) awaitStarted(done func()) {
	defer done()
	t := time.NewTimer(moveTimeout)
	defer t.Stop()
	for {
		d.mu.Lock()
		starting, closed, ch := d.starting, d.closed, d.changed
		d.mu.Unlock()
		if !starting || closed {
			return
		}
		select {
		case <-ch:
		case <-t.C:
			return
		}
	}
}

// settle reads the back mark that ends fallback cur once the application
// has read everything before it (end: the peer's stream offset at the
// mark), so that the fallback closes now rather than at the next Read. A
// Read under way reads the mark itself.
func (d *directConn) settle(cur *carrier, end int64) {
	if !d.rlock.TryLock() {
		return
	}
	defer d.rlock.Unlock()
	d.mu.Lock()
	first := d.reads[0] == cur && !cur.rdone
	d.mu.Unlock()
	if !first || cur.rbase+cur.read != end || cur.left != 0 || cur.eof {
		return
	}
	cur.c.SetReadDeadline(time.Now().Add(moveTimeout))
	defer cur.c.SetReadDeadline(cur.rdl)
	for cur.hn < len(cur.hbuf) {
		n, err := cur.c.Read(cur.hbuf[cur.hn:])
		cur.hn += n
		if err != nil {
			return // the next Read sees it
		}
	}
	cur.hn = 0
	switch l := binary.LittleEndian.Uint32(cur.hbuf[:]); l {
	case fbBack:
		d.mu.Lock()
		cur.rdone = true
		d.leftLocked(cur)
		d.mu.Unlock()
	case fbFin:
		cur.eof = true
	default:
		cur.left = int(l)
	}
}
