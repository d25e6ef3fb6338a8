package proxy

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/pool"
)

// A leg is the part of a proxied connection between two proxies. Its bytes
// are numbered, and the sender keeps what the receiver has not yet
// acknowledged, so the leg can move from one transport to another — the
// NTB link, RDMA, the TCP fallback — without losing, repeating or
// reordering a byte: when its transport fails the dialing proxy connects
// again over the next of the route's hops and both ends resume from what the other has received; when
// the NTB link is back, it moves back the same way. The applications see at
// most a pause.
//
// Frames on a transport (header little-endian):
//
//	off  size  field
//	  0     1  type: legData, legAck, legFin, legReset
//	  1     8  seq: the first byte's number (data), the next byte expected
//	           (ack), the stream's length (fin)
//	  9     4  payload length (data; 0 otherwise), at most legMaxPayload
//	           and what the peer said it takes (legLimits.frame)
//	 13        payload
//
// Trust: a leg's token only names it. The dialing proxy picks a random
// secret (legSecretLen bytes) when it opens the leg, inside a channel
// authenticated as its host (the NTB link, or TLS on the TCP fallback and
// the RDMA bootstrap), and a resume must present it over a channel
// authenticated as the same host; a resume that does not is refused
// before it touches the leg (see leg.resumes).
//
// Memory: at most legMaxUnacked bytes wait for an acknowledgement per
// direction; a writer beyond that waits (back-pressure, nothing dropped).
// No more than the peer's receive buffer (its window, exchanged when the
// leg opens) is in flight unacknowledged. The receiver acknowledges every
// legAckEvery bytes (a quarter of its buffer or the peer's, if less) and at
// a FIN.
//
// Copies: both queues are byteRings. The pump reads the application's
// bytes straight into the unacknowledged ring and the sender writes them
// from there onto the transport; the receiver reads a payload straight
// into the received ring and the deliverer writes it from there to the
// application: one copy in and one out at each proxy, as a ring-to-ring
// splice would take, and nothing moves when bytes are acknowledged or
// delivered. In shared-pool mode (pool.go) the application's slot is
// both queues: the pump and the deliverer are gone, the sender writes
// from the slot's out ring and the receiver reads into its in ring. A frame with more than legInline bytes of payload goes out
// as two writes, header and payload, so that the payload is not copied
// into a frame first; the receiver stages headers and small frames in a
// buffer of legStage bytes and reads larger payloads past it.
const (
	legData  byte = 1
	legAck   byte = 2
	legFin   byte = 3
	legReset byte = 4 // the sender's end is closed, its stream cut short after what it sent: nothing will be resumed

	legHdr = 13
	// legMaxPayload is the largest data payload a proxy takes in a frame,
	// and sends to a peer that takes as much: a leg frame is one record
	// on the rack link (its MTU), and with 64 KiB records, the
	// transport's default, the wake-ups and hand-offs a record cost the
	// ntproxys a tenth to a fifth more CPU a byte of a large file
	// (docs/perf-log.md, 2026-12-03). legOldPayload is what a peer that
	// does not say takes.
	legMaxPayload = 256 << 10
	legOldPayload = 64 << 10
	legMaxUnacked = 8 << 20 // a power of two: the size of a full byteRing
	legAckEvery   = 256 << 10
	legInline     = 8 << 10 // larger payloads are not copied into a frame
	legStage      = legHdr + legInline
	// legIOMax bounds one read from and one write to the application: the
	// deliverer acknowledges after each write, so one must stay well below
	// legMaxUnacked for the sender to keep going meanwhile.
	legIOMax = legAckEvery

	// resumePort is the port of every rack link on which proxies take
	// resumed legs.
	resumePort = 65535
	// legSecretLen is the size of a leg's resume secret: 256 random bits,
	// far beyond guessing.
	legSecretLen = 32
	// legResumeWait bounds an outage: a leg not resumed by then ends.
	legResumeWait = 10 * time.Second
)

var errLegProtocol = errors.New("leg protocol violation")

