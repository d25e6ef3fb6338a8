package socklike

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/appproto"
	"github.com/ntstack/ntstack/qos"
)

// A direct-mode connection that survives its link (DESIGN.md invariant
// 9). Its stream runs over a sequence of carriers: the direct link's
// connection, and while that link is down a proxied connection through
// the two ntproxies (the fallback), then a new connection on the direct
// link once it is back. The application keeps the same Conn.
//
// ntproxy writes appproto.LeaseLinkDown and LeaseLinkUp on the lease as
// the NTB link under the direct link goes down and comes back (on the
// emulated fabric the application then forces its direct link's state to
// match: on hardware a direct link is a slice of that link's window). The
// dialing end moves the connection; the accepting end follows.
//
// To the fallback. The direct connection pauses with its link
// (transport's resume). The dialer asks its ntproxy for a proxied
// connection continuing the direct link (DialRequest.Continue), which the
// far ntproxy hands to the acceptor. Each end detaches its paused direct
// connection (transport.Conn.Detach): what it received stays readable,
// and it learns the bytes it sent that the peer may lack. Each tells the
// other its received stream offset (8 bytes, little-endian) and sends
// again from the peer's offset, from its retained bytes, then new writes:
// nothing lost, nothing twice.
//
// Back. With the link up the dialer dials a new connection on it and the
// acceptor accepts it; each writes on it the stream offset its writes
// continue from and reads the peer's, then writes the back mark on the
// fallback and writes on the direct link from then on. A reader reads the
// fallback up to the peer's back mark, then the direct link. The
// fallback is reliable and in order, so nothing is retained for this move.
//
// The fallback carries frames: a 4-byte little-endian length and that
// many stream bytes; length fbBack is the back mark, fbFin the end of the
// stream (CloseWrite).
//
// The end. Close closes every carrier; the peer reads on, past the back
// marks, to the one this side wrote on last and the end there. Abort ends
// that one with a reset instead (transport.Conn.Abort; through the
// proxies each ntproxy's leg passes it on as one), and so does a move
// that finds the connection closed once it has sent on its new carrier:
// the peer's Reads fail with ECONNRESET once it has read what came
// before. A reset lost with a link's session goes again when the
// connection, lingering for the peer's end, resumes on the next.

const (
	fbBack  = 0
	fbFin   = 1<<32 - 1
	fbFrame = 64 << 10 // the most stream bytes a fallback frame carries
	hdrLen  = 8        // a stream offset

	// moveTimeout bounds each step of a move (a dial, a handshake).
	moveTimeout = 10 * time.Second
)

// errBack is a carrier's end: the stream goes on over the next one.
var errBack = errors.New("stream continues on the next carrier")

// carrier is one stretch of a direct connection's stream.
type carrier struct {
	c  *transport.Conn
	fb bool // the fallback: framed
	// Stream offsets are the carrier's own plus these: of the bytes this
	// side writes on it and of those it reads from it.
	wbase, rbase int64

	// Writer's, under directConn.wmu.
	wrote int64  // fallback: stream bytes written
	owe   int    // fallback: bytes the frame being written still owes
	hdr   []byte // fallback: the part of a frame header not yet written

	// Reader's, under directConn.rlock.
	left int     // fallback: bytes of the current frame not yet read
	read int64   // fallback: stream bytes read
	hbuf [4]byte // fallback: a frame header being read
	hn   int
	eof  bool // the stream ended on this carrier

	// Under directConn.mu (leftLocked reads both), each written by one
	// side: the reader (under rlock too) and the writer have left it for
	// the next.
	rdone, wdone bool
	// Under directConn.mu: the stream has moved off this fallback, whose
	// back mark follows the peer's bytes up to backAt (settle).
	backSet bool
	backAt  int64

	// The deadlines last given to c by Read and by Write (each under
	// its lock): set again only when they change.
	rdl, wdl time.Time
}

