package transport

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/partition"
)

// Connections that outlive their session (DESIGN.md invariant 9).
//
// Retention. A connection's sender keeps every byte it sends until the
// peer's CREDIT covers it (sendHalf.keep): the bytes between peerRead and
// sent, which the credit bounds by the peer's window. CREDIT reports
// bytes the peer's application has read; a byte read is out of the ring,
// in the reader's own process, and survives the session. So does a byte
// the peer took off the ring in order, read or not (RESUME's received
// counts it). On a device whose outbound window is shared memory the
// bytes are kept where they were written, in the peer's ring: the ring
// overwrites only what the peer took off it, so those are dropped then
// (copied out only after a MOVE the peer has not read past), and the rest
// are copied out before a new session writes the ring; elsewhere they are copied
// as they are sent (keep.go).
//
// Resume. When a session ends and the cause leaves hope — the link went
// down for a reason other than the peer's exit or close, or the peer
// started a new session over an up link — the connections wait (paused)
// for the next session, Config.UserTimeout at most. When it comes, both
// ends take their connections over to it with the same ids, and each
// sends RESUME for each connection as its first frame on the partition it
// now sends on:
//
//	RESUME  nonce u64, received u64, credit u64, floor u32, id u32
//
// nonce is the connection's identity: 64 random bits the dialer drew and
// sent in OPEN, so a RESUME is matched to the connection both ends agreed
// on, not to whatever holds the id now. received is the count of the
// connection's bytes this side took out of the old rings (those left in
// them are lost with them and not counted), credit and floor this side's
// last CREDIT (which may have been lost too), id the sender's id for the
// connection. The receiver of a RESUME rewinds its sent count to received,
// sends again what it kept from there up to what it had sent, then the
// frames that followed (FIN, CLOSE), then new writes: nothing is lost,
// duplicated or reordered, and Read and Write see only a pause. A RESUME
// for an id with no connection, or another nonce, is answered with
//
//	RESET   nonce u64
//
// addressed to the RESUME's id: the peer lost the connection (its process
// restarted, or it had ended the connection); it fails with ECONNRESET.
//
// Liveness. A link whose device says its peer is suspect (ntb.Liveness)
// keeps its session and its connections; only a suspicion that lasts
// SilentTimeout ends the session, as silent. Errors (connError) speak TCP's
// language: a peer gone or reset gives ECONNRESET, a peer that closed its
// endpoint ECONNRESET too (data in flight to a closed endpoint is lost,
// as TCP resets a connection closed with unread data) with a message
// saying so, a user timeout ETIMEDOUT; every one also wraps ErrLinkDown.

// DefaultUserTimeout is how long a connection waits for an unreachable
// peer (link down, resume unanswered; and a suspect one unless
// Config.SilentTimeout says otherwise) before it fails.
const DefaultUserTimeout = 10 * time.Second

// watchMin and watchMax bound the period of runWatch's looks at a
// device's suspicion: an idle endpoint wakes for it at most every
// watchMax, at least every watchMin.
const (
	watchMin = 100 * time.Millisecond
	watchMax = 2500 * time.Millisecond
)

// keepMin is the least retention buffer allocated.
const keepMin = 4 << 10

// connError is the error of a connection that failed.
type connError struct {
	errno syscall.Errno // ECONNRESET or ETIMEDOUT
	why   string
	cause error // the session's end, if any
	alive bool  // the link is fine: the peer aborted the connection
}

// errPeerAborted is the error of a connection the peer aborted (Abort).
var errPeerAborted = &connError{errno: syscall.ECONNRESET, why: "the peer aborted the connection: its far end went without closing it, and the stream may end short", alive: true}

func (e *connError) Error() string {
	if e.cause != nil {
		return fmt.Sprintf("%s: %s (%v)", e.errno.Error(), e.why, e.cause)
	}
	return fmt.Sprintf("%s: %s", e.errno.Error(), e.why)
}