// newLegSecret draws a leg's resume secret.
func newLegSecret() ([]byte, error) {
	b := make([]byte, legSecretLen)
	if _, err := rand.Read(b); err != nil {
		return nil, err
	}
	return b, nil
}

// resumes reports whether a resume of l by host, presenting secret, may
// move it: l was opened by host (it is not this side's own dial) and the
// secret is l's. It reads nothing of l that changes and touches nothing:
// a refused resume leaves the connection as it was.
func (l *leg) resumes(host string, secret []byte) bool {
	return !l.dialer && l.key.from == host && l.peer.Host == host &&
		len(l.secret) == legSecretLen && subtle.ConstantTimeCompare(l.secret, secret) == 1
}

// legLimits is what a leg's peer said, opening it (appproto.RackOpen,
// DialReply): its receive buffer (0: legMaxUnacked, a peer that did not
// say) and the largest data payload it takes in a frame (0:
// legOldPayload).
type legLimits struct {
	window, frame int
}

// legKey names a leg at both proxies: the dialing host and its token.
type legKey struct {
	from  string
	token uint64
}

type leg struct {
	s         *Server
	pc        *pconn
	app       net.Conn // the application's end (shared-pool mode: only closed)
	peer      config.Peer
	key       legKey
	secret    []byte     // the resume secret (legSecretLen bytes; see resumes)
	dialer    bool       // this side reconnects
	slot      *pool.Slot // shared-pool mode: the application's rings, else nil
	peerWin   uint64     // the peer's receive buffer: the most in flight unacknowledged
	peerFrame int        // the largest data payload the peer takes
	ended     atomic.Bool
	busy      sync.WaitGroup // goroutines that may touch the rings

	dmu sync.Mutex
	// dmu protects the following fields. The receive loop only queues
	// (it never blocks, so the peer's frames — acknowledgements too —
	// always flow); runDeliver writes the queue to the application.
	dcond       *sync.Cond
	rx          byteRing // received, not yet delivered: rxDelivered..rxSeq (≤ the peer's legMaxUnacked)
	rxSeq       uint64   // bytes received
	rxDelivered uint64   // bytes written to the application
	rxAcked     uint64   // rxDelivered last acknowledged
	finAt       int64    // the peer's stream length once its FIN came, else -1
	finDone     bool     // the FIN is passed on to the application
	peerReset   bool     // the peer's leg ended short (resetByPeer): the leg ends once rx is delivered
	dclosed     bool
	rxBusy      bool       // a receive loop reads into rx's free room (outside dmu)
	delivering  bool       // a goroutine writes rx's bytes to the application (outside dmu)
	rxBurst     burstMeter // small frames received (deliverInlineLocked)
	discard     bool       // the application closed: drop what arrives (appStoppedLocked, poolIn)

	mu sync.Mutex
	// mu protects the following fields.
	cond      *sync.Cond // transport change, acknowledgement, new data, close
	cur       net.Conn   // nil between transports
	ackWanted uint64     // acknowledge this much (runSend sends it)
	ackSent   uint64
	path      string     // cur's path: ctlapi.PathNTB, PathRDMA or PathTCP
	gen       uint64     // bumped at every transport change
	tx        byteRing   // the application's bytes not yet acknowledged, from tx.base
	sent      uint64     // bytes written on cur (≥ tx.base)
	writing   bool       // a goroutine holds the write turn (writeDueLocked)
	txBurst   burstMeter // the application's writes queued (sendInline)
	finQueued bool       // the application finished writing at tx.end()
	finSent   bool       // the FIN, or the reset that takes its place, is written
	closed    bool
	down      time.Time // when the current outage began
	switches  int
	lastPause time.Duration
	// resetQueued: the application's stream ended short (endShort): a
	// reset, not a FIN, follows its last byte.
	resetQueued bool
	resetSent   bool // that reset is written (see writeDueLocked)
}