// directConn is a direct-mode connection's stream (see above).
type directConn struct {
	p      *Proxy
	name   string // the stream's (appproto.StreamName)
	side   int    // 0: dialed, moves the connection; 1: accepted
	target string // side 0: the address dialed, for the fallback
	link   *directLink
	port   int             // the stream's on the link
	lease  *transport.Conn // the stream's (stream 0: the link's)
	// dialFallback opens side 0's fallback (through the proxies, a
	// dialOnce with dialOpts.cont; tests put another carrier in).
	dialFallback func(ctx context.Context) (*transport.Conn, Route, error)
	// backStep, if set (by tests, under moveMu), runs as the move back to
	// the direct link has dialed it (marked false) and again once the
	// back mark is on the fallback (true).
	backStep func(marked bool)
	// installStep, if set (by tests, under moveMu), runs as a move to
	// the fallback has sent on it what the peer lacked; an error fails
	// the move.
	installStep func() error

	moveMu sync.Mutex // serialises moves
	rlock  sync.Mutex // serialises Reads
	wlock  sync.Mutex // serialises Writes
	wmu    sync.Mutex // held while a write goes to the write carrier, and by a move changing it

	mu sync.Mutex
	// mu protects the following fields.
	ln       *transport.Listener // side 1: the stream's listener, for the way back
	reads    []*carrier          // what Read reads, in order: reads[0] now
	w        *carrier            // what Write writes to
	changed  chan struct{}       // closed and replaced when the carriers, deadlines or state change
	fallback *Route              // the route while on the fallback; nil on the direct link
	starting bool                // the fallback is the proxied path the connection began on (directstart.go)
	closed   bool
	aborted  bool // closed by Abort: the stream's end goes to the peer as a reset (endOn)
	wshut    bool
	rdl, wdl time.Time
	err      error     // the connection failed
	class    qos.Class // what this side sends
}

// newDirect makes direct connection k of link l (directlink.go), over dc
// (ln: side 1's listener on the stream's port, kept for the way back).
// The connection holds one of l's streams until it has closed.
func (p *Proxy) newDirect(l *directLink, k int, ln *transport.Listener, dc, lease *transport.Conn) *directConn {
	return p.newDirectOn(l, k, ln, &carrier{c: dc}, lease, dc.Priority())
}

// newDirectOn is newDirect with the stream on carrier cr, sending class.
func (p *Proxy) newDirectOn(l *directLink, k int, ln *transport.Listener, cr *carrier, lease *transport.Conn, class qos.Class) *directConn {
	name := appproto.StreamName(l.name, k)
	port := appproto.DirectPort
	if k > 0 {
		port = appproto.StreamPort(k)
	}
	d := &directConn{p: p, name: name, side: l.side, link: l, port: port, ln: ln, lease: lease, reads: []*carrier{cr}, w: cr, changed: make(chan struct{}), class: class}
	d.dialFallback = func(ctx context.Context) (*transport.Conn, Route, error) {
		d.mu.Lock()
		class := d.class
		d.mu.Unlock()
		fc, err := p.dialOnce(ctx, d.target, dialOpts{class: class, cont: d.name})
		if err != nil {
			return nil, Route{}, err
		}
		return fc.c, fc.route, nil
	}
	p.mu.Lock()
	if p.directs == nil {
		p.directs = map[string]*directConn{}
	}
	p.directs[name] = d
	p.mu.Unlock()
	return d
}

// start begins following the lease; target is the address side 0
// dialed.
func (d *directConn) start(target string) {
	d.target = target
	go d.runLease()
}

func (d *directConn) logf(format string, args ...any) {
	if d.p.cfg.Logf != nil {
		d.p.cfg.Logf(format, args...)
	}
}

// bumpLocked wakes every call waiting for a change (d.mu held).
func (d *directConn) bumpLocked() {
	close(d.changed)
	d.changed = make(chan struct{})
}

// route is the connection's route now, and whether it is on the fallback.
func (d *directConn) route() (Route, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fallback == nil {
		return Route{}, false
	}
	return *d.fallback, true
}

