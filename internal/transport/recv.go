package transport

import (
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
)

// recvHalf is a connection's receiving side: the peer's frames, delivered
// in the order the peer sent them, into a blocked Read's posted buffer or
// the queue. recvd counts bytes taken off the ring for the connection;
// read counts bytes the application has read; recvd-read ≤ the window
// announced to the peer (state.window).
type recvHalf struct {
	qmu    sync.Mutex
	q      byteQueue // guarded by qmu
	queued atomic.Int64
	recvd  atomic.Int64
	read   atomic.Int64

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
	// ringRest is how much of that record is still in the ring: counted
	// in recvd, and lost should the session end (see Conn.takeOver).
	ringRest atomic.Int64
	// cut: the last poll of this connection's Read took a piece of a
	// record rather than all b held (state.piece; its goroutine only).
	cut bool
	// inRead is set while a Read runs; readerLeft marks the return of
	// the last one, and readerAt is when a look found it (readerRecent).
	inRead     atomic.Bool
	readerLeft atomic.Bool
	readerAt   atomic.Int64

	// sentAtSmall is sendHalf.sent when c's last small DATA record came
	// while c was not bulk (see noteData); guarded by rxmu.
	sentAtSmall int64
	bigAt       atomic.Int64 // ep.now()+1 when a DATA record of more than smallWrite last came (0: never)
	smallAt     atomic.Int64 // ep.now()+1 when a small DATA record last came while c was not bulk (0: never)
	bulkEpoch   atomic.Int64 // the last period (of smallRecent) c was counted as bulk in, plus 1 (0: never)
}

// heldFrame is a frame that arrived early on the partition of a MOVE not
// yet read.
type heldFrame struct {
	part    int
	kind    uint32
	payload []byte
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
	sp := spinner{ep: c.ep, c: c, short: c.sporadic.Load()}
	defer sp.stop()
	n, err := c.readLoop(b, &sp)
	if m := c.unpost(); m > 0 { // delivered into b on the way out
		n, err = m, nil
	}
	if n > 0 {
		c.ep.noteProgress() // records moved (see state.pollServe)
	}
	if n > yieldAbove && (!c.restWaits.Load() || c.cut) && (c.ep.cfg.HandOff || c.st().smallLately()) {
		runtime.Gosched() // still in Read: its next records wait for it
	}
	c.readerLeft.Store(true)
	c.inRead.Store(false)
	return n, err
}

// readerRecent reports whether c's reader, outside Read, left it within
// readerBack before now (see state.leaveForReader). Read marks its return
// rather than read the clock (a clock read a call is a noticeable share of
// a small reader's CPU): the first look
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
// the yield. A Read yields only while the link carries such a flow
// (state.smallLately), or in a process whose goroutines hand messages on
// (Config.HandOff): a bulk reader otherwise hands its processor to the
// other bulk readers once per record, and runs of its own records go with
// it.
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
			if n, _ := c.st().poll(c, b); n > 0 {
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
// large one, and answered the first with no more than smallWrite, marks
// the partition as carrying latency traffic. A bulk
// connection's own small records do not count — neither the headers
// between its bodies nor the one before its first body, or its first after
// a pause: marked by that, a stream that paused and then sent a header
// and a body would have its own window cut to SharedWindow for smallFor,
// and its body sent in many small credits.
func (c *Conn) noteData(part, n int, now int64) {
	now++ // never 0
	pt := &c.st().traffic[part]
	if n > smallWrite {
		c.bigAt.Store(now)
		if e := now / c.ep.smallFor; c.bulkEpoch.Swap(e+1) != e+1 {
			pt.bulk.count(e)
			c.st().bulk.count(e)
			c.st().noteBulkPeriod(e)
		}
		return
	}
	if at := c.bigAt.Load(); at == 0 || now-at > c.ep.smallFor {
		// A request whose answer was bulk (a file server's GET): c sent
		// more than smallWrite since its previous small record. Its
		// answers travel the other way, and HTTP/1's next request waits
		// for the whole answer; marked, the partition would cut c's own
		// answers into pieces and windows beside it to SharedWindow.
		sent := c.sent.Load()
		answered := sent-c.sentAtSmall > smallWrite
		c.sentAtSmall = sent
		if last := c.smallAt.Swap(now); last != 0 && now-last <= c.ep.smallFor && !answered {
			pt.smallAt.Store(now)
		}
	}
}

// bulkReader reports whether c's last DATA record was of more than
// smallWrite, however long ago (a small one after smallFor without a large
// one, noteData's smallAt, makes c a small-message reader again). Asking
// for a large record within smallFor instead, a stream whose writer had
// waited that long in the turns' line would count as a small-message
// reader, and its records be copied twice, into its queue (see
// leaveForReader).
func (c *Conn) bulkReader() bool {
	big := c.bigAt.Load()
	return big != 0 && big >= c.smallAt.Load()
}

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
			if len(payload) > smallWrite && int64(len(payload))*4 >= c.st().share() {
				// A share of a few records stalls its writer on every
				// record's credit: the record counts as read now, not
				// when the reader next runs, which with many readers
				// on a P is a long while. Otherwise Read-time credit is
				// soon enough, in fewer frames, and lets less bulk data
				// in ahead of a small message.
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
		// An aborting CLOSE has a body (Abort); an orderly one none.
		c.peerClose(len(payload) > 0 && payload[0] == closeAbort[0])
	case kindMove:
		to, err := decodeU32(payload, "move")
		if err != nil {
			return err
		}
		if int(to) >= len(c.st().parts) {
			return fmt.Errorf("connection %d moved to partition %d of %d", c.id, to, len(c.st().parts))
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
	return c.recvd.Load()+int64(n)-c.read.Load() <= c.st().window
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
