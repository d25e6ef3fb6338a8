package transport

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ntstack/ntstack/internal/prim/spingate"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/partition"
	"github.com/ntstack/ntstack/qos"
)

// Endpoint is this process's end of one NTB link.
type Endpoint struct {
	cfg     Config
	dev     ntb.Device
	idler   ntb.Idler // dev, if it checks its link less often while we are idle
	byRef   bool      // connections retain by reference: dev's outbound window is shared memory (keep.go)
	ownsDev bool
	link    *partition.Link

	pollers     sync.WaitGroup // runPoller goroutines
	born        time.Time      // origin of now
	progress    atomic.Int64   // now() when records last moved, as far as lastProgress knows
	moved       atomic.Bool    // records moved since progress was last brought up to date
	maxSpinners int            // GOMAXPROCS at Attach
	counters    counters
	handoffs    atomic.Uint64 // wake-ups of parked goroutines, for spinners
	nextGen     atomic.Uint32 // connection incarnations, over every session: a late frame of an earlier one never matches
	active      atomic.Int32  // goroutines spin-polling
	parked      atomic.Int32  // goroutines parked, waiting for the poller
	writersOut  atomic.Int32  // of those, writers with bytes left to send (see busy)
	idle        atomic.Bool   // idler was told this end is idle (state.announceIdle)
	inCall      atomic.Int32  // goroutines inside Read or Write (past its lock), parked or not
	smallFor    int64         // smallRecent, in ns (tests lengthen it before connecting)
	accepting   atomic.Int32  // goroutines in Accept: the poller arms once calls stop (see idleGrace)
	calls       atomic.Uint64 // Read and Write calls: the poller stays off while they come
	kick        chan struct{} // wakes the poller when it waits for work
	closeDone   chan struct{} // closed once Close has finished: pollers ended, device closed

	taps atomic.Pointer[tapSet] // frame taps, nil when none (tap.go)

	mu sync.Mutex
	// mu protects the following fields.
	listeners map[uint16]*Listener
	cur       *state        // current session, nil while the link is down
	sessCh    chan struct{} // closed when a session is installed or the endpoint closes
	closed    bool
	// orphan is the last session that ended with connections waiting to
	// resume on the next one (resume.go).
	orphan     *state
	last       *state        // the session installed last, ended or not
	pauseTimer *time.Timer   // runs checkPaused while connections wait
	watchStop  chan struct{} // closed by Close: ends runWatch

	spaceMu sync.Mutex
	// spaceMu protects the following fields.
	spaceCh chan struct{} // closed when the peer hands back ring space

	quota qos.Quota // receive-window memory
}

// Open attaches this process to its end of the emulated link called name
// and returns an Endpoint that owns it.
func Open(name string, cfg Config) (*Endpoint, error) {
	if cfg.Fabric.SilentTimeout == 0 {
		// The fabric takes a silent peer's link down after the silent
		// timeout: the connections fail then, as silent.
		cfg.Fabric.SilentTimeout = cmp.Or(cfg.SilentTimeout, cfg.UserTimeout, DefaultUserTimeout)
	}
	dev, err := shm.Open(name, cfg.Fabric)
	if err != nil {
		return nil, err
	}
	ep, err := Attach(dev, cfg)
	if err != nil {
		return nil, errors.Join(err, dev.Close())
	}
	ep.ownsDev = true
	return ep, nil
}

// busy ends the idle spell announced to the device (state.announceIdle):
// the poller or a worker woke, or a writer is about to wait for credit or
// room, and a peer that dies meanwhile must be noticed at the device's
// full rate.
func (ep *Endpoint) busy() {
	if ep.idle.Load() && ep.idle.Swap(false) {
		ep.idler.Idle(false)
	}
}

// Attach runs an Endpoint over dev. Closing the Endpoint does not close dev.
func Attach(dev ntb.Device, cfg Config) (*Endpoint, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("attach %s: %w", dev.Name(), err)
	}
	if cfg.Sockets {
		spingate.Sockets()
	} else {
		spingate.Refresh()
	}
	ep := &Endpoint{
		born:        time.Now(),
		maxSpinners: max(1, runtime.GOMAXPROCS(0)),
		cfg:         cfg,
		dev:         dev,
		listeners:   make(map[uint16]*Listener),
		sessCh:      make(chan struct{}),
		spaceCh:     make(chan struct{}),
		kick:        make(chan struct{}, 1),
		smallFor:    int64(smallRecent),
		watchStop:   make(chan struct{}),
		closeDone:   make(chan struct{}),
	}
	ep.quota.Name, ep.quota.Limit = "receive-window memory quota", cfg.MemoryQuota
	ep.idler, _ = dev.(ntb.Idler)
	if sw, ok := dev.(ntb.SharedWindow); ok {
		ep.byRef = sw.WindowShared()
	}
	link, err := partition.Open(dev, partition.Config{Partitions: cfg.Partitions, OnSession: ep.install, Logf: cfg.Logf})
	if err != nil {
		return nil, fmt.Errorf("attach %s: %w", dev.Name(), err)
	}
	ep.link = link
	if lv, ok := dev.(ntb.Liveness); ok {
		ep.pollers.Add(1)
		go ep.runWatch(lv)
	}
	return ep, nil
}