// wait waits for a change or the deadline.
func (d *directConn) wait(ch <-chan struct{}, dl time.Time) error {
	if dl.IsZero() {
		<-ch
		return nil
	}
	t := time.NewTimer(time.Until(dl))
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-t.C:
		return os.ErrDeadlineExceeded
	}
}

// Read reads the stream from the carrier it is on. A Read that leaves
// nothing but the back mark on a fallback the stream has moved off has
// the mark read behind it (settle), so that the fallback closes now, not
// at the next Read; the settle a move starts cannot while a Read is
// under way.
func (d *directConn) Read(b []byte) (int, error) {
	d.rlock.Lock()
	n, cur, err := d.read(b)
	d.rlock.Unlock()
	if n > 0 && cur.fb {
		d.mu.Lock()
		set, at := cur.backSet, cur.backAt
		d.mu.Unlock()
		if set {
			go d.settle(cur, at)
		}
	}
	return n, err
}

// read is Read under rlock; it also returns the carrier it read from.
func (d *directConn) read(b []byte) (int, *carrier, error) {
	for {
		d.mu.Lock()
		cur, ch, dl, closed, failed := d.reads[0], d.changed, d.rdl, d.closed, d.err
		next := len(d.reads) > 1
		d.mu.Unlock()
		switch {
		case closed:
			return 0, cur, net.ErrClosed
		case cur.rdone && next:
			d.mu.Lock()
			d.reads = d.reads[1:]
			d.leftLocked(cur)
			d.mu.Unlock()
			continue
		case cur.rdone && failed != nil:
			return 0, cur, failed
		case cur.rdone:
			if err := d.wait(ch, dl); err != nil {
				return 0, cur, err
			}
			continue
		}
		if !dl.Equal(cur.rdl) {
			cur.c.SetReadDeadline(dl)
			cur.rdl = dl
		}
		n, err := d.readFrom(cur, b)
		if n > 0 || err == nil {
			return n, cur, nil
		}
		if errors.Is(err, errBack) || errors.Is(err, transport.ErrMoved) {
			d.mu.Lock()
			cur.rdone = true
			d.mu.Unlock()
			continue
		}
		return 0, cur, err
	}
}

// readFrom reads from cur: the stream's bytes, or errBack at its end.
func (d *directConn) readFrom(cur *carrier, b []byte) (int, error) {
	if !cur.fb {
		return cur.c.Read(b)
	}
	if cur.eof {
		return 0, io.EOF
	}
	if len(b) == 0 {
		return 0, nil
	}
	for cur.left == 0 {
		n, err := cur.c.Read(cur.hbuf[cur.hn:])
		cur.hn += n
		if err != nil {
			return 0, err // io.EOF too: the peer closed without CloseWrite
		}
		if cur.hn < len(cur.hbuf) {
			continue
		}
		cur.hn = 0
		switch l := binary.LittleEndian.Uint32(cur.hbuf[:]); l {
		case fbBack:
			return 0, errBack
		case fbFin:
			cur.eof = true
			return 0, io.EOF
		default:
			cur.left = int(l)
		}
	}
	n, err := cur.c.Read(b[:min(len(b), cur.left)])
	cur.left -= n
	cur.read += int64(n)
	if n > 0 {
		return n, nil
	}
	return 0, err
}

// Write writes b on the carrier the stream is on, following it as it
// moves.
func (d *directConn) Write(b []byte) (int, error) {
	d.wlock.Lock()
	defer d.wlock.Unlock()
	total := 0
	for total < len(b) {
		d.wmu.Lock()
		d.mu.Lock()
		cur, ch, dl, closed, shut, failed := d.w, d.changed, d.wdl, d.closed, d.wshut, d.err
		d.mu.Unlock()
		var n int
		var err error
		switch {
		case closed:
			err = net.ErrClosed
		case shut:
			err = syscall.EPIPE
		case failed != nil:
			err = failed
		default:
			if !dl.Equal(cur.wdl) {
				cur.c.SetWriteDeadline(dl)
				cur.wdl = dl
			}
			if cur.fb {
				n, err = d.writeFallback(cur, b[total:])
			} else {
				n, err = cur.c.Write(b[total:])
			}
		}
		d.wmu.Unlock()
		total += n
		if err == nil {
			continue
		}
		if !errors.Is(err, transport.ErrMoved) {
			return total, err
		}
		d.mu.Lock()
		moved := d.w != cur
		d.mu.Unlock()
		if !moved {
			if err := d.wait(ch, dl); err != nil {
				return total, err
			}
		}
	}
	return total, nil
}