// newLeg starts a leg over its first transport c; in shared-pool mode
// (pc.slot set) its queues are the slot's rings. lim is what the peer
// said of its receive buffer and frames (legLimits).
func (s *Server) newLeg(pc *pconn, app net.Conn, peer config.Peer, key legKey, dialer bool, c net.Conn, path string, lim legLimits) *leg {
	l := &leg{s: s, pc: pc, app: app, peer: peer, key: key, secret: pc.secret, dialer: dialer, finAt: -1,
		rx: newByteRing(legMaxUnacked), tx: newByteRing(legMaxUnacked), peerWin: legMaxUnacked, peerFrame: legOldPayload}
	if lim.window > 0 {
		l.peerWin = uint64(min(lim.window, legMaxUnacked))
	}
	if lim.frame > 0 {
		l.peerFrame = min(lim.frame, legMaxPayload)
	}
	if pc.slot != nil {
		l.slot = pc.slot.Slot
		l.tx = byteRing{buf: l.slot.Out, max: len(l.slot.Out)}
		l.rx = byteRing{buf: l.slot.In, max: len(l.slot.In)}
	}
	l.cond = sync.NewCond(&l.mu)
	l.dcond = sync.NewCond(&l.dmu)
	l.cur, l.path, l.gen = c, path, 1
	pc.leg = l
	return l
}

// run registers the leg and moves bytes until both directions finish or
// it fails for good; then it closes both ends.
func (s *Server) runLeg(a *app, l *leg) {
	pc := l.pc
	pc.ends = [2]net.Conn{l.app, nil}
	s.mu.Lock()
	if s.closed || a.gone {
		s.mu.Unlock()
		l.close(errors.New("application gone"))
		return
	}
	s.conns[pc.id] = pc
	a.conns[pc.id] = pc
	s.legs[l.key] = l
	s.wg.Add(4)
	s.mu.Unlock()
	l.mu.Lock()
	c, gen := l.cur, l.gen
	l.busy.Add(2)
	l.mu.Unlock()
	go func() { defer s.wg.Done(); defer l.busy.Done(); l.runSend() }()
	go func() { defer s.wg.Done(); defer l.busy.Done(); l.runRecv(c, gen) }()
	if l.slot == nil {
		go func() { defer s.wg.Done(); l.runDeliver() }()
	} else {
		s.wg.Done()
	}
	if l.dialer {
		go func() { defer s.wg.Done(); l.runFailForward() }()
	} else {
		s.wg.Done()
	}
	if l.slot == nil {
		l.runPump()
		return
	}
	l.runPool()
	l.busy.Wait()
	l.releaseSlot(a)
}

// runPump reads the application straight into the unacknowledged ring,
// queueing its bytes for the peer; it waits while the ring is full.
func (l *leg) runPump() {
	frame := make([]byte, legStage)
	for {
		l.mu.Lock()
		var room []byte
		for !l.closed {
			// Only the pump adds to tx: room stays ours while unlocked.
			if room = l.tx.free(ringMinSize, legIOMax); len(room) > 0 {
				break
			}
			l.cond.Wait()
		}
		if l.closed {
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
		n, err := l.app.Read(room)
		if n > 0 {
			l.mu.Lock()
			l.tx.commit(n)
			l.pc.inFlight[0].Store(int64(l.tx.n))
			l.sendInline(frame)
			l.mu.Unlock()
			l.pc.bytesTX.Add(uint64(n))
			l.pc.msgsTX.Add(1)
		}
		if errors.Is(err, io.EOF) {
			l.mu.Lock()
			l.finQueued = true
			l.cond.Broadcast()
			l.mu.Unlock()
			return
		}
		if err != nil {
			l.endShort(fmt.Errorf("application: %w", err))
			return
		}
	}
}

// endShort: the application's stream ended short — it aborted its
// connection, or its end failed (cause). What it wrote is still sent, in
// order, and then a reset instead of a FIN (writeDueLocked), so that the
// far application reads every byte, then ECONNRESET. A FIN already sent
// stays: the far end has read io.EOF, and the leg ends as after a close.
func (l *leg) endShort(cause error) {
	l.mu.Lock()
	if l.closed || l.resetQueued { // closed: the leg's own close ended the application's end
		l.mu.Unlock()
		return
	}
	l.finQueued, l.resetQueued = true, true
	l.cond.Broadcast()
	l.mu.Unlock()
	l.s.logf("leg %s/%d: a reset follows the application's last byte: %v", l.key.from, l.key.token, cause)
}

// runSend writes on the current transport what nobody else writes: the
// deliverer's acknowledgements, bulk the pump leaves to it, what a new
// transport must send again, the FIN. It and the pump's inline sends
// (sendInline) take turns: one writer at a time holds l.writing.
func (l *leg) runSend() {
	frame := make([]byte, legStage)
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		for !l.closed && (l.writing || !l.dueLocked()) {
			l.cond.Wait()
		}
		if l.closed {
			return
		}
		l.writeDueLocked(frame)
	}
}