func (e *connError) Unwrap() []error {
	if e.alive {
		return []error{e.errno}
	}
	if e.cause != nil {
		return []error{e.errno, ErrLinkDown, e.cause}
	}
	return []error{e.errno, ErrLinkDown}
}

// Timeout reports whether the connection timed out (net.Error).
func (e *connError) Timeout() bool { return e.errno.Timeout() }

func resetErr(why string, cause error) error {
	return &connError{errno: syscall.ECONNRESET, why: why, cause: cause}
}

func timeoutErr(why string, cause error) error {
	return &connError{errno: syscall.ETIMEDOUT, why: why, cause: cause}
}

// errSessionLost is wrapped by the failure of a dial whose session ended
// before the peer answered: the dial starts over on the next session.
var errSessionLost = errors.New("session ended during dial")

// endOf says what the end of a session with cause means for its
// connections: nil to keep them for the next session, or the error they
// fail with.
func (ep *Endpoint) endOf(cause error, closed bool) error {
	if closed {
		return fmt.Errorf("%w: %w", ErrLinkDown, cause)
	}
	if d, ok := errors.AsType[*partition.DownError](cause); ok {
		switch d.Cause {
		case ntb.CauseGone:
			return resetErr("peer process exited", cause)
		case ntb.CauseClosed:
			return resetErr("peer endpoint closed", cause)
		case ntb.CauseSilent:
			return timeoutErr("peer silent", cause)
		}
		return nil
	}
	if errors.Is(cause, partition.ErrPeerRestarted) {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrLinkDown, cause)
}

// newNonce draws a connection's identity (math/rand/v2's generator is
// seeded from the system's randomness and not predictable from its
// output).
func newNonce() uint64 {
	for {
		if v := rand.Uint64(); v != 0 {
			return v
		}
	}
}

// keepLocked retains b, sent at stream offset at, when the connection
// retains by copy, or by reference as a copy (keepSmall; c.smu held).
// Larger records retained by reference sendDataLocked has retained.
func (c *Conn) keepLocked(at int64, b []byte) {
	switch {
	case !c.ep.byRef:
		c.keep.add(at, b, c.peerRead.Load())
	case len(b) <= keepSmall:
		c.keep.addSmall(at, b, c.peerRead.Load())
	}
}

// resumeMsg is a RESUME's payload.
type resumeMsg struct {
	nonce    uint64
	received uint64
	credit   uint64
	floor    uint32
	id       uint32
}

const resumeSize = 32

func (m resumeMsg) encode(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, m.nonce)
	b = binary.LittleEndian.AppendUint64(b, m.received)
	b = binary.LittleEndian.AppendUint64(b, m.credit)
	b = binary.LittleEndian.AppendUint32(b, m.floor)
	return binary.LittleEndian.AppendUint32(b, m.id)
}

func decodeResume(p []byte) (resumeMsg, error) {
	if len(p) != resumeSize {
		return resumeMsg{}, fmt.Errorf("resume frame of %d bytes, want %d", len(p), resumeSize)
	}
	m := resumeMsg{
		nonce:    binary.LittleEndian.Uint64(p),
		received: binary.LittleEndian.Uint64(p[8:]),
		credit:   binary.LittleEndian.Uint64(p[16:]),
		floor:    binary.LittleEndian.Uint32(p[24:]),
		id:       binary.LittleEndian.Uint32(p[28:]),
	}
	if m.id == 0 || m.id > maxID {
		return resumeMsg{}, fmt.Errorf("resume frame id %d outside [1, %d]", m.id, maxID)
	}
	if m.credit > m.received || m.received > 1<<62 {
		return resumeMsg{}, fmt.Errorf("resume frame credit %d beyond received %d", m.credit, m.received)
	}
	if f := m.floor &^ floorPooled; f > maxWindow {
		return resumeMsg{}, fmt.Errorf("resume frame floor %d beyond %d", f, maxWindow)
	}
	return m, nil
}

