package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/partition"
	"github.com/ntstack/ntstack/qos"
)

// Defaults for Config.
const (
	DefaultSpinBudget   = 50 * time.Microsecond
	DefaultWindow       = 4 << 20
	DefaultMTU          = 64 << 10
	DefaultSharedWindow = 64 << 10
	DefaultBacklog      = 128
	DefaultMaxConns     = 4096
	DefaultSpinYield    = 64

	minWindow = 4 << 10
	maxWindow = 64 << 20
)

// ErrLinkDown is wrapped by errors of connections whose link or session
// went down. It is ntb.ErrLinkDown, so either name matches.
var ErrLinkDown = ntb.ErrLinkDown

// Config configures an Endpoint. The zero value is usable.
type Config struct {
	// SpinBudget is how long a blocked call polls before it parks. Polling
	// keeps a round trip under a microsecond; parking costs a wake-up of
	// ~5-35 µs on this machine class but no CPU. Negative: never spin.
	SpinBudget time.Duration
	// Window is each connection's receive window in bytes (4 KiB..64 MiB;
	// default DefaultWindow, 4 MiB). A connection announces no more than
	// half a ring of the link, and is granted less while many share the
	// rings (see state.share). On the emulated fabric a stream runs
	// fastest with more than a CPU's L2 in flight: the reader then finds
	// the writer's lines gone to the shared cache rather than dirty in the
	// writer's, to be fetched from there. One 64 KiB stream on the 2-vCPU
	// VM (2 MiB L2 each): 15.6 GB/s with a 1 MiB window, 16.5 with 2 MiB,
	// 21.9 with 4 MiB; two streams 15.1, 19.3, 19.5 (medians of 3,
	// alternating).
	Window int
	// MTU is the largest DATA frame; larger writes are cut into MTU-sized
	// frames so small messages interleave with bulk ones. Up to
	// DefaultMTU, frames on a partition that carries small messages are
	// cut smaller still, to 16 KiB pieces (see smallPiece); an MTU above
	// DefaultMTU turns that off too.
	MTU int
	// SharedWindow bounds the bulk data a small message can find ahead of
	// it in a partition's ring. While a partition carries a small-message
	// connection (one that sent no record larger than 4 KiB within the
	// last 10 ms), the receive windows of its connections shrink to
	// SharedWindow split among the bulk ones (those that did; at least
	// 16 KiB each) — by holding back credit, as for the ring shares —
	// instead of Window each: with the 4 MiB default Window one bulk flow
	// can queue ~300 µs of copying ahead of a small message. (A small
	// flow never has that much in flight, so the limit costs it nothing.)
	// Partitions without small-message traffic keep the full window.
	// Default DefaultSharedWindow (64 KiB: beside two bulk flows a small
	// message's p99 was 0.76x its p99 alone at 64 KiB and 1.6x at 128 KiB,
	// bulk throughput the same, medians of 5 on the 2-vCPU test machine);
	// negative: no limit. Only the receiving side's setting matters.
	SharedWindow int
	// Backlog is the per-listener queue of accepted, unaccepted connections.
	Backlog int
	// MaxConns bounds connections per endpoint (ids are 20 bits).
	MaxConns int
	// Partitions is the number of data partitions (ring pairs) of the link,
	// 1..30; both ends must agree (default 1). With QoS, the partitions form
	// units of up to 8, one partition per class.
	Partitions int
	// QoS gives each priority class its own partition within a unit of 8,
	// so a class-0 message never queues behind class-7 records.
	QoS bool
	// CoreModel says who drives the partitions (default CoreInline).
	CoreModel CoreModel
	// WorkerCPUs, if set, pins worker threads to these CPUs, in turn.
	WorkerCPUs []int
	// Placement spreads new connections over the units.
	Placement Placement
	// Rebalance migrates connections between units under load skew.
	Rebalance bool
	// Batch bounds the bytes a connection sends per scheduling round
	// (default: the MTU), so connections sharing a partition interleave.
	Batch int
	// PartitionConns is the connection quota of each partition (0: none).
	PartitionConns int
	// PartitionRate limits each partition to this many bytes per second
	// (token bucket; 0: unlimited).
	PartitionRate int64
	// MemoryQuota bounds the receive-window memory of all this endpoint's
	// connections together: a connection reserves its window, Window or
	// half a ring if that is less, as it announces it (0: none).
	MemoryQuota int64
	// SpinYield is how many polling rounds a spinning call makes between
	// yields of the CPU, to this process's other goroutines and to other
	// processes (default DefaultSpinYield). Fewer rounds serve a process
	// whose goroutines pass each message on to each other, like ntproxy
	// (16 there: proxied 64 B round trips p50 37-38 -> 25-30 µs, pooled
	// ones 20 -> 13 µs, proxied 64 KiB streams 2.5-2.7 -> 3.0 GB/s; 16 in
	// the applications too: 18 µs); more rounds serve one whose
	// latency-sensitive flow shares the process with bulk ones (with 16,
	// a 64 B flow's p99 beside two bulk flows went from 6 to 56 µs: the
	// bulk goroutines took the P at every yield). Sets of 3-4 alternating
	// runs on the 2-vCPU VM.
	SpinYield int
	// HandOff says the process's goroutines hand each message on to each
	// other, as ntproxy's do (a leg's receiver to the deliverer): a bulk
	// Read then yields the processor once per record whatever the link
	// carries, so that the goroutine it handed to runs. Otherwise a bulk
	// Read yields only while the link carries a small-message flow (see
	// yieldAbove). ntproxy sets it on its links: without the yield there
	// its pooled 64 KiB stream fell from 6.0-7.1 to 5.1-5.4 GB/s. Its
	// endpoints for applications leave it off: proxied streams rose from
	// 3.7 to 4.7 GB/s without the yield, and kept that with it off there.
	HandOff bool
	// Fabric configures the emulated fabric for Open.
	Fabric shm.Options
	// Logf, if set, receives link and session events.
	Logf func(format string, args ...any)
}

