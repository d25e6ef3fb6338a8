package proxy

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/ntstack/ntstack/internal/prim/pool"
	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// appPool is an application's shared buffer pool (shared-pool mode): a
// memfd of proxy.pool_slots slots of two proxy.pool_ring rings each, sent
// with the Welcome and mapped by both. The file is sized up front, but a
// slot takes memory only once its rings are written, and gives it back
// when its connection ends (the slot is discarded before its reuse), so
// the application's memory returns to its baseline with its connections.
//
// The waits on its slots in this process (each leg's runPool) spin
// through the server's poller, with every other application's: up to
// GOMAXPROCS of them poll them all while the others stay parked
// (pool.Poller).
type appPool struct {
	f      *os.File
	mem    []byte
	ring   int
	poller *pool.Poller // spins for the waits on its slots (nil: each spins itself)

	mu sync.Mutex
	// mu protects the following fields.
	free []int // slots not in use, the lowest last
	used int
}

func newAppPool(name string, slots, ring int, poller *pool.Poller) (_ *appPool, err error) {
	if err := pool.CheckGeometry(slots, ring); err != nil {
		return nil, err
	}
	size := slots * pool.SlotSize(ring)
	p := &appPool{ring: ring, poller: poller}
	if p.f, err = proc.NewMemfd(name, int64(size)); err != nil {
		return nil, err
	}
	if p.mem, err = proc.MapShared(p.f, size); err != nil {
		p.f.Close()
		return nil, err
	}
	for i := slots - 1; i >= 0; i-- {
		p.free = append(p.free, i)
	}
	return p, nil
}

func (p *appPool) slots() int { return len(p.mem) / pool.SlotSize(p.ring) }

// get takes a free slot, or fails with CodeQuota when all are in use.
func (p *appPool) get() (int, *pool.Slot, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.free) == 0 {
		return 0, nil, ctlapi.Errorf(ctlapi.CodeQuota, "all %d shared-pool slots are in use (proxy.pool_slots)", p.slots())
	}
	i := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	p.used++
	s, err := p.slot(i)
	if err != nil {
		p.free = append(p.free, i)
		p.used--
		return 0, nil, err
	}
	s.Poll(p.poller)
	return i, s, nil
}

func (p *appPool) slot(i int) (*pool.Slot, error) {
	n := pool.SlotSize(p.ring)
	return pool.NewSlot(p.mem[i*n:(i+1)*n], p.ring)
}

// put returns slot i, once neither this process nor the application
// touches it any more: its memory is given back, and it reads as zeros
// for its next grant.
func (p *appPool) put(i int) {
	n := pool.SlotSize(p.ring)
	if err := proc.Discard(p.f, int64(i*n), int64(n)); err != nil {
		clear(p.mem[i*n : (i+1)*n])
	}
	p.mu.Lock()
	p.free = append(p.free, i)
	p.used--
	p.mu.Unlock()
}

// inUse is the pool memory its live connections hold.
func (p *appPool) inUse() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return int64(p.used * pool.SlotSize(p.ring))
}

// close unmaps the pool once every slot is back (its connections' ends in
// this process are done with it), waking their waits; if some are not
// back within poolDrainWait the mapping is left in place (never unmapped
// under a goroutine that may still touch it) and only the file is closed.
func (p *appPool) close() error {
	p.kickAll()
	deadline := time.Now().Add(poolDrainWait)
	for {
		p.mu.Lock()
		used := p.used
		p.mu.Unlock()
		if used == 0 {
			return errors.Join(proc.Unmap(p.mem), p.f.Close())
		}
		if time.Now().After(deadline) {
			return errors.Join(fmt.Errorf("pool: %d slots still in use after %v; left mapped", used, poolDrainWait), p.f.Close())
		}
		time.Sleep(time.Millisecond)
	}
}

// kickAll wakes this process's waits on every slot: their application
// has gone.
func (p *appPool) kickAll() {
	for i := range p.slots() {
		if s, err := p.slot(i); err == nil {
			s.Kick(pool.Proxy)
		}
	}
}

// poolDrainWait bounds how long a departing application's pool waits for
// its connections' goroutines to let go of their slots.
const poolDrainWait = 5 * time.Second