func decodeU64(p []byte, what string) (uint64, error) {
	if len(p) != 8 {
		return 0, fmt.Errorf("%s frame of %d bytes, want 8", what, len(p))
	}
	return binary.LittleEndian.Uint64(p), nil
}

// finish acts on the end of st's session, once: its connections fail, or
// wait for the next session (see endOf).
func (st *state) finish() {
	st.finishOnce.Do(func() {
		st.finishNow()
		close(st.finished)
	})
}

func (st *state) finishNow() {
	ep := st.ep
	ep.spaceArrived()
	st.turns.mu.Lock()
	if t := st.turns.timer; t != nil {
		t.Stop()
	}
	st.turns.mu.Unlock()
	ep.mu.Lock()
	closed := ep.closed
	if ep.cur == st {
		ep.cur = nil
	}
	ep.mu.Unlock()
	cause := st.sess.Err()
	fatal := ep.endOf(cause, closed)
	var kept []*Conn
	now := ep.now()
	for i := range st.conns {
		c := st.conns[i].Load()
		if c == nil {
			continue
		}
		switch {
		case fatal != nil:
			c.fail(fatal)
			c.abandon()
		case !c.resumable():
			c.fail(fmt.Errorf("%w: %w: %w", errSessionLost, ErrLinkDown, cause))
			c.abandon()
		default:
			c.pausedAt.CompareAndSwap(0, now+1)
			c.wake(c.rnotify) // parked calls park again, on the next session
			c.wake(c.wnotify)
			kept = append(kept, c)
		}
	}
	if fatal != nil {
		ep.logf("connections of session %#x closed: %v", st.sess.Epoch, fatal)
		return
	}
	ep.mu.Lock()
	if !ep.closed {
		ep.orphan = st
	}
	ep.mu.Unlock()
	for _, c := range kept {
		signal(c.pauseNote) // it can detach now (AwaitPause)
	}
	ep.armPauseCheck(ep.cfg.UserTimeout)
	ep.logf("session %#x ended (%v): %d connections wait to resume, %v at most", st.sess.Epoch, cause, len(kept), ep.cfg.UserTimeout)
}

// resumable reports whether c can resume on a later session: established,
// not failed, with a nonce both ends know.
func (c *Conn) resumable() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state == connEstablished && c.err == nil && c.nonce != 0 && !c.idFreed
}

// adopt takes the connections of old, a session that ended, over to st,
// the new one (before st is published: nothing polls it yet). Each is
// entered in st's table first, so a peer's RESUME found by a poll of st
// finds its connection wherever the take-over is.
func (st *state) adopt(old *state) {
	var cs []*Conn
	now := st.ep.now()
	for i := range old.conns {
		c := old.conns[i].Load()
		if c == nil || !c.resumable() {
			continue
		}
		// finish paused it; a RESUME the old session's poll applied
		// after that (resumeFrom) has cleared the pause: pause it again.
		c.pausedAt.CompareAndSwap(0, now+1)
		c.smu.Lock()
		c.resuming, c.peerResume = true, nil
		c.smu.Unlock()
		st.conns[c.id].Store(c)
		cs = append(cs, c)
	}
	old.mu.Lock()
	st.nextID = old.nextID
	for i := uint32(1); i < old.nextID; i++ {
		if st.conns[i].Load() == nil {
			st.free = append(st.free, i)
		}
	}
	old.mu.Unlock()
	st.live.Store(int32(len(cs)))
	// What the connections retain by reference lies in the old rings,
	// which the first frame any of them sends on st overwrites (a RESUME
	// may go as soon as its take-over is done): copy it all out first.
	// The old session's sends have stopped (partition's quiesce), and
	// c.smu keeps a straggling serve pass of c's out meanwhile.
	for _, c := range cs {
		c.smu.Lock()
		c.keep.materialize(c.peerRead.Load())
		c.smu.Unlock()
	}
	for _, c := range cs {
		st.takeOver(old, c)
	}
}