// writeFallback writes a frame's worth of b on fallback carrier cur
// (d.wmu held) and returns how many bytes of b went.
func (d *directConn) writeFallback(cur *carrier, b []byte) (int, error) {
	for len(cur.hdr) > 0 {
		n, err := cur.c.Write(cur.hdr)
		cur.hdr = cur.hdr[n:]
		if err != nil {
			return 0, err
		}
	}
	if cur.owe == 0 {
		l := min(len(b), fbFrame)
		cur.hdr, cur.owe = binary.LittleEndian.AppendUint32(nil, uint32(l)), l
		return d.writeFallback(cur, b)
	}
	n, err := cur.c.Write(b[:min(len(b), cur.owe)])
	cur.owe -= n
	cur.wrote += int64(n)
	return n, err
}

// mark writes the header-only frame l (fbBack, fbFin) on fallback carrier
// cur, waiting for no deadline (d.wmu held).
func (d *directConn) mark(cur *carrier, l uint32) error {
	if cur.owe > 0 || len(cur.hdr) > 0 {
		return errors.New("a frame cut by a write deadline is still open")
	}
	cur.c.SetWriteDeadline(time.Time{})
	cur.wdl = time.Time{}
	_, err := cur.c.Write(binary.LittleEndian.AppendUint32(nil, l))
	return err
}

// CloseWrite ends this side's stream.
func (d *directConn) CloseWrite() error {
	d.wlock.Lock()
	defer d.wlock.Unlock()
	d.wmu.Lock()
	defer d.wmu.Unlock()
	d.mu.Lock()
	cur, closed := d.w, d.closed
	if !closed {
		d.wshut = true
	}
	d.mu.Unlock()
	switch {
	case closed:
		return net.ErrClosed
	case cur.fb:
		return d.mark(cur, fbFin)
	}
	if err := cur.c.CloseWrite(); err != nil && !errors.Is(err, transport.ErrMoved) {
		return err
	}
	return nil // a move sends the end again
}

// Close closes the stream: its carriers, and once the peer has closed its
// end (linger), its lease and its hold on the link.
func (d *directConn) Close() error { return d.close(false) }

// Abort is Close with the stream's end a reset (see The end, above). The
// carriers this side has left close in order, as in Close: each ends
// with the back mark that sends the peer's reader on to the next, which
// a reset could overtake through the proxies.
func (d *directConn) Abort() error { return d.close(true) }

func (d *directConn) close(abort bool) error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return net.ErrClosed
	}
	d.closed, d.aborted = true, abort
	d.link.closedOne()
	cur, ln := d.w, d.ln
	all := append([]*carrier{cur}, d.reads...)
	d.bumpLocked()
	d.mu.Unlock()
	d.p.mu.Lock()
	if d.p.directs[d.name] == d {
		delete(d.p.directs, d.name)
	}
	d.p.mu.Unlock()
	for _, cr := range all {
		if cr != cur {
			cr.c.Close()
		}
	}
	if ln != nil {
		ln.Close()
	}
	d.endOn(cur.c)
	if cur.fb {
		d.end()
		return nil
	}
	go linger(cur.c, d.end)
	return nil
}