// sendInline has the goroutine that just queued bytes write them itself
// when nobody holds the write turn and they fit one small frame, copied
// whole (legInline; mu held): a request then leaves the proxy on the
// goroutine that read it, with no hand-off to runSend and its wake-up.
// Bulk is left to runSend, so that reading the next bytes and writing
// these overlap, and so is a burst (burstMeter).
func (l *leg) sendInline(frame []byte) {
	if l.txBurst.burst(time.Now().UnixNano()) || l.writing || l.cur == nil || l.tx.end()-l.sent > legInline {
		l.cond.Broadcast()
		return
	}
	l.writeDueLocked(frame)
}

// dueLocked: there is a transport and something to write on it.
func (l *leg) dueLocked() bool {
	return l.cur != nil && (l.ackWanted != l.ackSent || l.sendable() > 0 || l.finDueLocked())
}

// writeDueLocked takes the write turn and writes acknowledgements, queued
// bytes and the FIN while any is due; mu is held on entry and on return,
// and released around each write. Whatever becomes due meanwhile it
// writes too: the turn's holder looks again before it lets go, so whoever
// waited for the turn has nothing left to do when it ends.
func (l *leg) writeDueLocked(frame []byte) {
	l.writing = true
	defer func() { l.writing = false }()
	for !l.closed && l.dueLocked() {
		c, gen, seq := l.cur, l.gen, l.sent
		var b, payload []byte
		var n uint64
		ack, fin, reset := false, false, false
		switch {
		case l.ackWanted != l.ackSent:
			ack, seq = true, l.ackWanted
			b = putLegHdr(frame, legAck, seq, 0)
		case l.sendable() > 0:
			// p stays intact while unlocked: only an acknowledgement
			// frees bytes for the pump to reuse, and the peer acknowledges
			// only bytes it has received — from this write once it has
			// copied them, or from an earlier transport, and then c has
			// been replaced and the peer ignores what still arrives on it.
			p := l.tx.span(seq, min(l.peerFrame, l.sendable()))
			n = uint64(len(p))
			b = putLegHdr(frame, legData, seq, len(p))
			if len(p) <= legInline {
				copy(b[legHdr:], p)
			} else {
				b, payload = b[:legHdr], p
			}
		case l.resetQueued:
			// finDueLocked, the stream cut short. The transport stays
			// open: the peer ends it once it has read the reset
			// (resetByPeer, or close). Its writes must not fail sooner:
			// a failed write ends its leg, and what it has yet to read
			// would be lost. Lost with a failing transport, the reset is
			// sent again after a resume, as a FIN is.
			fin, reset = true, true
			b = putLegHdr(frame, legReset, 0, 0)
		default: // finDueLocked
			fin = true
			b = putLegHdr(frame, legFin, seq, 0)
		}
		l.mu.Unlock()
		_, err := c.Write(b)
		if err == nil && payload != nil {
			_, err = c.Write(payload)
		}
		l.mu.Lock()
		if gen == l.gen && err == nil {
			switch {
			case ack:
				l.ackSent = seq
			case fin:
				l.finSent, l.resetSent = true, reset
			default:
				l.sent = seq + n
			}
		}
		if err != nil || fin {
			l.mu.Unlock()
			if err != nil {
				l.fail(gen, err)
			}
			if fin {
				l.maybeDone()
			}
			l.mu.Lock()
		}
	}
}

// finDueLocked: the application finished writing, and all it wrote is sent.
func (l *leg) finDueLocked() bool {
	return l.finQueued && !l.finSent && l.sent == l.tx.end()
}