// poolUse is a connection's slot of its application's pool.
type poolUse struct {
	*pool.Slot
	pool  *appPool
	index int
}

// grantSlot gives pc a slot of a's pool for shared-pool mode, or says why
// not (the route's reason carries it: the connection then goes through
// the proxy's memory link).
func (a *app) grantSlot(pc *pconn) error {
	if a.pool == nil {
		return errors.New("shared-pool mode is off (proxy.pool_slots = -1)")
	}
	i, s, err := a.pool.get()
	if err != nil {
		return err
	}
	pc.slot = &poolUse{Slot: s, pool: a.pool, index: i}
	return nil
}

// dropSlot returns pc's slot unused (its connection never started).
func (pc *pconn) dropSlot() {
	if pc.slot != nil {
		pc.slot.pool.put(pc.slot.index)
		pc.slot = nil
	}
}

// rxWindow is what this end of pc's leg can receive unacknowledged, and
// also what it can send: its send buffer is as large (a slot's two rings,
// or legMaxUnacked each way).
func (pc *pconn) rxWindow() int {
	if pc.slot != nil {
		return pc.slot.Ring()
	}
	return legMaxUnacked
}

// ackEvery is how many delivered bytes the leg acknowledges at a time: a
// quarter of its receive buffer or of the peer's, whichever is smaller,
// at most legAckEvery. The peer's window is also its send buffer
// (rxWindow), and what that holds unacknowledged is all the peer can
// send: a shared-pool end's ring, against a proxy-mode end's 8 MiB, would
// fill before a quarter of the larger buffer came, and the stream would
// stop.
func (l *leg) ackEvery() uint64 { return min(legAckEvery, uint64(l.rx.max/4), l.peerWin/4) }

// rxAddedLocked: bytes were added to rx (dmu held). In shared-pool mode
// they are the application's at once: the in ring's head moves. After
// the application closed they are dropped as they come.
func (l *leg) rxAddedLocked() {
	l.dcond.Broadcast()
	if l.discard {
		l.dropLocked()
		return
	}
	if l.slot == nil {
		return
	}
	l.slot.SetInHead(l.rxSeq)
	l.slot.Notify(pool.App)
}

// dropLocked counts what rx holds as delivered and has it acknowledged
// (dmu held): the application closed, and what comes is dropped.
func (l *leg) dropLocked() {
	if ack := l.deliveredLocked(l.rx.end(), false); ack > 0 {
		l.mu.Lock() // after dmu, as generation() takes it
		l.ackWanted = max(l.ackWanted, ack)
		l.cond.Broadcast()
		l.mu.Unlock()
	}
}

// runPool is runPump and runDeliver of shared-pool mode. The application
// writes into its slot's out ring and reads from the in ring itself;
// runPool follows its indices: it queues what was written for runSend,
// frees what was read and acknowledges it to the peer, and passes the
// application's FIN (or reset) on. It waits on the slot (spinning, then
// asleep) while nothing moves, and returns when the leg ends.
func (l *leg) runPool() {
	s := l.slot
	spin := cmp.Or(l.s.appCfg.SpinBudget, transport.DefaultSpinBudget)
	var moved int64
	var sporadic bool // the last wait outlasted pool.BusySpin (see pool.Spin)
	var lastHead, lastTail uint64
	for !l.ended.Load() {
		af, pf := s.AppFlags(), s.ProxyFlags() // flags first: a FIN's head is final
		head, tail := s.OutHead(), s.InTail()
		if head != lastHead || tail != lastTail {
			lastHead, lastTail, moved = head, tail, time.Now().UnixNano()
		}
		if err := l.poolOut(af, head); err != nil {
			l.close(fmt.Errorf("application: %w", err))
			return
		}
		if err := l.poolIn(af, tail); err != nil {
			l.close(fmt.Errorf("application: %w", err))
			return
		}
		sporadic = s.Wait(pool.Proxy, func() bool {
			return l.ended.Load() || s.OutHead() != head || s.InTail() != tail || s.AppFlags() != af || s.ProxyFlags() != pf
		}, pool.Spin(spin, moved, sporadic), time.Time{})
	}
}