// endOn ends c, a carrier the peer may read the stream's end from, as the
// stream ended: with a reset if Abort closed the connection, else in
// order. Close ends the carrier it writes on so, and a move under way
// that finds the connection closed ends so the carrier it has sent on
// (install, back, fail).
func (d *directConn) endOn(c *transport.Conn) {
	d.mu.Lock()
	abort := d.aborted
	d.mu.Unlock()
	if abort {
		c.Abort()
		return
	}
	c.Close()
}

// end returns the closed connection's stream to its link, and closes its
// lease unless that is the link's.
func (d *directConn) end() {
	if d.lease != d.link.lease {
		d.lease.Close()
	}
	d.link.release()
}

// SetReadDeadline and SetWriteDeadline apply to the carrier in use and
// to the next.
func (d *directConn) SetReadDeadline(t time.Time) error {
	idle := d.rlock.TryLock() // no Read runs: give cur the deadline for it
	d.mu.Lock()
	d.rdl = t
	cur := d.reads[0]
	d.bumpLocked()
	d.mu.Unlock()
	if !idle {
		return cur.c.SetReadDeadline(t) // wakes a Read blocked on it, which sets it again
	}
	defer d.rlock.Unlock()
	cur.rdl = t
	return cur.c.SetReadDeadline(t)
}

func (d *directConn) SetWriteDeadline(t time.Time) error {
	idle := d.wmu.TryLock() // no write runs: give cur the deadline for it
	d.mu.Lock()
	d.wdl = t
	cur := d.w
	d.bumpLocked()
	d.mu.Unlock()
	if !idle {
		return cur.c.SetWriteDeadline(t) // wakes a Write blocked on it, which sets it again
	}
	defer d.wmu.Unlock()
	cur.wdl = t
	return cur.c.SetWriteDeadline(t)
}

// leftLocked closes a fallback both the reader and the writer have left
// (d.mu held).
func (d *directConn) leftLocked(cr *carrier) {
	if cr.fb && cr.wdone && cr.rdone {
		cr.c.Close()
	}
}

// failLocked ends the connection with err (d.mu held).
func (d *directConn) failLocked(err error) {
	if d.err == nil {
		d.err = err
	}
	d.bumpLocked()
}

// runLease follows ntproxy's word on the NTB link; side 0 moves the
// connection.
func (d *directConn) runLease() {
	var b [1]byte
	for {
		if _, err := d.lease.Read(b[:]); err != nil {
			if d.lease == d.link.lease {
				d.link.retire() // ntproxy has let the link go
			}
			return
		}
		switch b[0] {
		case appproto.LeaseLinkDown:
			d.link.force(true)
			if d.side == 0 {
				d.toFallback()
			}
		case appproto.LeaseLinkUp:
			d.link.force(false)
			if d.side == 0 {
				d.toDirect()
			}
		}
	}
}

// runAccept takes side 0's connection back onto the direct link. It runs
// only from side 1's move to the fallback until the move back: an Accept
// pending on the link's endpoint would have its poller take every record
// of the live direct connection, a wake-up more on each.
func (d *directConn) runAccept() {
	d.mu.Lock()
	ln := d.ln
	d.mu.Unlock()
	if ln == nil {
		return
	}
	for {
		nc, err := ln.AcceptConn()
		if err != nil {
			return
		}
		d.moveMu.Lock()
		ok := d.back(nc)
		d.moveMu.Unlock()
		if ok {
			return
		}
	}
}

// awaitPaused waits until the direct connection c has paused with its
// link and can detach, within moveTimeout; false if it did not, or ended.
func awaitPaused(c *transport.Conn) bool {
	ctx, cancel := context.WithTimeout(context.Background(), moveTimeout)
	defer cancel()
	return c.AwaitPause(ctx) == nil
}

// writeOffset and readOffset exchange a stream offset on c.
func writeOffset(c *transport.Conn, off int64) error {
	c.SetWriteDeadline(time.Now().Add(moveTimeout))
	_, err := c.Write(binary.LittleEndian.AppendUint64(nil, uint64(off)))
	c.SetWriteDeadline(time.Time{})
	return err
}