// sendable is how many queued bytes may go out now: those not yet sent,
// as far as the peer's buffer has room.
func (l *leg) sendable() int {
	inFlight := l.sent - l.tx.base
	if inFlight >= l.peerWin {
		return 0
	}
	return int(min(l.tx.end()-l.sent, l.peerWin-inFlight))
}

// putLegHdr writes a header into frame and returns the frame of a payload
// of n bytes (frame[:legHdr] when n is larger than frame has room for).
func putLegHdr(frame []byte, typ byte, seq uint64, n int) []byte {
	frame[0] = typ
	binary.LittleEndian.PutUint64(frame[1:], seq)
	binary.LittleEndian.PutUint32(frame[9:], uint32(n))
	return frame[:min(legHdr+n, len(frame))]
}

// runRecv reads transport c (generation gen) until it fails or the leg
// moves to another one. It stages headers and small frames in a buffer of
// its own and reads larger payloads straight into rx.
func (l *leg) runRecv(c net.Conn, gen uint64) {
	st := make([]byte, legStage)
	r, w := 0, 0 // st[r:w]: read from c, not yet taken
	for {
		if w-r < legHdr {
			w, r = copy(st, st[r:w]), 0
			for w < legHdr {
				k, err := c.Read(st[w:])
				w += k
				if err != nil && w < legHdr {
					if errors.Is(err, io.EOF) && w > 0 {
						err = io.ErrUnexpectedEOF
					}
					l.fail(gen, err)
					return
				}
			}
		}
		hdr := st[r : r+legHdr]
		r += legHdr
		typ, seq, n := hdr[0], binary.LittleEndian.Uint64(hdr[1:]), binary.LittleEndian.Uint32(hdr[9:])
		if n > legMaxPayload || (typ != legData && n != 0) {
			l.fail(gen, fmt.Errorf("%w: frame type %d, length %d", errLegProtocol, typ, n))
			return
		}
		var err error
		switch typ {
		case legData:
			head := st[r : r+min(w-r, int(n))]
			r += len(head)
			if len(head) < int(n) {
				r, w = 0, 0 // all staged bytes taken: st is scratch for receive
			}
			err = l.receive(c, gen, seq, int(n), head, st)
		case legAck:
			err = l.acked(seq)
		case legFin:
			err = l.finished(gen, seq)
		case legReset:
			l.resetByPeer()
			return
		default:
			err = fmt.Errorf("%w: frame type %d", errLegProtocol, typ)
		}
		if errors.Is(err, errStale) {
			return
		}
		if err != nil {
			l.fail(gen, err)
			return
		}
	}
}

var errStale = errors.New("transport replaced")

func (l *leg) generation() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.gen
}

// receive queues the part not yet received of a data frame of n bytes at
// seq, whose first bytes, head, runRecv has staged; the rest it reads from
// c, straight into rx. Once head is queued scratch (which may hold head)
// is free for bytes to drop.
func (l *leg) receive(c net.Conn, gen, seq uint64, n int, head, scratch []byte) error {
	l.dmu.Lock()
	// Only one receive loop reads into rx at a time: a replaced
	// transport's may still be in a read, until its transport is closed.
	for l.rxBusy && !l.dclosed {
		l.dcond.Wait()
	}
	if l.dclosed || l.generation() != gen {
		l.dmu.Unlock()
		return errStale
	}
	if seq > l.rxSeq {
		l.dmu.Unlock()
		return fmt.Errorf("%w: data at %d, expected %d", errLegProtocol, seq, l.rxSeq)
	}
	skip := int(min(l.rxSeq-seq, uint64(n))) // seen before a resume
	keep := n - skip
	switch {
	case keep > 0 && l.finAt >= 0:
		l.dmu.Unlock()
		return fmt.Errorf("%w: data after the fin", errLegProtocol)
	case keep > l.rx.max-l.rx.n:
		l.dmu.Unlock()
		return fmt.Errorf("%w: the peer sent beyond its window", errLegProtocol)
	}
	d := min(skip, len(head))
	skip -= d
	if h := head[d:]; len(h) > 0 {
		l.rx.put(h) // fits: checked above
		l.rxSeq += uint64(len(h))
		keep -= len(h)
		if skip+keep > 0 || !l.deliverInlineLocked() {
			l.rxAddedLocked()
		}
	}
	if skip+keep == 0 {
		l.dmu.Unlock()
		return nil
	}
	l.rxBusy = true
	l.dmu.Unlock()
	err := l.receiveRest(c, gen, skip, keep, scratch)
	l.dmu.Lock()
	l.rxBusy = false
	l.dcond.Broadcast()
	l.dmu.Unlock()
	return err
}