func (ep *Endpoint) logf(format string, args ...any) {
	if ep.cfg.Logf != nil {
		ep.cfg.Logf("%s: "+format, append([]any{ep.dev.Name()}, args...)...)
	}
}

// now is a monotonic clock in nanoseconds.
func (ep *Endpoint) now() int64 { return int64(time.Since(ep.born)) }

// noteProgress records that records moved. It marks the move rather than
// read the clock (a clock read is a noticeable share of a small writer's
// CPU); lastProgress, which the
// spinners call with the time they read anyway, turns the mark into a time.
func (ep *Endpoint) noteProgress() {
	if !ep.moved.Load() {
		ep.moved.Store(true)
	}
}

// lastProgress is when records last moved, now being the time: a move
// marked since the last call counts as now. A mark can be old — moves no
// call waited after, then an idle spell — and then one spin gets the busy
// budget it would not have had. (A move marked between the two stores
// below is lost, but it happened at about now, the time stored.)
func (ep *Endpoint) lastProgress(now int64) int64 {
	if ep.moved.Load() {
		ep.progress.Store(now)
		ep.moved.Store(false)
		return now
	}
	return ep.progress.Load()
}

// TakeDevice makes the Endpoint the device's owner: Close closes it too.
// Call it before the Endpoint is shared.
func (ep *Endpoint) TakeDevice() { ep.ownsDev = true }

// Device is the device under the endpoint.
func (ep *Endpoint) Device() ntb.Device { return ep.dev }

// Close ends every connection and listener and detaches from the link.
// It returns once the endpoint's goroutines have ended and, if it owns
// the device, the device is closed. A Close while another is under way
// waits for that one to finish; every Close but the first returns nil.
func (ep *Endpoint) Close() error {
	ep.mu.Lock()
	if ep.closed {
		ep.mu.Unlock()
		<-ep.closeDone
		return nil
	}
	ep.closed = true
	defer close(ep.closeDone)
	close(ep.sessCh)
	close(ep.watchStop)
	if ep.pauseTimer != nil {
		ep.pauseTimer.Stop()
	}
	orphan := ep.orphan
	ep.orphan = nil
	lns := make([]*Listener, 0, len(ep.listeners))
	for _, ln := range ep.listeners {
		lns = append(lns, ln)
	}
	ep.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	errs := []error{ep.link.Close()} // ends the session: connections fail
	if orphan != nil {
		for i := range orphan.conns {
			if c := orphan.conns[i].Load(); c != nil && c.pausedAt.Load() != 0 {
				c.fail(fmt.Errorf("%w: endpoint closed: %w", ErrLinkDown, net.ErrClosed))
			}
		}
	}
	ep.pollers.Wait()
	if ep.ownsDev {
		errs = append(errs, ep.dev.Close())
	}
	return errors.Join(errs...)
}

// CloseWith ends the current session with cause, so that its connections
// fail with errors wrapping it, and closes the Endpoint.
func (ep *Endpoint) CloseWith(cause error) error {
	ep.mu.Lock()
	st := ep.cur
	ep.mu.Unlock()
	if st != nil {
		st.sess.Fail(cause)
	}
	return ep.Close()
}