func readOffset(c *transport.Conn) (int64, error) {
	var b [hdrLen]byte
	c.SetReadDeadline(time.Now().Add(moveTimeout))
	_, err := io.ReadFull(c, b[:])
	c.SetReadDeadline(time.Time{})
	if v := binary.LittleEndian.Uint64(b[:]); err == nil && v >= 1<<62 {
		err = fmt.Errorf("stream offset %d out of range", v)
	}
	return int64(binary.LittleEndian.Uint64(b[:])), err
}

// toFallback moves the connection (side 0) to the fallback, if it is on
// its direct link and that has paused.
func (d *directConn) toFallback() {
	d.moveMu.Lock()
	defer d.moveMu.Unlock()
	d.mu.Lock()
	cur, closed := d.w, d.closed
	d.mu.Unlock()
	if closed || cur.fb || !awaitPaused(cur.c) {
		return
	}
	for try := 1; try <= 3; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), moveTimeout)
		f, route, err := d.dialFallback(ctx)
		cancel()
		if err != nil {
			d.logf("direct link %s down: the fallback through the proxies refused (try %d): %v", d.name, try, err)
			continue
		}
		peer, err := readOffset(f)
		if err != nil {
			f.Close()
			d.logf("direct link %s down: the fallback through the proxies failed (try %d): %v", d.name, try, err)
			continue
		}
		h, err := cur.c.Detach()
		if err == nil {
			err = writeOffset(f, cur.rbase+h.Received)
		}
		if err == nil {
			err = d.install(cur, f, h, peer, route)
		}
		if err != nil {
			d.fail(f, err)
		}
		return
	}
}

// fromFallback takes the connection (side 1) onto fallback f, which side 0
// opened.
func (d *directConn) fromFallback(f *transport.Conn, route Route) {
	d.moveMu.Lock()
	defer d.moveMu.Unlock()
	d.mu.Lock()
	cur, closed := d.w, d.closed
	d.mu.Unlock()
	if closed || cur.fb || !awaitPaused(cur.c) {
		f.Close() // side 0 tries again, or resumes on the link
		return
	}
	h, err := cur.c.Detach()
	if err != nil {
		f.Close()
		return
	}
	// Listen for the way back before side 0 can learn of this move.
	go d.runAccept()
	err = writeOffset(f, cur.rbase+h.Received)
	var peer int64
	if err == nil {
		peer, err = readOffset(f)
	}
	if err == nil {
		err = d.install(cur, f, h, peer, route)
	}
	if err != nil {
		d.fail(f, err)
	}
}

// fail ends a connection whose direct carrier is detached and whose
// move to fallback f failed: its reads fail with ECONNRESET, and f ends
// with a reset, so the peer's do too once it has read what came before
// (a FIN would read as the stream's end, the bytes after it lost). If
// the application closed the connection during the move, f ends as the
// stream did.
func (d *directConn) fail(f *transport.Conn, err error) {
	d.mu.Lock()
	closed := d.closed
	d.failLocked(fmt.Errorf("%w: direct link down and the fallback failed: %v", syscall.ECONNRESET, err))
	d.mu.Unlock()
	if closed {
		d.endOn(f)
		return
	}
	f.Abort()
	d.logf("direct link %s: the move to the fallback failed, the connection ends: %v", d.name, err)
}

// install puts the stream on fallback f after detached direct carrier cur:
// it sends again what the peer, having received up to stream offset peer,
// lacks (from h), and the end if this side wrote it.
func (d *directConn) install(cur *carrier, f *transport.Conn, h transport.Handover, peer int64, route Route) error {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	rest, err := h.From(peer - cur.wbase)
	if err != nil {
		return err
	}
	nf := &carrier{c: f, fb: true, wbase: peer, rbase: cur.rbase + h.Received}
	for len(rest) > 0 {
		n, err := d.writeFallback(nf, rest)
		if err != nil {
			return err
		}
		rest = rest[n:]
	}
	d.mu.Lock()
	shut := d.wshut
	d.mu.Unlock()
	if shut {
		if err := d.mark(nf, fbFin); err != nil {
			return err
		}
	}
	if d.installStep != nil {
		if err := d.installStep(); err != nil {
			return err
		}
	}
	route.Mode = "proxy" // ntproxy's Reason names the direct link
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		return net.ErrClosed
	}
	d.w, d.fallback = nf, &route
	d.reads = append(d.reads, nf)
	cur.wdone = true
	d.bumpLocked()
	d.mu.Unlock()
	d.logf("direct link %s down: connection moved to the fallback through the proxies over %s, %d bytes sent again", d.name, route.Path, h.Sent-(peer-cur.wbase))
	return nil
}