// receiveRest drops skip bytes from c, then reads keep bytes from c into
// rx's free room (rxBusy held).
func (l *leg) receiveRest(c net.Conn, gen uint64, skip, keep int, scratch []byte) error {
	var err error
	for skip > 0 && err == nil {
		var k int
		k, err = c.Read(scratch[:min(skip, len(scratch))])
		skip -= k
	}
	for keep > 0 && err == nil {
		l.dmu.Lock()
		room := l.rx.free(keep, keep) // only the rxBusy holder adds to rx
		l.dmu.Unlock()
		var k int
		k, err = c.Read(room)
		l.dmu.Lock()
		if l.generation() != gen {
			l.dmu.Unlock()
			return errStale
		}
		l.rx.commit(k)
		l.rxSeq += uint64(k)
		keep -= k
		if k > 0 {
			l.rxAddedLocked()
		}
		l.dmu.Unlock()
	}
	if skip+keep > 0 && errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF // inside a frame
	}
	if skip+keep == 0 {
		return nil
	}
	return err
}

// runDeliver writes what was received to the application, in order,
// straight from rx, and has it acknowledged every legAckEvery bytes and
// at the end. It and the receive loop's inline deliveries
// (deliverInlineLocked) take turns: one writer at a time holds
// l.delivering.
func (l *leg) runDeliver() {
	for {
		l.dmu.Lock()
		for !l.dclosed && (l.delivering || (l.rx.n == 0 && !(l.finAt >= 0 && !l.finDone) && !l.peerReset)) {
			l.dcond.Wait()
		}
		if l.dclosed {
			l.dmu.Unlock()
			return
		}
		if l.rx.n == 0 && l.peerReset {
			// All that came before the peer's reset is delivered (or
			// dropped, the application having closed): end the leg,
			// which aborts the application's end unless its stream
			// ended in full.
			l.dmu.Unlock()
			l.close(nil)
			return
		}
		// Only the turn's holder takes bytes off rx: p stays intact unlocked.
		p := l.rx.span(l.rx.base, legIOMax)
		n := len(p)
		fin := n == 0
		discard := l.discard
		l.delivering = true
		l.dmu.Unlock()
		var err error
		switch {
		case discard: // see appStoppedLocked
		case fin:
			cw, ok := l.app.(interface{ CloseWrite() error })
			if !ok || cw.CloseWrite() != nil {
				err = errors.New("half close failed")
			}
		default:
			_, err = l.app.Write(p)
		}
		l.dmu.Lock()
		l.delivering = false
		if err != nil {
			l.appStoppedLocked()
			l.dmu.Unlock()
			l.maybeDone()
			continue
		}
		ack := l.deliveredLocked(l.rx.base+uint64(n), fin)
		l.dmu.Unlock()
		l.wantAck(ack, fin)
	}
}

// appStoppedLocked: a write to the application failed (dmu held). Its
// end has closed, or failed. Either way the pump decides the leg's fate:
// a closed end's last bytes, and its CLOSE after them, are still to be
// read (they came before the write could fail), and the leg must carry
// them to the peer in full; a failed one's Read fails too, and the pump
// ends the leg. Until then, what arrives is dropped, as a closed socket
// drops it, and acknowledged, so the peer's sender does not stall.
func (l *leg) appStoppedLocked() {
	l.discard = true
	l.dropLocked()
	l.dcond.Broadcast()
}