// takeOver moves c from old to st and queues its RESUME.
func (st *state) takeOver(old *state, c *Conn) {
	// Receiving side: what was counted but is still in the old rings is
	// lost with them, and comes again.
	c.rxmu.Lock()
	lost := c.ringRest.Swap(0)
	for _, h := range c.held {
		if h.kind == kindData {
			lost += int64(len(h.payload))
		}
	}
	c.held = nil
	c.restWaits.Store(false)
	received := c.recvd.Add(-lost)
	c.rxPart.Store(-1) // until the peer's RESUME says where it sends
	c.rxmu.Unlock()
	// Grants: the old turns are gone.
	old.turns.mu.Lock()
	c.turnQueued, c.turnHeld, c.aheadSeen = false, false, 0
	old.turns.mu.Unlock()
	c.ahead.Store(0)
	c.cmu.Lock()
	c.wants = false
	m := resumeMsg{nonce: c.nonce, received: uint64(received), credit: uint64(max(c.creditOut, 0)), floor: uint32(c.floorOut), id: c.id}
	c.cmu.Unlock()
	// Sending side: a place on the new session, RESUME first, then what
	// was queued; data waits for the peer's RESUME.
	u, slot, err := st.place(c.class())
	c.mu.Lock()
	finSent, closeSent, aborts := c.finSent, c.closeSent, c.closeAborts
	c.mu.Unlock()
	c.smu.Lock()
	if err != nil {
		c.smu.Unlock()
		c.fail(resetErr("no partition for the resumed connection", err))
		return
	}
	c.unit, c.slot, c.unplaced, c.moving, c.inSched = u, slot, false, false, false
	c.waitCredit, c.wantSent = false, false
	pending := func(kind uint32) bool {
		for _, f := range c.frames {
			if k, _ := splitTag(f.tag); k == kind {
				return true
			}
		}
		return false
	}
	// FIN and CLOSE already sent may have been lost: they follow the
	// resent bytes again (both are idempotent at the receiver), an
	// aborting CLOSE as an abort. A RESUME of an earlier take-over that
	// never went out (its session ended first) is superseded by this
	// one: the peer takes one a session.
	after := slices.DeleteFunc(c.frames, func(f ctlFrame) bool {
		k, _ := splitTag(f.tag)
		return k == kindResume
	})
	if finSent && !pending(kindFin) {
		after = append(after, ctlFrame{tag: makeTag(kindFin, c.peerID)})
	}
	if closeSent && !pending(kindClose) {
		cl := ctlFrame{tag: makeTag(kindClose, c.peerID)}
		if aborts {
			cl.n = copy(cl.body[:], closeAbort)
		}
		after = append(after, cl)
	}
	c.after = after
	f := ctlFrame{tag: makeTag(kindResume, c.peerID), n: resumeSize}
	m.encode(f.body[:0])
	c.frames = []ctlFrame{f}
	c.stp.Store(st)
	pm := c.peerResume
	c.peerResume = nil
	c.unit.postLocked(c)
	c.smu.Unlock()
	if pm != nil {
		c.resumeFrom(pm)
	}
}

// resume handles a RESUME for our connection id from data partition part
// (its RX lock held).
func (st *state) resume(part int, id uint32, payload []byte) error {
	m, err := decodeResume(payload)
	if err != nil {
		return err
	}
	c := st.lookup(id)
	if c == nil || c.nonce == 0 || c.nonce != m.nonce {
		st.ep.counters.resets.Add(1)
		st.sendLoose(st.parts[part], kindReset, m.id, 0, binary.LittleEndian.AppendUint64(nil, m.nonce))
		return nil
	}
	c.rxmu.Lock()
	c.rxPart.Store(int32(part))
	c.rxmu.Unlock()
	c.smu.Lock()
	if c.st() != st {
		// Our take-over has not reached c yet: it applies m.
		c.peerResume = &m
		c.smu.Unlock()
		return nil
	}
	c.smu.Unlock()
	return c.resumeFrom(&m)
}

