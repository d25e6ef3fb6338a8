package transport

import (
	"errors"
	"io"
	"syscall"

	"github.com/ntstack/ntstack/partition"
)

// ReadSocket moves what the socket behind rc holds into the connection,
// at most max bytes, waiting until the socket holds a byte or ends. The
// bytes go from the socket straight into the records' room in the ring,
// one read(2) a record, with no buffer and no copy between: a relay of a
// socket onto the fabric (the TCP gateway) pays the kernel's copy alone.
// It returns how many bytes it moved, and io.EOF once the socket has
// ended, or the socket's error or the connection's (as Write's). Only a
// sender that retains by reference (a window it can read back: the
// emulated fabric) reads into the ring; otherwise ReadSocket returns
// errors.ErrUnsupported and moves nothing: read into a buffer and Write.
func (c *Conn) ReadSocket(rc syscall.RawConn, max int) (int, error) {
	if !c.ep.byRef {
		return 0, errors.ErrUnsupported
	}
	src := sockSource{}
	fill := src.fill // one closure for the call, not one a record
	var n int
	var err error
	rerr := rc.Read(func(fd uintptr) bool {
		src.fd = int(fd)
		n, err = c.writeFill(fill, max)
		if err == nil {
			err = src.err
		}
		return n > 0 || err != nil // else wait until the socket is readable
	})
	if err == nil {
		err = rerr
	}
	return n, err
}

// sockSource fills records from a non-blocking socket.
type sockSource struct {
	fd  int
	err error // io.EOF, or the read's error
}

// fill reads into b what the socket holds now, up to len(b); 0 when it
// holds nothing, has ended or failed (then err says which).
func (s *sockSource) fill(b []byte) int {
	for {
		n, err := syscall.Read(s.fd, b)
		switch {
		case err == syscall.EINTR:
			continue
		case err == syscall.EAGAIN:
			return 0
		case err != nil:
			s.err = err
			return 0
		case n == 0:
			s.err = io.EOF
			return 0
		}
		return n
	}
}

// writeFill is Write of what fill writes into the ring, up to max bytes:
// at once if nothing can be ahead of it (fillNow), otherwise posted like
// a write for whoever serves the unit, who calls fill (c.smu held) until
// it returns less than it was given room for or max bytes are in. It
// returns how many bytes fill wrote, and the connection's error.
func (c *Conn) writeFill(fill func([]byte) int, max int) (int, error) {
	c.ep.calls.Add(1)
	c.wlock.Lock()
	defer c.wlock.Unlock()
	c.ep.enterCall()
	defer c.ep.exitCall()
	if err := c.writeErr(); err != nil {
		return 0, err
	}
	if c.ep.cfg.CoreModel == CoreInline {
		if n, ok := c.fillNow(fill, max); ok {
			c.st().pollRing(c.st().control, nil, nil) // the credit that came meanwhile (see Write)
			return n, nil
		}
	}
	c.smu.Lock()
	c.fill, c.fillLeft, c.filled = fill, max, 0
	c.wdone.Store(false)
	c.unit.postLocked(c)
	c.smu.Unlock()
	err := c.awaitWrite(nil, true)
	c.smu.Lock()
	n := c.filled // in the ring whether or not the write finished
	c.fill, c.fillLeft, c.filled = nil, 0, 0
	c.smu.Unlock()
	if n > 0 {
		c.ep.noteProgress()
	}
	return n, err
}

// fillNow fills one record of up to max bytes straight into the ring, as
// sendNow sends a small write: when nothing can be ahead of it and the
// peer's window has room for a record (creditFloorFor). It reports whether
// it did (n may be 0: the source held nothing); if not, post the fill.
func (c *Conn) fillNow(fill func([]byte) int, max int) (n int, ok bool) {
	c.smu.Lock()
	defer c.smu.Unlock()
	u := c.unit
	if !c.nothingAheadLocked() {
		return 0, false
	}
	p := u.parts[c.slot]
	credit := c.window - (c.sent.Load() - c.peerRead.Load())
	if credit < c.creditFloorFor(max) {
		return 0, false
	}
	chunk := int(min(int64(max), int64(c.ep.cfg.MTU), credit, int64(p.MaxPayload())))
	if chunk > smallPiece && c.ep.cfg.MTU <= DefaultMTU && c.st().smallTraffic(p.Index) {
		chunk = smallPiece // as serveOnce cuts it
	}
	if !p.TryBeginTX() {
		return 0, false
	}
	n, err := c.fillDataLocked(p, chunk, fill)
	p.EndTX()
	if err != nil {
		return 0, false // a full ring, or the session's end: the posted path sees to it
	}
	c.countTx(u, n)
	return n, true
}

// fillDataLocked adds to p's open batch a DATA record of c's that fill
// writes, of up to max bytes, and retains it as sendDataLocked does (c.smu
// held, retention by reference). It returns the record's length, 0 if
// fill wrote nothing (and no record went).
func (c *Conn) fillDataLocked(p *partition.Partition, max int, fill func([]byte) int) (int, error) {
	at := c.sent.Load()
	tag := makeTag(kindData, c.peerID)
	ref, pos, err := p.SendFill(tag, max, fill)
	if err != nil || len(ref) == 0 {
		return 0, err
	}
	// Counted as sent before the batch ends, which makes it visible.
	n := len(ref)
	c.sent.Add(int64(n))
	if n <= keepSmall {
		c.keepLocked(at, ref)
	} else {
		c.keep.addRef(at, ref, p, pos, c.peerRead.Load())
		c.unit.st.refs[p.Index].push(c, at+int64(n), pos)
	}
	if ts := c.ep.taps.Load(); ts != nil {
		ts.emit(c.st(), TapTX, p.Index, tag, c.id, ref)
	}
	return n, nil
}