// roomer is an application connection that says how many bytes a Write
// may take now without waiting for the application to read
// (transport.Conn).
type roomer interface{ WriteRoom() int64 }

// deliverInlineLocked writes rx's bytes, just received, to the
// application on the receiving goroutine itself (dmu held; released
// around the write) when they fit one small frame, they are all rx holds,
// nobody else is delivering, and the application's connection has the
// credit for them, and they do not come in a burst (burstMeter): a reply
// then leaves the proxy on the goroutine that
// read it, with no hand-off to runDeliver and its wake-up. The write
// cannot wait for the application to read, which would stop the receive
// loop and the peer's acknowledgements behind it. It reports whether it
// delivered (the deliverer has then nothing to do for these bytes).
func (l *leg) deliverInlineLocked() bool {
	r, ok := l.app.(roomer)
	if !ok || l.rxBurst.burst(time.Now().UnixNano()) || l.slot != nil || l.discard || l.delivering || l.dclosed || l.rx.n > legInline || r.WriteRoom() < int64(l.rx.n) {
		return false
	}
	p := l.rx.span(l.rx.base, l.rx.n)
	if len(p) != l.rx.n { // wraps: the deliverer writes it in two
		return false
	}
	l.delivering = true
	l.dmu.Unlock()
	_, err := l.app.Write(p)
	l.dmu.Lock()
	l.delivering = false
	if err != nil {
		return false // runDeliver meets the error again and acts on it
	}
	ack := l.deliveredLocked(l.rx.base+uint64(len(p)), false)
	if l.rx.n > 0 || l.finAt >= 0 {
		l.dcond.Broadcast() // more for runDeliver
	}
	if ack > 0 {
		l.dmu.Unlock()
		l.wantAck(ack, false)
		l.dmu.Lock()
	}
	return true
}

// deliveredLocked records (dmu held) that rx's bytes before seq have
// reached the application, and its FIN if fin; it returns the
// acknowledgement due now (0: none yet): every ackEvery bytes, and at the
// FIN.
func (l *leg) deliveredLocked(seq uint64, fin bool) uint64 {
	if n := seq - l.rx.base; n > 0 {
		l.rx.trim(seq)
		l.rxDelivered = seq
		l.pc.bytesRX.Add(n)
		l.pc.msgsRX.Add(1)
	}
	if fin {
		l.finDone = true
	}
	if fin || l.rxDelivered-l.rxAcked >= l.ackEvery() {
		l.rxAcked = l.rxDelivered
		return l.rxDelivered
	}
	return 0
}

// wantAck has runSend acknowledge up to ack (dmu not held), and after the
// FIN (fin) ends the leg if both directions are done.
func (l *leg) wantAck(ack uint64, fin bool) {
	if ack > 0 || fin {
		l.mu.Lock()
		l.ackWanted = max(l.ackWanted, ack)
		l.cond.Broadcast()
		l.mu.Unlock()
	}
	if fin {
		l.maybeDone()
	}
}

// acked drops what the peer has delivered. An acknowledgement behind
// tx.base is old news: a resume already trimmed to what the peer received.
func (l *leg) acked(seq uint64) error {
	l.mu.Lock()
	var err error
	if seq > l.tx.base {
		err = l.trimLocked(seq)
	}
	l.mu.Unlock()
	if err == nil {
		l.maybeDone()
	}
	return err
}

func (l *leg) trimLocked(seq uint64) error {
	if seq < l.tx.base || seq > l.tx.end() {
		return fmt.Errorf("%w: acknowledgement of %d outside %d..%d", errLegProtocol, seq, l.tx.base, l.tx.end())
	}
	l.tx.trim(seq)
	l.sent = max(l.sent, seq)
	l.pc.inFlight[0].Store(int64(l.tx.n))
	l.cond.Broadcast()
	if l.slot != nil {
		l.slot.SetOutTail(seq)
		l.slot.Notify(pool.App)
	}
	return nil
}