// resumeFrom applies the peer's RESUME: sending restarts from what it
// received.
func (c *Conn) resumeFrom(m *resumeMsg) error {
	c.smu.Lock()
	if !c.resuming {
		c.smu.Unlock()
		return fmt.Errorf("resume for connection %d, which is not resuming", c.id)
	}
	// A session that ended while bytes were being sent again leaves
	// sent short of resendTo: everything up to resendTo was sent.
	sent := max(c.sent.Load(), c.resendTo)
	from := int64(m.received)
	if from > sent || from < c.peerRead.Load() || !c.keep.holds(from, sent) {
		err := resetErr("peer resumed from a point we do not hold", fmt.Errorf("received %d, sent %d, acknowledged %d", from, sent, c.peerRead.Load()))
		c.resuming = false
		c.smu.Unlock()
		c.fail(err)
		c.abandon()
		return nil
	}
	defer c.smu.Unlock()
	if cr := int64(m.credit); cr > c.peerRead.Load() {
		c.peerRead.Store(cr)
	}
	if m.floor != 0 {
		c.peerFloor = int64(m.floor &^ floorPooled)
		c.peerPooled = m.floor&floorPooled != 0
	}
	c.sent.Store(from)
	c.resendTo = sent
	c.resuming = false
	c.pausedAt.Store(0)
	c.ep.counters.resumptions.Add(1)
	c.ep.logf("connection %d resumed on session %#x: %d bytes sent again", c.id, c.st().sess.Epoch, sent-from)
	if c.hasWorkLocked() {
		c.unit.postLocked(c)
	}
	c.wake(c.wnotify)
	c.wake(c.rnotify)
	return nil
}

// reset handles a RESET for our connection id: the peer has no such
// connection.
func (st *state) reset(id uint32, payload []byte) error {
	nonce, err := decodeU64(payload, "reset")
	if err != nil {
		return err
	}
	c := st.lookup(id)
	if c == nil || c.nonce != nonce {
		return nil // stale
	}
	c.mu.Lock()
	closed := c.closeSent
	c.mu.Unlock()
	if closed {
		// The peer frees a connection only once both CLOSEs have passed
		// at its end: this is its orderly end, its CLOSE lost with the
		// old rings. (Had it lost the connection otherwise, nobody is
		// left to tell: this end has closed.)
		c.smu.Lock()
		c.resuming = false
		c.smu.Unlock()
		c.pausedAt.Store(0)
		c.peerClose(false)
		return nil
	}
	c.fail(resetErr("peer has no such connection", nil))
	c.abandon()
	return nil
}

// abandon releases what a failed connection holds on this side: no frame
// for it will come or go again.
func (c *Conn) abandon() {
	c.mu.Lock()
	c.closeRecv, c.closeSent = true, true
	c.endedLocked()
	free := c.freeLocked()
	c.mu.Unlock()
	if free {
		c.releaseLocal()
	}
}

// resendLocked sends again retained bytes up to resendTo, then the
// frames that followed them (c.smu held); it reports whether it sent
// anything and whether c must wait (credit, ring space, tokens) before
// the rest.
func (c *Conn) resendLocked(p *partition.Partition, send func(uint32, []byte) error, budget int) (sent bool, err error, wait bool) {
	for budget > 0 && c.sent.Load() < c.resendTo {
		s := c.sent.Load()
		credit := c.window - (s - c.peerRead.Load())
		if credit <= 0 {
			c.waitCredit = true
			if c.peerPooled && !c.wantSent {
				c.wantSent = true
				c.wantOut.Store(true)
			}
			return sent, nil, true
		}
		b := c.keep.bytesAt(s, c.resendTo)
		if len(b) == 0 {
			return sent, fmt.Errorf("connection %d: byte %d to send again is not retained", c.id, s), true
		}
		chunk := min(int64(len(b)), int64(c.ep.cfg.MTU), credit, int64(p.MaxPayload()), int64(budget))
		c.sent.Add(chunk)
		if err := send(makeTag(kindData, c.peerID), b[:chunk]); err != nil {
			c.sent.Add(-chunk)
			return sent, err, true
		}
		budget -= int(chunk)
		sent = true
	}
	if c.sent.Load() < c.resendTo {
		return sent, nil, true
	}
	for len(c.after) > 0 {
		f := &c.after[0]
		if err := send(f.tag, f.body[:f.n]); err != nil {
			return sent, err, true
		}
		c.after = c.after[1:]
		sent = true
	}
	c.after = nil
	return sent, nil, false
}