// install is called by the link when a session is established.
func (ep *Endpoint) install(s *partition.Session) {
	st := &state{
		ep:       ep,
		sess:     s,
		parts:    s.Partitions(),
		control:  s.Control(),
		conns:    make([]atomic.Pointer[Conn], ep.cfg.MaxConns+1),
		traffic:  make([]partTraffic, len(s.Partitions())),
		headWait: make([]int64, len(s.Partitions())),
		headOff:  make([]int, len(s.Partitions())),
		refs:     make([]ringRefs, len(s.Partitions())),
		finished: make(chan struct{}),
		stopped:  make(chan struct{}),
	}
	st.nextID = 1
	if ep.byRef {
		for i, p := range st.parts {
			q := &st.refs[i]
			p.OnOverwrite(func(below uint64) { q.overwrite(p, below) })
		}
	}
	for _, p := range st.parts {
		st.rxRings += int64(p.RxRingSize())
	}
	ring := int64(st.parts[0].RxRingSize()) // every partition's (partition.Layout)
	st.window = min(int64(ep.cfg.Window), max(ring/2, minShare))
	size := 1
	if ep.cfg.QoS {
		size = qos.NumClasses
	}
	for i := 0; i < len(st.parts); i += size {
		parts := st.parts[i:min(i+size, len(st.parts))]
		u := &unit{st: st, index: len(st.units), parts: parts, kick: make(chan struct{}, 1),
			buckets: make([]qos.Bucket, len(parts)), conns: make([]int, len(parts))}
		for j := range u.buckets {
			u.buckets[j].Rate = ep.cfg.PartitionRate
		}
		st.units = append(st.units, u)
	}
	if ep.cfg.QoS {
		// A class's connections share one partition per unit (see share).
		st.rxRings = st.rxRings * int64(len(st.units)) / int64(len(st.parts))
	}
	ep.mu.Lock()
	old := ep.last
	ep.mu.Unlock()
	if old != nil {
		old.finish() // ended before this session began; its poller may not have acted on it yet
	}
	ep.mu.Lock()
	if ep.closed {
		ep.mu.Unlock()
		return
	}
	if ep.last != nil {
		st.prevStopped = ep.last.stopped // see awaitPrev
	}
	ep.last = st
	if old = ep.orphan; old != nil {
		ep.orphan = nil
		st.adopt(old)
	}
	ep.cur = st
	close(ep.sessCh)
	ep.sessCh = make(chan struct{})
	ep.pollers.Add(1)
	cpu := 0
	nextCPU := func() int {
		if len(ep.cfg.WorkerCPUs) == 0 {
			return -1
		}
		cpu++
		return ep.cfg.WorkerCPUs[(cpu-1)%len(ep.cfg.WorkerCPUs)]
	}
	switch ep.cfg.CoreModel {
	case CoreShared:
		st.workers = len(st.units)
	case CoreSplit:
		st.workers = 2 * len(st.units)
	}
	st.waiters.Store(int32(1 + st.workers)) // the poller and the workers
	for _, u := range st.units {
		switch ep.cfg.CoreModel {
		case CoreShared:
			ep.pollers.Add(1)
			go u.runWorker(true, true, nextCPU())
		case CoreSplit:
			ep.pollers.Add(2)
			go u.runWorker(true, false, nextCPU())
			go u.runWorker(false, true, nextCPU())
		}
	}
	ep.mu.Unlock()
	go st.runPoller()
}

// session waits for an established session, or ctx.
func (ep *Endpoint) session(ctx context.Context) (*state, error) {
	for {
		ep.mu.Lock()
		st, ch, closed := ep.cur, ep.sessCh, ep.closed
		ep.mu.Unlock()
		if closed {
			return nil, net.ErrClosed
		}
		if st != nil && st.sess.Err() == nil {
			return st, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, fmt.Errorf("no session with the peer (%s link %v): %w", ep.dev.Name(), ep.dev.Link(), ctx.Err())
		}
	}
}

// sessionDone is closed when c's session ends; for a connection waiting to
// resume, when the next session is installed or the endpoint closes. Once
// the session has ended, and until its end has been acted on (finish: c
// pauses or fails, and its notify channels are signalled), it is closed
// only when that is done: a parked call that woke at the end of the
// session before then would find nothing changed, park again at once and
// spin, and with one P keep the poller that calls finish from running
// until the scheduler preempts it, 10 ms later.
func (c *Conn) sessionDone() <-chan struct{} {
	st := c.st()
	if st.sess.Err() == nil {
		return st.sess.Done()
	}
	if c.pausedAt.Load() == 0 {
		return st.finished
	}
	ep := c.ep
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.cur != nil && ep.cur != st {
		return ep.cur.sess.Done() // installed: the take-over wakes it
	}
	return ep.sessCh
}

// enterCall and exitCall bracket a Read or Write past its lock. While more
// goroutines are inside calls than parked, one of them runs (or is about
// to) and polls the rings before it parks or returns, so the poller stays
// off the doorbell (see runPoller); the last one out with others parked
// hands the watch back to the poller.
func (ep *Endpoint) enterCall() { ep.inCall.Add(1) }

func (ep *Endpoint) exitCall() {
	if n := ep.inCall.Add(-1); ep.parked.Load() >= n && n > 0 {
		ep.kickPoller()
	}
}

// callersRun reports whether a goroutine inside a call is not parked: it
// polls the rings itself soon, and it needs this process's CPU.
func (ep *Endpoint) callersRun() bool {
	return ep.active.Load() > 0 || ep.inCall.Load() > ep.parked.Load()
}

// kickPoller wakes the poller if it waits for work.
func (ep *Endpoint) kickPoller() {
	select {
	case ep.kick <- struct{}{}:
	default:
	}
}

// spaceWait returns a channel closed at the next space doorbell.
func (ep *Endpoint) spaceWait() <-chan struct{} {
	ep.spaceMu.Lock()
	defer ep.spaceMu.Unlock()
	return ep.spaceCh
}

func (ep *Endpoint) spaceArrived() {
	ep.spaceMu.Lock()
	close(ep.spaceCh)
	ep.spaceCh = make(chan struct{})
	ep.spaceMu.Unlock()
}