// finished: the peer's application is done writing, at seq.
func (l *leg) finished(gen, seq uint64) error {
	l.dmu.Lock()
	defer l.dmu.Unlock()
	if l.generation() != gen {
		return errStale
	}
	if seq != l.rxSeq || (l.finAt >= 0 && uint64(l.finAt) != seq) {
		return fmt.Errorf("%w: fin at %d, received %d", errLegProtocol, seq, l.rxSeq)
	}
	l.finAt = int64(seq)
	l.dcond.Broadcast()
	if l.slot != nil {
		l.slot.SetFlags(pool.Proxy, pool.FlagFin)
		l.setInWantLocked()
		l.slot.Notify(pool.App)
		l.slot.Kick(pool.Proxy) // runPool finishes once the application has read all
	}
	return nil
}

// resetByPeer: the peer's leg ended short (legReset): nothing will be
// resumed, and no FIN will come, but what came before the reset is the
// application's still, and it reads that before the reset (close aborts
// its end). In shared-pool mode all of it is in the in ring: the leg ends
// at once. Through the memory link the leg lets its transport go and the
// deliverer writes out what rx holds, then ends the leg (runDeliver).
func (l *leg) resetByPeer() {
	if l.slot != nil {
		l.close(nil)
		return
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	c := l.cur
	l.cur = nil // nothing more to send: the peer has gone
	l.gen++
	l.cond.Broadcast()
	l.mu.Unlock()
	if c != nil {
		c.Close()
	}
	l.dmu.Lock()
	l.peerReset = true
	l.dcond.Broadcast()
	l.dmu.Unlock()
}

// maybeDone ends the leg once both directions are finished and
// acknowledged — or, once the application has closed (discard) or its
// stream ended with a reset, once its own stream is: what the peer still
// writes would only be dropped, and the peer's writes then fail, as TCP's
// do after the reset a closed socket answers with.
func (l *leg) maybeDone() {
	l.dmu.Lock()
	finDone, discard := l.finDone, l.discard
	l.dmu.Unlock()
	l.mu.Lock()
	sent := l.finSent && l.tx.n == 0
	done := sent && (discard || l.resetSent || finDone && l.ackWanted == l.ackSent)
	l.mu.Unlock()
	if done {
		l.close(nil)
	}
}

// close ends the leg: both ends are closed, the peer's leg sees its
// transport end and, with nothing to resume, ends too. An application
// whose incoming stream did not end in full sees a reset.
func (l *leg) close(cause error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.closed = true
	l.ended.Store(true)
	c := l.cur
	l.cur = nil
	l.gen++
	l.cond.Broadcast()
	sentAll := l.finSent && l.tx.n == 0
	resetSent := l.resetSent
	l.mu.Unlock()
	l.dmu.Lock()
	l.dclosed = true
	l.dcond.Broadcast()
	// What the application reads ended in full: a reader that has all
	// of it sees io.EOF, even if the leg ends before the FIN is passed on.
	whole := l.finDone || (l.finAt >= 0 && l.rxDelivered == uint64(l.finAt))
	if l.slot != nil {
		if !sentAll || !l.finDone {
			l.slot.SetFlags(pool.Proxy, pool.FlagReset)
		}
		l.slot.Kick(pool.App)
		l.slot.Kick(pool.Proxy)
	}
	l.dmu.Unlock()
	if c != nil {
		// Tell the peer's leg not to wait for a resume (best effort: the
		// transport may be why we close), unless the reset after the
		// application's last byte has told it.
		if !resetSent {
			c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
			var frame [legHdr]byte
			c.Write(putLegHdr(frame[:], legReset, 0, 0))
		}
		c.Close()
	}
	// A stream cut short reads as a reset at the application's end, as
	// TCP's does, not as a clean io.EOF (shared-pool mode: FlagReset).
	if a, ok := l.app.(interface{ Abort() error }); ok && l.slot == nil && !whole {
		a.Abort()
	} else {
		l.app.Close()
	}
	if cause != nil {
		l.s.logf("leg %s/%d: closed: %v", l.key.from, l.key.token, cause)
	}
	l.s.mu.Lock()
	if l.s.legs[l.key] == l {
		delete(l.s.legs, l.key)
	}
	l.s.mu.Unlock()
	l.s.forget(l.pc)
}