// armPauseCheck makes checkPaused run within d.
func (ep *Endpoint) armPauseCheck(d time.Duration) {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.closed {
		return
	}
	if ep.pauseTimer == nil {
		ep.pauseTimer = time.AfterFunc(d, ep.checkPaused)
		return
	}
	ep.pauseTimer.Reset(d)
}

// checkPaused fails the connections that have waited for their peer
// longer than the user timeout, and looks again when the next one would.
//
// It holds Endpoint.mu throughout, as a new session does while it adopts
// the paused connections: a connection failed here is either still the
// orphan's, and not adopted, or already the new session's, and released
// from its table.
func (ep *Endpoint) checkPaused() {
	ep.mu.Lock()
	sts := []*state{ep.cur, ep.orphan}
	now := ep.now()
	limit := int64(ep.cfg.UserTimeout)
	next := int64(-1)
	for _, st := range sts {
		if st == nil {
			continue
		}
		for i := range st.conns {
			c := st.conns[i].Load()
			if c == nil {
				continue
			}
			at := c.pausedAt.Load()
			if at == 0 {
				continue
			}
			if waited := now - (at - 1); waited >= limit {
				c.fail(timeoutErr(fmt.Sprintf("peer unreachable for %v", ep.cfg.UserTimeout), nil))
				c.abandon()
			} else if left := limit - waited; next < 0 || left < next {
				next = left
			}
		}
	}
	ep.mu.Unlock()
	if next >= 0 {
		ep.armPauseCheck(time.Duration(next))
	}
}

// runWatch ends the session when the device has reported its peer
// suspect for the silent timeout (ntb.Liveness, Config.SilentTimeout):
// its connections fail as silent. A peer that is heard again within it
// costs only the wait.
func (ep *Endpoint) runWatch(lv ntb.Liveness) {
	defer ep.pollers.Done()
	watcher, _ := ep.dev.(ntb.LinkWatcher)
	limit := ep.cfg.SilentTimeout
	var since time.Time
	for {
		var changed <-chan struct{}
		if watcher != nil {
			changed = watcher.LinkChanged()
		}
		suspect := ep.dev.Link() == ntb.LinkUp && lv.Suspect()
		// A look every quarter of the timeout (a device need not signal
		// LinkChanged when it suspects), at least watchMin apart: a
		// suspicion is acted on between one and one and a quarter
		// timeouts after it began, or watchMin after.
		period := min(max(limit/4, watchMin), watchMax)
		switch {
		case !suspect:
			since = time.Time{}
		case since.IsZero():
			since = time.Now()
			period = min(period, limit)
			ep.logf("peer suspect: connections wait for it, and fail if it stays suspect for %v", limit)
		case time.Since(since) >= limit:
			ep.mu.Lock()
			st := ep.cur
			ep.mu.Unlock()
			if st != nil {
				st.sess.Fail(&partition.DownError{Cause: ntb.CauseSilent, Reason: fmt.Sprintf("peer suspect for %v", limit)})
			}
			since = time.Now()
		}
		t := time.NewTimer(period)
		select {
		case <-ep.watchStop:
			t.Stop()
			return
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}
