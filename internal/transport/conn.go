package transport

import (
	"context"
	"errors"
	"fmt"
	"github.com/ntstack/ntstack/internal/prim/deadline"
	"github.com/ntstack/ntstack/internal/prim/proc"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/prim/pool"
	"github.com/ntstack/ntstack/internal/prim/ring"
	"github.com/ntstack/ntstack/partition"
	"github.com/ntstack/ntstack/qos"
)

// Conn is one connection over the link. It implements net.Conn with the
// standard library's semantics, plus CloseWrite.
type Conn struct {
	ep            *Endpoint
	st            *state
	id            uint32 // ours; frames to us carry it
	peerID        uint32 // theirs; frames we send carry it
	gen, peerGen  uint32 // incarnations of id and peerID
	local, remote Addr

	rlock, wlock     sync.Mutex    // serialise Read calls and Write calls
	rnotify, wnotify chan struct{} // cap 1: something changed for readers / writers
	closedCh         chan struct{} // closed by Close
	rdl, wdl         *deadline.Deadline

	// Receive side. recvd counts bytes taken off the ring for us; read
	// counts bytes the application has read; recvd-read ≤ our window.
	qmu        sync.Mutex
	q          byteQueue // guarded by qmu
	queued     atomic.Int64
	recvd      atomic.Int64
	read       atomic.Int64
	cmu        sync.Mutex       // serialises consumed: Read, and whoever delivers into its posted buffer
	creditOut  int64            // read total last sent as CREDIT; guarded by cmu
	floorOut   int64            // floor last sent as CREDIT (0: none, the window); guarded by cmu
	wants      bool             // its writer asked for a turn and has none yet; guarded by cmu
	creditBuf  [creditSize]byte // the CREDIT being sent, encoded (one of the call's own escapes to the heap); guarded by cmu
	turnsDone  bool             // released: no more turns; guarded by cmu
	ahead      atomic.Int64     // turn credit whose bytes have not arrived (see turns.go)
	turnAt     atomic.Int64     // ep.now() of the grant of c's turn or its latest arrival since
	turnQueued bool             // in the turns line; guarded by state.turns.mu
	turnHeld   bool             // among the turns' holders; guarded by state.turns.mu
	aheadSeen  int64            // ahead at the last look for unused turns (-1: a turn since); guarded by state.turns.mu

	rxmu sync.Mutex // serialises delivery of the peer's frames
	// rxmu protects the following fields; rxPart is also read atomically.
	held   []heldFrame  // frames from a partition the peer moved us to, early
	rxPart atomic.Int32 // partition the peer sends on; -1 until known
	rbuf   []byte       // a blocked Read's buffer, posted for delivery; nil once full
	rn     int          // bytes delivered into the posted buffer
	rcount int          // bytes of rn counted as read (see actLocked)
	rready atomic.Bool  // rn > 0
	// restWaits: the rest of a record this connection's Read took part of
	// waits at the head of its ring (state.headOff). Set and cleared
	// under the ring's RX lock.
	restWaits atomic.Bool
	// cut: the last poll of this connection's Read took a piece of a
	// record rather than all b held (state.piece; its goroutine only).
	cut bool
	// inRead is set while a Read runs; readerLeft marks the return of
	// the last one, and readerAt is when a look found it (readerRecent).
	inRead     atomic.Bool
	readerLeft atomic.Bool
	readerAt   atomic.Int64

	bigAt     atomic.Int64 // ep.now()+1 when a DATA record of more than smallWrite last came (0: never)
	smallAt   atomic.Int64 // ep.now()+1 when a small DATA record last came while c was not bulk (0: never)
	bulkEpoch atomic.Int64 // the last period (of smallRecent) c was counted as bulk in, plus 1 (0: never)

	// Send side. sent-peerRead ≤ window, the peer's receive window.
	window   int64
	sent     atomic.Int64
	peerRead atomic.Int64
	prio     atomic.Uint32 // qos.Class
	sleepers atomic.Int32  // goroutines parked on this connection
	sporadic atomic.Bool   // its last park outlasted busySpin: its waits keep SpinBudget (see spinner)
	wdone    atomic.Bool   // the posted write has gone out
	wantOut  atomic.Bool   // a WANT to send once the serve pass has published (see unit.serve)

	smu sync.Mutex // taken by whoever serves the connection
	// smu protects the following fields.
	unit       *unit
	slot       int // the partition in unit.parts
	inSched    bool
	unplaced   bool       // released: counted on no unit
	frames     []ctlFrame // connection frames to send before more data
	out        []byte     // the posted write
	outOff     int
	waitCredit bool
	peerFloor  int64 // the credit floor from the peer's last CREDIT (0: none, the window)
	peerPooled bool  // the peer gives credit in turns: ask (WANT) when waiting for it
	wantSent   bool  // WANT sent since the writer last waited for credit
	moving     bool  // move to moveUnit/moveSlot before sending more
	moveUnit   *unit
	moveSlot   int
	txBytes    uint64
	txMark     uint64 // txBytes at the last rebalance

	flags atomic.Uint32 // fast-path summary of the state below

	mu sync.Mutex
	// mu protects the following fields.
	state              connState
	finSent, closeSent bool
	closeRecv, idFreed bool
	quotaHeld          int64 // receive-window memory reserved (Config.MemoryQuota)
	err                error // terminal: refused, session ended
	localClosed        bool
}

// heldFrame is a frame that arrived early on the partition of a MOVE not
// yet read.
type heldFrame struct {
	part    int
	kind    uint32
	payload []byte
}

type connState uint8

const (
	connDialing connState = iota
	connEstablished
	connRefused
)

// flags
const (
	fEOF       = 1 << iota // peer sent FIN or CLOSE: reads end when the queue is empty
	fPeerGone              // peer sent CLOSE: writes fail
	fFailed                // c.err is set
	fClosed                // Close was called
	fWriteShut             // CloseWrite was called
)

var _ net.Conn = (*Conn)(nil)

func newConn(ep *Endpoint, local, remote Addr) *Conn {
	c := &Conn{
		ep:       ep,
		local:    local,
		remote:   remote,
		rnotify:  make(chan struct{}, 1),
		wnotify:  make(chan struct{}, 1),
		closedCh: make(chan struct{}),
		rdl:      deadline.New(),
		wdl:      deadline.New(),
	}
	c.rxPart.Store(-1)
	return c
}