// toDirect moves the connection (side 0) back to its direct link.
func (d *directConn) toDirect() {
	d.moveMu.Lock()
	defer d.moveMu.Unlock()
	ep := d.link.endpointNow()
	if ep == nil {
		return // still opening: the connection moves onto it then (directstart.go)
	}
	for try := 1; try <= 3; try++ {
		d.mu.Lock()
		onFallback, closed := d.w.fb, d.closed
		d.mu.Unlock()
		if closed || !onFallback {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), moveTimeout)
		nc, err := ep.DialContext(ctx, d.port)
		cancel()
		if err != nil {
			d.logf("direct link %s up: dial it again (try %d): %v", d.name, try, err)
			continue
		}
		if d.backStep != nil {
			d.backStep(false)
		}
		if d.back(nc) {
			return
		}
	}
}

// back moves the stream from the fallback to nc, a new connection on the
// direct link, and reports whether it did; if not, nc is closed and the
// stream stays on the fallback.
func (d *directConn) back(nc *transport.Conn) bool {
	d.wmu.Lock()
	defer d.wmu.Unlock()
	d.mu.Lock()
	cur, closed, shut := d.w, d.closed, d.wshut
	d.mu.Unlock()
	if closed || !cur.fb || cur.owe > 0 || len(cur.hdr) > 0 {
		nc.Close()
		return false
	}
	off := cur.wbase + cur.wrote
	err := writeOffset(nc, off)
	var peer int64
	if err == nil {
		peer, err = readOffset(nc)
	}
	if err == nil {
		err = d.mark(cur, fbBack)
	}
	if err != nil && d.side == 1 && errors.Is(err, syscall.ECONNRESET) {
		// Side 0 resets a new direct connection only once its back mark
		// is on the fallback (an Abort during the move, see below; a
		// failed move closes it), and a far end that went resets it too:
		// the stream ends with that reset where the fallback ends.
		nc.Close()
		d.logf("direct link %s up: the peer aborted the connection as it moved back: %v", d.name, err)
		d.mu.Lock()
		d.failLocked(err)
		d.mu.Unlock()
		return true
	}
	if err != nil {
		nc.Close()
		d.logf("direct link %s up: the move back failed, the connection stays on the fallback: %v", d.name, err)
		return false
	}
	if d.backStep != nil {
		d.backStep(true)
	}
	if shut {
		nc.CloseWrite()
	}
	nd := &carrier{c: nc, wbase: off - hdrLen, rbase: peer - hdrLen}
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		d.endOn(nc) // the peer reads on to it past the back mark
		return true
	}
	nc.SetPriority(d.class)
	d.w, d.fallback = nd, nil
	d.reads = append(d.reads, nd)
	cur.wdone = true
	cur.backSet, cur.backAt = true, peer
	d.leftLocked(cur)
	d.bumpLocked()
	started := d.starting
	d.starting = false
	d.mu.Unlock()
	how := "moved back to it from the fallback"
	if started {
		how = "moved onto it from the proxied path it began on"
	}
	d.logf("direct link %s up: connection %s", d.name, how)
	go d.settle(cur, peer)
	return true
}

// SetPriority sets the class of what this side sends, on the carrier in
// use and the next.
func (d *directConn) SetPriority(class qos.Class) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.w.c.SetPriority(class); err != nil {
		return err
	}
	d.class = class
	return nil
}