func (c *Config) setDefaults() error {
	if c.SpinBudget == 0 {
		c.SpinBudget = DefaultSpinBudget
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
	if c.Backlog == 0 {
		c.Backlog = DefaultBacklog
	}
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.Partitions == 0 {
		c.Partitions = 1
	}
	if c.SpinYield == 0 {
		c.SpinYield = DefaultSpinYield
	}
	if c.Batch == 0 {
		c.Batch = c.MTU
	}
	if c.SharedWindow == 0 {
		c.SharedWindow = DefaultSharedWindow
	}
	switch {
	case c.Window < minWindow || c.Window > maxWindow:
		return fmt.Errorf("window %d outside [%d, %d]", c.Window, minWindow, maxWindow)
	case c.MTU < 1:
		return fmt.Errorf("mtu %d", c.MTU)
	case c.SharedWindow > 0 && c.SharedWindow < minWindow:
		return fmt.Errorf("shared window %d below %d", c.SharedWindow, minWindow)
	case c.SpinYield < 1:
		return fmt.Errorf("spin yield %d", c.SpinYield)
	case c.Batch < 1:
		return fmt.Errorf("batch %d", c.Batch)
	case c.Partitions < 1 || c.Partitions > partition.MaxPartitions:
		return fmt.Errorf("partitions %d outside [1, %d]", c.Partitions, partition.MaxPartitions)
	case c.CoreModel < CoreInline || c.CoreModel > CoreSplit:
		return fmt.Errorf("core model %d", c.CoreModel)
	case c.MaxConns < 1 || c.MaxConns > maxID:
		return fmt.Errorf("max conns %d outside [1, %d]", c.MaxConns, maxID)
	}
	return nil
}

// Endpoint is this process's end of one NTB link.
type Endpoint struct {
	cfg     Config
	dev     ntb.Device
	idler   ntb.Idler // dev, if it checks its link less often while we are idle
	ownsDev bool
	link    *partition.Link

	pollers     sync.WaitGroup // runPoller goroutines
	born        time.Time      // origin of now
	progress    atomic.Int64   // now() when records last moved, as far as lastProgress knows
	moved       atomic.Bool    // records moved since progress was last brought up to date
	maxSpinners int            // GOMAXPROCS at Attach
	counters    counters
	handoffs    atomic.Uint64 // wake-ups of parked goroutines, for spinners
	active      atomic.Int32  // goroutines spin-polling
	parked      atomic.Int32  // goroutines parked, waiting for the poller
	writersOut  atomic.Int32  // of those, writers with bytes left to send (see busy)
	idle        atomic.Bool   // idler was told this end is idle (state.announceIdle)
	inCall      atomic.Int32  // goroutines inside Read or Write (past its lock), parked or not
	smallFor    int64         // smallRecent, in ns (tests lengthen it before connecting)
	accepting   atomic.Int32  // goroutines in Accept: the poller arms once calls stop (see idleGrace)
	calls       atomic.Uint64 // Read and Write calls: the poller stays off while they come
	kick        chan struct{} // wakes the poller when it waits for work

	taps atomic.Pointer[tapSet] // frame taps, nil when none (tap.go)

	mu sync.Mutex
	// mu protects the following fields.
	listeners map[uint16]*Listener
	cur       *state        // current session, nil while the link is down
	sessCh    chan struct{} // closed when a session is installed or the endpoint closes
	closed    bool

	spaceMu sync.Mutex
	// spaceMu protects the following fields.
	spaceCh chan struct{} // closed when the peer hands back ring space

	quota qos.Quota // receive-window memory
}

// Open attaches this process to its end of the emulated link called name
// and returns an Endpoint that owns it.
func Open(name string, cfg Config) (*Endpoint, error) {
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
	}
	ep.quota.Name, ep.quota.Limit = "receive-window memory quota", cfg.MemoryQuota
	ep.idler, _ = dev.(ntb.Idler)
	link, err := partition.Open(dev, partition.Config{Partitions: cfg.Partitions, OnSession: ep.install, Logf: cfg.Logf})
	if err != nil {
		return nil, fmt.Errorf("attach %s: %w", dev.Name(), err)
	}
	ep.link = link
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
// read the clock (6 % of a 64 B writer's CPU); lastProgress, which the
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
func (ep *Endpoint) Close() error {
	ep.mu.Lock()
	if ep.closed {
		ep.mu.Unlock()
		return nil
	}
	ep.closed = true
	close(ep.sessCh)
	lns := make([]*Listener, 0, len(ep.listeners))
	for _, ln := range ep.listeners {
		lns = append(lns, ln)
	}
	ep.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	errs := []error{ep.link.Close()} // ends the session: connections fail
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
	}
	st.nextID = 1
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
	if ep.closed {
		ep.mu.Unlock()
		return
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