// poolOut takes what the application wrote up to head into tx, and
// queues the end of its stream its flags say: a FIN, or a reset after an
// Abort (FlagAbort).
func (l *leg) poolOut(af uint32, head uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if end := l.tx.end(); head != end {
		if head < end || head-l.tx.base > uint64(l.tx.max) {
			return fmt.Errorf("out ring head %d outside %d..%d", head, end, l.tx.base+uint64(l.tx.max))
		}
		n := head - end
		l.tx.commit(int(n))
		l.pc.inFlight[0].Store(int64(l.tx.n))
		l.pc.bytesTX.Add(n)
		l.pc.msgsTX.Add(1)
		l.cond.Broadcast()
	}
	if af&pool.FlagAbort != 0 && !l.resetQueued {
		// As endShort: a reset after the last byte, not a FIN (unless
		// the FIN is written already).
		l.finQueued, l.resetQueued = true, true
		l.cond.Broadcast()
	}
	if af&(pool.FlagFin|pool.FlagClosed) != 0 && !l.finQueued {
		l.finQueued = true
		l.cond.Broadcast()
	}
	return nil
}

// poolIn frees what the application read up to tail, acknowledges it
// when due, and completes the peer's FIN once everything before it is
// read.
func (l *leg) poolIn(af uint32, tail uint64) error {
	l.dmu.Lock()
	if af&pool.FlagClosed != 0 {
		l.discard = true // nothing more will be read: drop what is and what comes
		tail = l.rx.end()
	}
	if tail < l.rx.base || tail > l.rx.end() {
		l.dmu.Unlock()
		return fmt.Errorf("in ring tail %d outside %d..%d", tail, l.rx.base, l.rx.end())
	}
	fin := l.finAt >= 0 && tail == l.rx.end() && !l.finDone
	ack := l.deliveredLocked(tail, fin)
	l.setInWantLocked()
	discard := l.discard
	l.dmu.Unlock()
	l.wantAck(ack, fin)
	if discard {
		l.maybeDone()
	}
	return nil
}

// setInWantLocked tells the application (dmu held) the in tail at which
// poolIn next has work: the next acknowledgement, or the peer's FIN once
// everything before it is read. Its reads before that do not wake
// runPool; runPool then sees their tail with the next thing that does.
func (l *leg) setInWantLocked() {
	want := l.rxAcked + l.ackEvery()
	if l.finAt >= 0 && !l.finDone {
		want = min(want, uint64(l.finAt))
	}
	l.slot.SetInWant(want)
}

// releaseSlot gives the slot back once the leg has ended and the
// application has let go of it too (closed its connection, or gone).
func (l *leg) releaseSlot(a *app) { l.pc.slot.release(l.s, a) }

// abandonSlot gives up pc's slot after its grant may have reached the
// application but its connection failed to start: the application's end
// sees a reset, and the slot returns once it lets go.
func (pc *pconn) abandonSlot(s *Server, a *app) {
	if u := pc.slot; u != nil {
		u.SetFlags(pool.Proxy, pool.FlagReset)
		u.Kick(pool.App)
		s.wg.Add(1)
		go func() { defer s.wg.Done(); u.release(s, a) }()
	}
}

// release returns u to its pool once a has closed its end or gone.
func (u *poolUse) release(s *Server, a *app) {
	gone := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return a.gone
	}
	for u.AppFlags()&pool.FlagClosed == 0 && !gone() {
		u.Wait(pool.Proxy, func() bool { return u.AppFlags()&pool.FlagClosed != 0 }, 0, time.Now().Add(time.Second))
	}
	u.pool.put(u.index)
}

// tryPool puts pc, for which its application asked shared-pool mode, in
// that mode if it crosses to a peer's proxy and a slot is free; if not,
// its reason says why it goes through the memory link instead.
func (s *Server) tryPool(a *app, pc *pconn) {
	var why error
	switch {
	case !pc.leggy():
		why = errors.New("a connection on this host never leaves shared memory")
	default:
		why = a.grantSlot(pc)
	}
	if why != nil {
		pc.reason = fmt.Sprintf("shared pool refused (%s); through the memory link: %s", errMessage(why), pc.reason)
		return
	}
	pc.reason += "; shared pool"
}