// wake signals ch, one of c's notify channels; if a goroutine of c is
// parked, the endpoint's spinner yields soon so that it runs (see spin).
func (c *Conn) wake(ch chan struct{}) {
	signal(ch)
	if c.sleepers.Load() > 0 {
		c.ep.handoffs.Add(1)
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// ID is the connection's id on this side of the link, for logs.
func (c *Conn) ID() uint32 { return c.id }

func (c *Conn) LocalAddr() net.Addr  { return c.local }
func (c *Conn) RemoteAddr() net.Addr { return c.remote }

// Setting a deadline wakes a parked call, which parks again watching it
// (see park).
func (c *Conn) SetDeadline(t time.Time) error {
	c.SetReadDeadline(t)
	c.SetWriteDeadline(t)
	return nil
}

func (c *Conn) SetReadDeadline(t time.Time) error {
	c.rdl.Set(t)
	signal(c.rnotify)
	return nil
}

func (c *Conn) SetWriteDeadline(t time.Time) error {
	c.wdl.Set(t)
	signal(c.wnotify)
	return nil
}

func (c *Conn) opErr(op string, err error) error {
	return &net.OpError{Op: op, Net: "ntb", Source: c.local, Addr: c.remote, Err: err}
}

// Read reads what the peer wrote, blocking until at least one byte is
// there, the peer finished (io.EOF), the deadline passed or the
// connection failed.
func (c *Conn) Read(b []byte) (int, error) {
	c.ep.calls.Add(1)
	c.rlock.Lock()
	defer c.rlock.Unlock()
	c.ep.enterCall()
	defer c.ep.exitCall()
	c.inRead.Store(true)
	c.cut = false
	sp := spinner{ep: c.ep, short: c.sporadic.Load()}
	defer sp.stop()
	n, err := c.readLoop(b, &sp)
	if m := c.unpost(); m > 0 { // delivered into b on the way out
		n, err = m, nil
	}
	if n > 0 {
		c.ep.noteProgress() // records moved (see state.pollServe)
	}
	if n > yieldAbove && (!c.restWaits.Load() || c.cut) && (c.ep.cfg.HandOff || c.st.smallLately()) {
		runtime.Gosched() // still in Read: its next records wait for it
	}
	c.readerLeft.Store(true)
	c.inRead.Store(false)
	return n, err
}

// readerRecent reports whether c's reader, outside Read, left it within
// readerBack before now (see state.leaveForReader). Read marks its return
// rather than read the clock (8 % of a 4 KiB reader's CPU): the first look
// after it turns the mark into now. A mark can be old — nobody looked
// while the reader was away — and then one look counts the reader as
// just gone and a record waits for it readerBack longer at most.
func (c *Conn) readerRecent(now int64) bool {
	if c.readerLeft.Load() {
		c.readerAt.Store(now)
		c.readerLeft.Store(false)
		return true
	}
	return now-c.readerAt.Load() <= int64(readerBack)
}

// yieldAbove: a Read or Write moving more than this yields the processor
// once per record it moves. The Go scheduler does not preempt a goroutine
// for 10 ms, and a bulk flow that calls Write again the moment it returns
// would hold a P that long while a request/response flow of the same
// process waits to run; small transfers, whose latency it is, never pay
// the ~100 ns. A Read yields only while the link carries such a flow
// (state.smallLately), or in a process whose goroutines hand messages on
// (Config.HandOff): a bulk reader otherwise handed its processor to
// the other bulk readers once per record, and runs of its own records
// went with it (16 KiB reads, 5 alternating runs: one connection 20.7 ->
// 22.2 GB/s, 8 connections 18.0 -> 18.6, 16 17.8 -> 18.2; 3 runs: 64
// connections 17.3 -> 19.1).
const yieldAbove = 4 << 10

func (c *Conn) readLoop(b []byte, sp *spinner) (int, error) {
	for {
		if c.rready.Load() {
			if m := c.unpost(); m > 0 {
				return m, nil
			}
		}
		if f := c.flags.Load(); f&fClosed != 0 {
			return 0, c.opErr("read", net.ErrClosed)
		}
		if c.rdl.Passed() {
			return 0, c.opErr("read", os.ErrDeadlineExceeded)
		}
		if len(b) == 0 {
			return 0, nil
		}
		if c.queued.Load() > 0 {
			if m := c.unpost(); m > 0 {
				return m, nil
			}
			c.qmu.Lock()
			n := c.q.pop(b)
			c.qmu.Unlock()
			c.queued.Add(int64(-n))
			c.consumed(n)
			return n, nil
		}
		if f := c.flags.Load(); f&(fEOF|fFailed) != 0 {
			if c.queued.Load() > 0 || c.rready.Load() {
				continue // arrived just before the end
			}
			if f&fEOF != 0 {
				return 0, io.EOF
			}
			return 0, c.opErr("read", c.failure())
		}
		if c.ep.cfg.CoreModel == CoreInline {
			if n, _ := c.st.poll(c, b); n > 0 {
				return n, nil
			}
		}
		c.post(b)
		if !sp.spin() {
			c.park(sp, c.rnotify, c.rdl, nil)
		}
	}
}

// post offers b to whoever delivers the connection's next DATA, so it is
// copied straight from the ring into the reader's buffer, once.
func (c *Conn) post(b []byte) {
	c.rxmu.Lock()
	if c.rbuf == nil && c.rn == 0 && c.queued.Load() == 0 {
		c.rbuf = b
	}
	c.rxmu.Unlock()
}

// unpost withdraws the posted buffer and returns how many bytes were
// delivered into it, counting them as read.
func (c *Conn) unpost() int {
	c.rxmu.Lock()
	n, counted := c.rn, c.rcount
	c.rbuf, c.rn, c.rcount = nil, 0, 0
	c.rready.Store(false)
	c.rxmu.Unlock()
	if n > counted {
		c.consumed(n - counted)
	}
	return n
}

// noteData notes a DATA record of n bytes for c from partition part (its
// RX lock held), arrived at now (ep.now()), for share and sharedShare: a
// record of more than smallWrite marks c as a bulk connection for a while;
// the second small record in that while of a connection that has sent no
// large one marks the partition as carrying latency traffic. A bulk
// connection's own small records do not count — neither the headers
// between its bodies nor the one before its first body, or its first after
// a pause: marked by that, a stream that paused 30 ms then sent a header
// and 8 MiB had its own window cut to SharedWindow for 10 ms (256 CREDITs
// for the 8 MiB against 16 after a 1 ms pause; ntbench's slices lost half
// of each).
func (c *Conn) noteData(part, n int, now int64) {
	now++ // never 0
	pt := &c.st.traffic[part]
	if n > smallWrite {
		c.bigAt.Store(now)
		if e := now / c.ep.smallFor; c.bulkEpoch.Swap(e+1) != e+1 {
			pt.bulk.count(e)
			c.st.bulk.count(e)
			c.st.noteBulkPeriod(e)
		}
		return
	}
	if at := c.bigAt.Load(); at == 0 || now-at > c.ep.smallFor {
		if last := c.smallAt.Swap(now); last != 0 && now-last <= c.ep.smallFor {
			pt.smallAt.Store(now)
		}
	}
}

// bulkReader reports whether c's last DATA record was of more than
// smallWrite, however long ago (a small one after smallFor without a large
// one, noteData's smallAt, makes c a small-message reader again). Asking
// for a large record within smallFor instead, a stream whose writer had
// waited that long in the turns' line counted as a small-message reader:
// at 64 connections 1-7 % of the records were copied twice, into their
// readers' queues, all by such readers (see leaveForReader).
func (c *Conn) bulkReader() bool {
	big := c.bigAt.Load()
	return big != 0 && big >= c.smallAt.Load()
}

// creditEvery is the fraction of the share read before credit goes back
// (a step; at least creditRun beside other connections): one 16-byte
// frame per 512 KiB a lone connection reads with the default window and
// rings. A sixteenth sent a CREDIT for every 64 KiB record 8 connections
// streamed (a share of 512 KiB); an eighth took them from 12.0 to 13.8
// GB/s.
const creditEvery = 8

// creditRun is the least step while other connections share the rings
// and the share holds two steps. A writer out of credit resumes with one
// step and sends it as a run of records; runs of one record interleaved
// the connections record by record in the ring, and each change of
// connection there cost the reader a goroutine switch, and a CREDIT: 8
// connections of 16 KiB reads parked a reader for every other record
// (alternating runs, medians of 5: 18.7 -> 19.6 GB/s; 6 connections 19.5
// -> 20.8). A lone connection keeps an eighth of its share: nobody else
// fills the rings while its writer waits for a larger step (half its
// share cost it 15 %).
const creditRun = 4 * DefaultMTU

// creditStep is the step for a share (see creditEvery and creditRun).
func (st *state) creditStep(share int64) int64 {
	step := share / creditEvery
	if st.live.Load() > 1 {
		step = max(step, min(share/2, creditRun))
	}
	return step
}

// consumed accounts n bytes read by the application, or delivered into
// its posted buffer, and hands credit back once a step (creditStep) has
// been read. The peer was granted the configured window at the handshake;
// when the connection's share of the rings is smaller (state.share), the
// credit reported lags what was read, so that at most the share and a
// step more are in flight.
//
// CREDIT also carries the floor, at most the credit the writer can count
// on once all it sent has been read. A writer waits for that much rather
// than send small records (Conn.creditFloor), so it must come: with the
// last step possibly unreported, the floor is the share when the window
// leaves room for a step more in flight, the share less a step when not;
// beside a small-message flow it is one step. A floor lower than the one
// last sent goes out at once, with no new credit if there is none.
//
// Credit that could not lift the writer to the floor (or DefaultMTU) even
// were all it sent already here is held back for a later read: the writer
// would only wake to wait again. Reading 16 KiB at a time at 64
// connections, whose shares are one record, that was three CREDITs in four
// (10.4 -> 11.4 GB/s). It cannot be held for good: once everything that
// arrived is read, window+grant-recvd is share+extra, at least the floor.
func (c *Conn) consumed(n int) {
	c.cmu.Lock()
	c.creditLocked(c.read.Add(int64(n)))
	wants := c.wants
	c.cmu.Unlock()
	if wants {
		c.st.queueTurn(c) // its reader was too far behind for a turn
	}
	if c.st.turns.nwait.Load() > 0 {
		c.st.serveTurns()
	}
}

// creditLocked hands back credit for total bytes read (cmu held), as
// consumed describes.
func (c *Conn) creditLocked(total int64) {
	window := c.st.window
	share := c.st.share()
	step := c.st.creditStep(share)
	extra := min(step, window-share)
	floor := share + extra - step
	if w := c.st.sharedBound(c, share); w > 0 {
		// Beside a small-message flow: no more than w in flight, and
		// records as small as a step, so a small message waits behind
		// little. Not in turns either (see grantTurn).
		share, step, extra = w, w/creditEvery, 0
		floor = step
	} else if c.st.turnChunkAt(share) > 0 {
		c.creditPooled(total)
		return
	}
	grant := total - (window - share - extra)
	last := c.floorOut
	if last == 0 {
		last = window // what the writer assumes before any CREDIT
	}
	if grant-c.creditOut < step && floor >= last {
		return
	}
	if floor >= last && window+grant-c.recvd.Load() < min(floor, DefaultMTU) {
		return // the writer could not send on it (see above)
	}
	c.creditOut = max(grant, c.creditOut)
	c.sendCreditLocked(floor)
}

// creditPooled is creditLocked while credit goes in turns (see turns.go):
// the baseline of minShare in flight, and a floor of a whole record, with
// floorPooled set, so that a bulk writer asks for a turn rather than send
// on the baseline.
func (c *Conn) creditPooled(total int64) {
	window := c.st.window
	base := min(minShare, window)
	floor := min(DefaultMTU, window) | floorPooled
	grant := total - (window - base)
	if grant-c.creditOut < base/2 && c.floorOut == floor {
		return
	}
	c.creditOut = max(grant, c.creditOut)
	c.sendCreditLocked(floor)
}

// sendCreditLocked sends CREDIT for c.creditOut with floor (cmu held).
func (c *Conn) sendCreditLocked(floor int64) {
	c.floorOut = floor
	c.mu.Lock()
	live := c.state == connEstablished && !c.closeSent
	c.mu.Unlock()
	if live {
		m := creditMsg{consumed: uint64(c.creditOut), gen: c.peerGen, floor: uint32(floor)}
		c.st.sendLoose(c.st.control, kindCredit, c.peerID, c.id, m.encode(c.creditBuf[:0]))
		c.ep.counters.credits.Add(1)
	}
}

// creditFloor is the least credit c sends a DATA record on (smu held):
// the rest of the posted write, one MTU, the peer's floor (see consumed)
// or DefaultMTU, whichever is least. Sending on less cuts records ever
// smaller — a record read in parts comes back as credit in parts — and
// each small record costs a credit round trip and a park on either side
// (the "silly window" TCP avoids the same way). Records of DefaultMTU are
// large enough; waiting for more starves a lone connection's pipe when its
// MTU is the window (segmentation off: 9.1 GB/s sending on any credit, 6.8
// waiting for half the window, 6.2 for the floor).
func (c *Conn) creditFloor() int64 {
	floor := c.peerFloor
	if floor == 0 || floor > c.window {
		floor = c.window // none yet, or more than the window could ever free
	}
	f := max(1, min(int64(len(c.out)-c.outOff), int64(c.ep.cfg.MTU), floor, DefaultMTU))
	if f > smallPiece && c.ep.cfg.MTU <= DefaultMTU && c.unit != nil && c.st.smallTraffic(c.unit.parts[c.slot].Index) {
		f = smallPiece // it sends pieces (see serveOnce)
	}
	return f
}

// Write writes b in frames of at most the MTU, blocking while the peer's
// window or the ring is full. It returns len(b) or an error. b is read by
// whoever serves the connection's unit until Write returns.
func (c *Conn) Write(b []byte) (int, error) {
	c.ep.calls.Add(1)
	c.wlock.Lock()
	defer c.wlock.Unlock()
	c.ep.enterCall()
	defer c.ep.exitCall()
	if err := c.writeErr(); err != nil {
		return 0, err
	}
	if len(b) == 0 {
		return 0, nil
	}
	inline := c.ep.cfg.CoreModel == CoreInline
	if inline && len(b) <= smallWrite && c.sendNow(b) {
		// Take in the credit that came meanwhile, as the schedule's path
		// does before it sends (not under c.smu: a CREDIT for c takes
		// it): a writer whose credit never ran out would otherwise leave
		// its CREDITs in the control ring.
		c.st.pollRing(c.st.control, nil, nil)
		return len(b), nil
	}
	c.smu.Lock()
	c.out, c.outOff = b, 0
	c.wdone.Store(false)
	c.unit.postLocked(c)
	c.smu.Unlock()
	var self *Conn // a small write: serve it first and go (see tryServe)
	if len(b) <= smallWrite {
		self = c
	}
	sp := spinner{ep: c.ep, short: c.sporadic.Load()}
	defer sp.stop()
	for {
		if c.wdone.Load() {
			return len(b), nil
		}
		if err := c.writeErr(); err != nil {
			return c.retract(), err
		}
		var wait time.Duration
		contended := false
		if inline {
			// Credits, ring space, and (for a bulk write) serving the unit.
			c.st.pollServe(nil, nil, self == nil)
			if c.wdone.Load() {
				continue
			}
			c.smu.Lock()
			u := c.unit
			c.smu.Unlock()
			var progress bool
			if progress, wait, contended = u.tryServe(self); progress {
				if len(b) > yieldAbove {
					runtime.Gosched() // let a small flow's goroutine in (see yieldAbove)
				}
				continue
			}
		}
		if sp.spin() {
			continue
		}
		// Park until the write completes (whoever serves the unit signals
		// wnotify), credit arrives, or ring space does.
		var extra <-chan struct{}
		switch {
		case wait > 0: // a token bucket
			t := time.NewTimer(wait)
			defer t.Stop()
			extra = chanOf(t.C)
		case inline:
			extra = c.ep.spaceWait()
			c.smu.Lock()
			u, credit := c.unit, c.waitCredit
			c.smu.Unlock()
			if !contended && !credit {
				// Blocked on ring space: arm, and look again if
				// room appeared meanwhile.
				if u.armSpace() {
					runtime.Gosched()
					continue
				}
			}
		}
		c.ep.writersOut.Add(1)
		c.ep.busy()
		c.park(&sp, c.wnotify, c.wdl, extra)
		c.ep.writersOut.Add(-1)
	}
}

// chanOf adapts a timer channel to the park signature.
func chanOf(t <-chan time.Time) <-chan struct{} {
	ch := make(chan struct{})
	go func() { <-t; close(ch) }()
	return ch
}

// retract withdraws the posted write and returns how much of it went out.
func (c *Conn) retract() int {
	c.smu.Lock()
	defer c.smu.Unlock()
	n := c.outOff
	if c.out == nil {
		n = 0
		if c.wdone.Load() {
			return 0
		}
	}
	c.out, c.outOff = nil, 0
	return n
}

// serveOnce sends for c, on behalf of unit u, the frames it has queued and
// up to Config.Batch bytes of its posted write. open and full are the
// unit's partition slots with a batch open and found full in this pass,
// moved the DATA bytes the pass has sent (serveOnce adds its own). It
// reports whether it sent anything, how long a token bucket asks to wait,
// and whether c has more to send now.
func (c *Conn) serveOnce(u *unit, open, full *uint64, moved *int) (sent bool, wait time.Duration, more bool) {
	c.smu.Lock()
	defer c.smu.Unlock()
	c.inSched = false
	if c.unit != u {
		return false, 0, c.hasWorkLocked() // moved while queued
	}
	slot := c.slot
	if *full&(1<<slot) != 0 {
		return false, 0, true
	}
	p := u.parts[slot]
	begin := func() { // the pass's batch on p, opened once
		if *open&(1<<slot) == 0 {
			p.BeginTX()
			*open |= 1 << slot
		}
	}
	send := func(tag uint32, body []byte) error {
		begin()
		return c.txLocked(p, tag, body)
	}
	failed := func(err error) (bool, time.Duration, bool) {
		if errors.Is(err, ring.ErrFull) {
			c.ep.counters.ringFull.Add(1)
			*full |= 1 << slot
			return sent, 0, true
		}
		c.wake(c.wnotify) // the session is gone: the writer sees it
		return sent, 0, false
	}
	for len(c.frames) > 0 {
		f := &c.frames[0]
		if err := send(f.tag, f.body[:f.n]); err != nil {
			return failed(err)
		}
		c.frames = c.frames[:copy(c.frames, c.frames[1:])]
		sent = true
	}
	if c.moving {
		// MOVE is our last frame on the old partition; the new one may
		// carry the next before this batch is even published: the peer
		// holds it until it has read the MOVE.
		to := c.moveUnit.parts[c.moveSlot]
		if err := send(makeTag(kindMove, c.peerID), le32(uint32(to.Index))); err != nil {
			return failed(err)
		}
		if !c.unplaced {
			c.unit.unplace(c.slot)
		}
		c.unit, c.slot, c.moving = c.moveUnit, c.moveSlot, false
		c.ep.counters.migrations.Add(1)
		if !c.unplaced {
			c.unit.mu.Lock()
			c.unit.conns[c.slot]++
			c.unit.mu.Unlock()
		}
		return true, 0, c.hasWorkLocked()
	}
	if c.out == nil {
		return sent, 0, false
	}
	cfg := &c.ep.cfg
	for budget := cfg.Batch; budget > 0 && c.outOff < len(c.out); {
		credit := c.window - (c.sent.Load() - c.peerRead.Load())
		if credit < c.creditFloor() {
			c.ep.counters.creditWaits.Add(1)
			c.waitCredit = true // credit() queues us again
			if c.peerPooled && !c.wantSent {
				c.wantSent = true
				c.wantOut.Store(true)
			}
			return sent, 0, false
		}
		chunk := int(min(int64(len(c.out)-c.outOff), int64(cfg.MTU), credit, int64(p.MaxPayload()), int64(budget)))
		if chunk > smallPiece && cfg.MTU <= DefaultMTU && c.st.smallTraffic(p.Index) {
			// A piece, and the pass ends with it: published, and the
			// writer yields before the next (see smallPiece).
			chunk, budget = smallPiece, smallPiece
			*moved += passBytes
		}
		if w := u.take(slot, chunk); w > 0 {
			return sent, w, true
		}
		begin()
		if err := c.txDataLocked(p, c.out[c.outOff:c.outOff+chunk]); err != nil {
			return failed(err)
		}
		c.countTx(u, chunk)
		c.outOff += chunk
		*moved += chunk
		budget -= chunk
		sent = true
	}
	if c.outOff < len(c.out) {
		return sent, 0, true
	}
	c.out, c.outOff = nil, 0
	c.wdone.Store(true)
	c.wake(c.wnotify)
	return sent, 0, false
}

// sendNow sends small write b into the ring at once, without the unit's
// schedule, if nothing can be ahead of it: no connection of the unit is
// queued (so no class, no express write and none of this connection's
// frames), the connection is not moving, no token bucket meters the
// partition, the peer's window has room for all of b and nobody holds the
// partition's TX lock. It reports whether it did; if not (a full ring
// too), the caller queues b as usual.
//
// It never waits for the TX lock while holding c.smu: a serve pass holds
// the TX lock of a batch while it takes the next connection's smu, and
// may have taken c off the schedule (a stale entry) after c's look at the
// queue.
//
// The schedule's queue, pass and hand-back cost a small write more than
// its copy: without them a 64 B round trip's p50 went from 1.28 to 0.84
// µs, beside a bulk flow from 1.30 to 0.84 (its unit is mostly idle: the
// shared window keeps the bulk writer waiting on credit), 64 B streams
// from 3.9 to 4.5 M msg/s (alternating runs on the 2-vCPU VM).
func (c *Conn) sendNow(b []byte) bool {
	c.smu.Lock()
	defer c.smu.Unlock()
	u := c.unit
	if u == nil || u.queued.Load() > 0 || len(c.frames) > 0 || c.moving || c.ep.cfg.PartitionRate != 0 ||
		c.window-(c.sent.Load()-c.peerRead.Load()) < int64(len(b)) {
		return false
	}
	p := u.parts[c.slot]
	if !p.TryBeginTX() {
		return false
	}
	err := c.txDataLocked(p, b)
	p.EndTX() // publishes it: the counting below is off the round trip
	if err != nil {
		return false
	}
	c.countTx(u, len(b))
	c.ep.noteProgress()
	return true
}

// txLocked adds a record of c's to p's open batch and shows it to the
// taps (c.smu held).
func (c *Conn) txLocked(p *partition.Partition, tag uint32, body []byte) error {
	if err := p.Send(tag, body, nil); err != nil {
		return err
	}
	if ts := c.ep.taps.Load(); ts != nil {
		ts.emit(c.st, TapTX, p.Index, tag, c.id, body)
	}
	return nil
}

// txDataLocked adds b to p's open batch as a DATA record of c's (c.smu
// held). The bytes count as sent before the record is visible: the peer
// may credit them before the batch ends.
func (c *Conn) txDataLocked(p *partition.Partition, b []byte) error {
	c.sent.Add(int64(len(b)))
	if err := c.txLocked(p, makeTag(kindData, c.peerID), b); err != nil {
		c.sent.Add(int64(-len(b)))
		return err
	}
	return nil
}

// countTx counts n bytes of DATA c sent through unit u, for rebalancing
// (c.smu held).
func (c *Conn) countTx(u *unit, n int) {
	c.txBytes += uint64(n)
	u.txBytes.Add(uint64(n))
}

func (c *Conn) hasWorkLocked() bool { return len(c.frames) > 0 || c.moving || c.out != nil }

// take asks partition slot's token bucket for n bytes.
func (u *unit) take(slot, n int) time.Duration {
	if u.st.ep.cfg.PartitionRate == 0 {
		return 0
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.buckets[slot].Take(n, time.Now())
}

// queueFrame queues a connection frame (ACCEPT, FIN, CLOSE, OPEN) behind
// what the connection has sent. CLOSE withdraws a write in progress:
// nothing may follow it.
func (c *Conn) queueFrame(kind uint32, body []byte) {
	f := ctlFrame{n: len(body)}
	if kind == kindOpen {
		f.tag = makeTag(kind, c.id) // peerID is not known yet, and ACCEPT may be writing it
	} else {
		f.tag = makeTag(kind, c.peerID)
	}
	copy(f.body[:], body)
	c.smu.Lock()
	if kind == kindClose {
		c.out, c.outOff = nil, 0
	}
	c.frames = append(c.frames, f)
	c.unit.postLocked(c)
	c.smu.Unlock()
	if c.ep.cfg.CoreModel == CoreInline {
		c.st.serveUnits() // full rings: the poller serves on ring space
	}
}

// place puts a new connection on a unit (before any frame of it is sent).
func (c *Conn) placeLocked() error {
	u, slot, err := c.st.place(c.class())
	if err != nil {
		return err
	}
	c.smu.Lock()
	c.unit, c.slot = u, slot
	c.smu.Unlock()
	return nil
}

// free releases what the connection holds on this side: its place, its
// window quota and its id.
func (c *Conn) releaseLocal() {
	c.smu.Lock()
	if c.unit != nil && !c.unplaced {
		c.unit.unplace(c.slot)
		c.unplaced = true
	}
	c.smu.Unlock()
	c.mu.Lock()
	held := c.quotaHeld
	c.quotaHeld = 0
	c.mu.Unlock()
	if held > 0 {
		c.ep.quota.Release(held)
	}
	c.cmu.Lock()
	c.turnsDone = true
	c.retireAhead(0)
	c.cmu.Unlock()
	c.st.releaseID(c)
}

func (c *Conn) class() qos.Class { return qos.Class(c.prio.Load()) }

// Priority is the connection's priority class.
func (c *Conn) Priority() qos.Class { return c.class() }

// SetPriority sets the connection's class (0 highest, 7 lowest). With
// Config.QoS the connection moves to its class's partition, in order.
func (c *Conn) SetPriority(class qos.Class) error {
	if !class.Valid() {
		return fmt.Errorf("set priority: class %d outside 0..%d", class, qos.Lowest)
	}
	c.prio.Store(uint32(class))
	c.smu.Lock()
	u := c.unit
	c.smu.Unlock()
	if u != nil && u.partFor(class) != c.slotNow() {
		c.moveTo(u, u.partFor(class))
	}
	return nil
}

func (c *Conn) slotNow() int {
	c.smu.Lock()
	defer c.smu.Unlock()
	if c.moving {
		return c.moveSlot
	}
	return c.slot
}

// Partition is the data partition the connection currently sends on.
func (c *Conn) Partition() int {
	c.smu.Lock()
	defer c.smu.Unlock()
	return c.unit.parts[c.slot].Index
}

// Migrate moves the connection's sending side to unit i (a partition, or
// with Config.QoS a unit of 8), in order and losing nothing. The move
// happens before the connection's next frame; Migrate does not wait.
func (c *Conn) Migrate(i int) error {
	if i < 0 || i >= len(c.st.units) {
		return fmt.Errorf("migrate connection %d: unit %d outside 0..%d", c.id, i, len(c.st.units)-1)
	}
	u := c.st.units[i]
	c.moveTo(u, u.partFor(c.class()))
	return nil
}

func (c *Conn) moveTo(u *unit, slot int) {
	c.smu.Lock()
	if c.unit == u && c.slot == slot {
		c.moving = false
	} else {
		c.moving, c.moveUnit, c.moveSlot = true, u, slot
		c.unit.postLocked(c)
	}
	c.smu.Unlock()
	if c.ep.cfg.CoreModel == CoreInline {
		c.st.serveUnits()
	}
}

func (c *Conn) writeErr() error {
	f := c.flags.Load()
	switch {
	case f&fClosed != 0:
		return c.opErr("write", net.ErrClosed)
	case c.wdl.Passed():
		return c.opErr("write", os.ErrDeadlineExceeded)
	case f&fWriteShut != 0:
		return c.opErr("write", syscall.EPIPE)
	case f&fFailed != 0:
		return c.opErr("write", c.failure())
	case f&fPeerGone != 0:
		return c.opErr("write", syscall.EPIPE)
	}
	return nil
}

func (c *Conn) failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// park gives up the CPU until notify, the deadline, Close, the end of the
// session or extra; the poller watches the ring meanwhile.
func (c *Conn) park(sp *spinner, notify chan struct{}, dl *deadline.Deadline, extra <-chan struct{}) {
	sp.stop()
	c.ep.parked.Add(1)
	c.sleepers.Add(1)
	c.ep.counters.parks.Add(1)
	if c.ep.active.Load() == 0 {
		// Nobody polls: the poller must. (A spinner kicks it when it
		// stops; kicking it on every park would make it runnable beside
		// the goroutines that do the work, and the scheduler then lets a
		// goroutine that yielded wait for dozens of rounds.)
		c.ep.kickPoller()
	}
	if extra == nil && !dl.Armed() {
		// Close, setting a deadline and the end of the session signal
		// notify too; a lone channel receive costs a fraction of the
		// select below, and a busy reader parks once per record.
		<-notify
	} else {
		c.parkSelect(notify, dl, extra)
	}
	c.sleepers.Add(-1)
	c.ep.parked.Add(-1)
	if sp.start != 0 {
		// Would spinning busySpin have bridged this wait? If not, the
		// next waits keep the short budget (see spinner).
		c.sporadic.Store(c.ep.now()-sp.start > int64(busySpin))
		sp.short = c.sporadic.Load()
	}
}

// parkSelect waits for notify, the deadline, Close, the end of the session
// or extra.
func (c *Conn) parkSelect(notify chan struct{}, dl *deadline.Deadline, extra <-chan struct{}) {
	select {
	case <-notify:
	case <-dl.Wait():
	case <-c.closedCh:
	case <-c.st.sess.Done():
	case <-extra:
	}
}

// Close closes the connection: blocked calls return net.ErrClosed, the
// peer's reads end with io.EOF and its writes fail.
func (c *Conn) Close() error {
	c.mu.Lock()
	if c.localClosed {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	c.localClosed = true
	c.flags.Or(fClosed)
	close(c.closedCh)
	signal(c.rnotify) // for calls parked on notify alone (see park)
	signal(c.wnotify)
	if c.err == nil {
		c.sendLocked(kindClose, nil)
	}
	free := c.freeLocked()
	c.mu.Unlock()
	if free {
		c.releaseLocal()
	}
	c.qmu.Lock()
	c.q = byteQueue{}
	c.qmu.Unlock()
	return nil
}

// CloseWrite shuts down the writing side: the peer reads io.EOF once it has
// read everything written before.
func (c *Conn) CloseWrite() error {
	c.wlock.Lock() // after any Write in progress
	defer c.wlock.Unlock()
	c.mu.Lock()
	if c.localClosed {
		c.mu.Unlock()
		return c.opErr("close", net.ErrClosed)
	}
	if !c.finSent && c.err == nil {
		c.sendLocked(kindFin, nil)
	}
	c.finSent = true
	c.flags.Or(fWriteShut)
	c.mu.Unlock()
	return nil
}

// sendLocked sends a control frame unless CLOSE has gone already (nothing
// may follow it) or the connection is not established. Holding c.mu while
// queueing orders every frame of the connection.
func (c *Conn) sendLocked(kind uint32, body []byte) {
	if c.closeSent || c.state != connEstablished {
		return
	}
	if kind == kindClose {
		c.closeSent = true
	}
	c.queueFrame(kind, body)
}

// Ended reports whether the peer has closed its end (its CLOSE arrived) or
// the connection failed: nothing more will arrive for it.
func (c *Conn) Ended() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closeRecv || c.err != nil
}

// freeLocked reports whether the id can be reused now: both CLOSE frames
// have passed, so no frame for it can still arrive.
func (c *Conn) freeLocked() bool {
	if c.idFreed || !c.closeSent || !c.closeRecv {
		return false
	}
	c.idFreed = true
	return true
}

// Frame handlers, called by whoever polls (RX lock held).

// deliver acts on a frame for c from data partition part, in the order the
// peer sent it: a frame from a partition the peer has moved c to, but
// whose MOVE has not been read yet, is held until it has.
func (c *Conn) deliver(part int, kind uint32, payload []byte) error {
	c.rxmu.Lock()
	defer c.rxmu.Unlock()
	var now int64 // the record's arrival, for noteData and arrived
	if kind == kindData {
		now = c.ep.now()
		c.noteData(part, len(payload), now)
		c.ep.counters.dataRecords.Add(1)
	}
	rp := int(c.rxPart.Load())
	if rp < 0 && (kind == kindAccept || kind == kindRefuse) {
		c.rxPart.Store(int32(part)) // the acceptor's partition
		rp = part
	}
	if rp != part {
		if rp < 0 {
			return fmt.Errorf("frame kind %d for connection %d before it was accepted", kind, c.id)
		}
		if kind == kindData {
			if !c.acceptData(len(payload)) {
				return fmt.Errorf("connection %d: %d bytes beyond the window", c.id, len(payload))
			}
			c.recvd.Add(int64(len(payload)))
			c.arrived(int64(len(payload)), now)
		}
		c.held = append(c.held, heldFrame{part: part, kind: kind, payload: append([]byte(nil), payload...)})
		return nil
	}
	if kind == kindData {
		if !c.acceptData(len(payload)) {
			return fmt.Errorf("connection %d: %d bytes beyond the window", c.id, len(payload))
		}
		c.recvd.Add(int64(len(payload)))
		c.arrived(int64(len(payload)), now)
	}
	return c.actLocked(kind, payload)
}

// actLocked acts on a frame in order (rxmu held); DATA is accounted.
func (c *Conn) actLocked(kind uint32, payload []byte) error {
	switch kind {
	case kindData:
		if c.rbuf != nil && c.queued.Load() == 0 && c.flags.Load()&fClosed == 0 {
			// Straight into the blocked Read's buffer, after what earlier
			// records put there: a reader that does not get the CPU
			// before its next record (another reader of this process
			// polls meanwhile) still gets it with one copy, not two
			// (ring -> queue -> buffer), until its buffer is full.
			n := copy(c.rbuf[c.rn:], payload)
			c.rn += n
			if c.rn == len(c.rbuf) {
				c.rbuf = nil
			}
			c.rready.Store(true)
			if n < len(payload) {
				c.rbuf = nil
				c.enqueue(payload[n:])
			}
			c.wake(c.rnotify)
			if len(payload) > smallWrite && int64(len(payload))*4 >= c.st.share() {
				// A share of a few records stalls its writer on every
				// record's credit: the record counts as read now, not
				// when the reader next runs, which with 64 readers on
				// a P is a long while (64 connections, 256 KiB reads:
				// 4.9 GB/s with Read-time credit, 10.3 with this).
				// Otherwise Read-time credit is soon enough, in fewer
				// frames, and lets less bulk data in ahead of a small
				// message (a 64 B flow's p99 beside a bulk one: 7 µs
				// against 13 µs with credit on every delivery).
				c.consumed(c.rn - c.rcount)
				c.rcount = c.rn
			}
			return nil
		}
		c.enqueue(payload)
	case kindAccept:
		m, err := decodeAccept(payload)
		if err != nil {
			return err
		}
		return c.established(m)
	case kindRefuse:
		code, err := decodeU32(payload, "refuse")
		if err != nil {
			return err
		}
		return c.refused(code)
	case kindFin:
		c.peerFin()
	case kindClose:
		c.peerClose()
	case kindMove:
		to, err := decodeU32(payload, "move")
		if err != nil {
			return err
		}
		if int(to) >= len(c.st.parts) {
			return fmt.Errorf("connection %d moved to partition %d of %d", c.id, to, len(c.st.parts))
		}
		c.rxPart.Store(int32(to))
		// Replay what came early on the new partition, in order; a
		// replayed MOVE changes the partition again.
		for {
			k := slices.IndexFunc(c.held, func(h heldFrame) bool { return h.part == int(c.rxPart.Load()) })
			if k < 0 {
				return nil
			}
			h := c.held[k]
			c.held = slices.Delete(c.held, k, k+1)
			if err := c.actLocked(h.kind, h.payload); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("unknown frame kind %d", kind)
	}
	return nil
}

// takeDirect reports whether a DATA record of n bytes from part may be
// copied straight into a waiting Read: it is next in order and fits the
// window. On true it has been accounted and rxmu is held: the caller
// enqueues what does not fit the Read, then unlocks.
func (c *Conn) takeDirect(part, n int) bool {
	c.rxmu.Lock()
	if int(c.rxPart.Load()) == part && len(c.held) == 0 && c.queued.Load() == 0 && c.rn == 0 && c.acceptData(n) {
		now := c.ep.now() // one clock read a record: 4 % of a 64-connection reader's CPU was two
		c.noteData(part, n, now)
		c.ep.counters.dataRecords.Add(1)
		c.recvd.Add(int64(n))
		c.arrived(int64(n), now)
		c.rbuf = nil
		return true
	}
	c.rxmu.Unlock()
	return false
}

// takeRestDirect reports whether the rest of a record a Read took part of
// may be copied straight into the next Read: nothing was delivered into
// its posted buffer meanwhile. On true the buffer is withdrawn.
func (c *Conn) takeRestDirect() bool {
	c.rxmu.Lock()
	defer c.rxmu.Unlock()
	if c.rn != 0 || c.queued.Load() != 0 {
		return false
	}
	c.rbuf = nil
	return true
}

// acceptData reports whether n more bytes fit in our receive window.
func (c *Conn) acceptData(n int) bool {
	return c.recvd.Load()+int64(n)-c.read.Load() <= c.st.window
}

// enqueue queues accounted bytes for the reader.
func (c *Conn) enqueue(p []byte) {
	if c.flags.Load()&fClosed != 0 {
		c.read.Add(int64(len(p))) // nobody will read it
		return
	}
	c.ep.counters.queuedRecords.Add(1)
	c.qmu.Lock()
	c.q.push(p)
	c.qmu.Unlock()
	c.queued.Add(int64(len(p)))
	c.wake(c.rnotify)
}

func (c *Conn) credit(m creditMsg) error {
	v := m.consumed
	if int64(v) < c.peerRead.Load() || int64(v) > c.sent.Load() {
		return fmt.Errorf("connection %d: credit %d outside [%d, %d]", c.id, v, c.peerRead.Load(), c.sent.Load())
	}
	c.peerRead.Store(int64(v))
	c.smu.Lock()
	defer c.smu.Unlock()
	c.peerFloor = int64(m.floor &^ floorPooled)
	pooled := m.floor&floorPooled != 0
	c.peerPooled = pooled
	// Any CREDIT answers a WANT sent before it, or crossed it (the
	// receiver then ignores the WANT): the writer's next wait asks again.
	c.wantSent = false
	// Only a write waiting for credit needs it; waking the writer on
	// every CREDIT would leave a stale signal for its next park.
	if !c.waitCredit {
		return nil
	}
	if c.window-(c.sent.Load()-int64(v)) < c.creditFloor() {
		if pooled {
			// Credit goes in turns, and the writer waits without
			// having asked since this CREDIT (the receiver ignores a
			// WANT that crossed it): a serve pass waits again, and
			// asks. The writer runs it: our caller may be a small
			// write or a Read that got its data, which serve nobody
			// (in CoreInline no worker watches the unit's kick).
			c.waitCredit, c.wantSent = false, false
			c.unit.postLocked(c)
			c.wake(c.wnotify)
		}
		return nil
	}
	c.waitCredit, c.wantSent = false, false
	c.unit.postLocked(c)
	c.wake(c.wnotify)
	return nil
}

func (c *Conn) established(m acceptMsg) error {
	c.mu.Lock()
	if m.echoed && m.dialGen != c.gen {
		// A late ACCEPT for an earlier connection with our id, which gave
		// up dialing: not ours, ignore it. (Ids are reused oldest-first, so
		// this takes thousands of connections between the two.)
		c.mu.Unlock()
		return nil
	}
	if c.state != connDialing {
		c.mu.Unlock()
		return fmt.Errorf("accept for connection %d, which is not dialing", c.id)
	}
	c.peerID, c.window, c.peerGen, c.state = m.id, int64(m.window), m.gen, connEstablished
	if c.localClosed { // the dialer gave up: close at once
		c.sendLocked(kindClose, nil)
	}
	c.mu.Unlock()
	c.wake(c.wnotify)
	return nil
}

func (c *Conn) refused(code uint32) error {
	c.mu.Lock()
	if c.state != connDialing {
		c.mu.Unlock()
		return fmt.Errorf("refusal for connection %d, which is not dialing", c.id)
	}
	c.state = connRefused
	switch code {
	case refuseBacklog:
		c.err = fmt.Errorf("listener backlog full: %w", syscall.ECONNREFUSED)
	case refuseNoIDs:
		c.err = fmt.Errorf("peer has no free connection ids: %w", syscall.ECONNREFUSED)
	case refuseQuota:
		c.err = fmt.Errorf("peer's receive-window memory quota is used up: %w", syscall.ECONNREFUSED)
	case refusePartitions:
		c.err = fmt.Errorf("peer's partitions are at their connection quota: %w", syscall.ECONNREFUSED)
	default:
		c.err = syscall.ECONNREFUSED
	}
	c.flags.Or(fFailed)
	c.idFreed = true // the peer kept no state for us
	c.mu.Unlock()
	c.releaseLocal()
	c.wake(c.wnotify)
	return nil
}

func (c *Conn) peerFin() {
	c.flags.Or(fEOF)
	c.wake(c.rnotify)
}

func (c *Conn) peerClose() {
	c.mu.Lock()
	c.closeRecv = true
	c.sendLocked(kindClose, nil) // our answer, unless we closed first
	free := c.freeLocked()
	c.mu.Unlock()
	c.flags.Or(fEOF | fPeerGone)
	if free {
		c.releaseLocal()
	}
	c.wake(c.rnotify)
	c.wake(c.wnotify)
}

// fail ends the connection with err (the session is gone).
func (c *Conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
	}
	c.mu.Unlock()
	c.flags.Or(fFailed)
	c.wake(c.rnotify)
	c.wake(c.wnotify)
}

// spinner runs the spin half of spin-then-park and keeps the endpoint's
// count of spinning goroutines, which tells the poller whether anyone is
// watching the ring.
//
// At most GOMAXPROCS goroutines of an endpoint spin; the others park at
// once. A spinner polls the rings and serves the units for everybody, and
// wakes parked goroutines through their channels, which costs the runtime
// little: many spinners would only fight for the CPUs and the locks. A
// spinner keeps spinning while the endpoint makes progress, and parks once
// neither it nor the endpoint has moved anything for the spin budget.
type spinner struct {
	ep       *Endpoint
	short    bool // keep SpinBudget: the caller's last wait outlasted busySpin (Conn.sporadic)
	spinning bool
	start    int64 // ep.now() when spinning began
	budget   int64
	iter     int
	handoffs uint64 // ep.handoffs last seen
}

// Under load a gap between records is short and a parked side costs a
// cross-process wake-up (tens of microseconds, more when both CPUs are
// busy) at both ends of the gap: an endpoint that moved records within the
// last busyWindow spins for up to busySpin instead of SpinBudget. An idle
// endpoint keeps the short budget, and so does a connection whose last
// park outlasted busySpin (Conn.sporadic): a request a millisecond parks
// whether its server spun 50 or 500 µs, and the longer spin cost 0.45 ms
// of CPU per message (ntbench -gap 1ms: the pair's CPU 64 %, 2.8x TCP's
// per message).
// (Shared-pool connections, socklike/pool.go, and ntproxy's side of them
// wait the same way, pool.Spin.)
const (
	busyWindow = pool.BusyWindow
	busySpin   = pool.BusySpin
)

// spin reports whether to keep polling (true) or park (false).
func (s *spinner) spin() bool {
	ep := s.ep
	if !s.spinning {
		if ep.cfg.SpinBudget <= 0 || int(ep.active.Load()) >= ep.maxSpinners {
			return false
		}
		s.spinning = true
		ep.active.Add(1)
		s.start = ep.now()
		s.budget = int64(ep.cfg.SpinBudget)
		if !s.short && s.start-ep.lastProgress(s.start) < int64(busyWindow) {
			s.budget = max(s.budget, int64(busySpin))
		}
		s.iter = 0
		s.handoffs = ep.handoffs.Load()
		return true
	}
	s.iter++
	// A goroutine this spinner just handed data or completion to runs only
	// when the spinner yields, on a P they share: yield at once then, not
	// only every Config.SpinYield rounds, or a request/response flow beside a bulk one
	// waits tens of microseconds for each response.
	if h := ep.handoffs.Load(); h != s.handoffs {
		s.handoffs = h
		runtime.Gosched()
	}
	if s.iter%ep.cfg.SpinYield == 0 {
		if now := ep.now(); now-max(s.start, ep.lastProgress(now)) > s.budget {
			return false
		}
		// Gosched lets this process's goroutines in; Yield lets in another
		// process waiting for this CPU — typically the one we wait for.
		// Without it a spinner sharing its CPU with its peer (an application
		// and its ntproxy, four processes on two cores) holds the CPU until
		// the scheduler tick: proxied round trips took ~1 ms, with it ~70 µs.
		runtime.Gosched()
		proc.Yield()
	}
	return true
}

// stop leaves the spinning state; if that leaves parked goroutines with
// nobody polling, the poller takes over.
func (s *spinner) stop() {
	if !s.spinning {
		return
	}
	s.spinning = false
	if s.ep.active.Add(-1) == 0 && s.ep.parked.Load() > 0 {
		s.ep.kickPoller()
	}
}

// dialErr maps a context error as the standard library's dialer does.
func dialErr(err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return os.ErrDeadlineExceeded
	}
	return err
}
