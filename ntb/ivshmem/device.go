package ivshmem

// Device: an ntb.Device on an ivshmem region. Two attachments to one
// ivshmem server (QEMU guests through PCIPort, host processes through
// Client, in any mix) each wrap their Port in a Device and get the two ends
// of an emulated NTB link: an inbound and an outbound window, 64 doorbell
// bits, 64 scratchpads and link state. The region's layout is drawn in
// device_layout.go.
//
// Side claim. ivshmem has peer ids, not sides, and nothing like a lock that
// the kernel drops when a process dies, across guests. A new attachment
// writes a fresh generation into its presence slot, then, for each side it
// may take (DeviceConfig.Side), looks at every other slot that claims or
// holds that side and judges it by its heartbeat: alive if the slot
// changed within HeartbeatTimeout, dead if it was detached (generation 0)
// or stayed still for a whole HeartbeatTimeout, undecided until then. A
// side with a live holder is taken; a side with no live or undecided
// contender is free, and the attachment marks itself "claiming" it, looks
// again, and holds it only if still nobody else claims or holds it;
// otherwise it withdraws and retries after a random pause. Each claimant
// writes its own slot and then reads the others', so of two racing for a
// side at least one sees the other (sequentially consistent atomics):
// there are never two holders, and no compare-and-swap is needed. A peer
// that Closed is gone at once; a crashed one is recognised as dead after
// HeartbeatTimeout, or at once if the restarted process got the same peer
// id back (the server hands out the lowest free id, so it usually does) —
// either way a restarted peer re-takes its side. AnySide takes the first
// free side, waiting only while neither is free nor known to be taken.
//
// Link handshake. The holder of side S writes its peer id and generation
// into the registers of the other side, which tell the peer whom to ring.
// Each side's monitor, every HeartbeatInterval and whenever its doorbell
// vector fires, checks the peer the registers name: the presence slot must
// carry the same generation and hold the other side. It then accepts that
// generation by writing it into the peer's ack register and rings the peer.
// The link is up while the peer has accepted our current generation and
// its heartbeat has not been seen standing still for SilentTimeout; past
// HeartbeatTimeout it is suspect (time counts only while the monitor runs
// on time, so a stall of our own process or VM never condemns the peer).
// So registers left behind by a dead attachment are never trusted: it
// cannot accept a generation drawn after it died. Close clears the
// presence slot and the identity words and rings the peer, which sees the
// link down at once (ntb.CauseClosed); a peer whose process exits is seen
// gone at the next beat where the Port lists its peers (ntb.CauseGone),
// and otherwise goes down silent after SilentTimeout (ntb.CauseSilent). A holder that finds its side
// taken over (it was silent long enough to be declared dead) reports the
// link down for good and stops writing the peer's registers.
//
// Doorbells. Ringing bit i adds one to the peer's counter i (a counter
// that only we write, so no read-modify-write of a peer-written word);
// a bit is pending while the counter differs from the value last cleared.
// Port vector 0 is the only interrupt used: a goroutine waits on it and
// wakes WaitDoorbell callers and the monitor. A side sleeping in
// WaitDoorbell says so in the ringer's registers; the ringer raises the
// vector only then (one eventfd write on a host, one MMIO write — a VM
// exit — in a guest), so a busy pair rings without system calls. The
// waiter publishes the flag before its last look at the counters and the
// ringer bumps a counter before it reads the flag, so a ring is never
// lost between the two. Link events (attach, accept, detach) always raise
// the vector.
//
// Concurrency: every Device method is safe for concurrent use. Lifetime:
// Close closes the Port, whose mapping the window slices point into; use
// them no longer.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ntstack/ntstack/internal/prim/shmem"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/internal/closeguard"
	"github.com/ntstack/ntstack/ntb/internal/doorbell"
)

// Defaults for DeviceConfig.
const (
	// DefaultHeartbeatInterval is how often a Device beats and looks at its
	// peer. A timer wake-up costs ~150-200 µs of CPU on the VM class
	// ntstack is measured on: 50 ms keeps an idle device near 0.5% of a
	// core. Close and attach are seen at once through the doorbell, not
	// at the next beat.
	DefaultHeartbeatInterval = 50 * time.Millisecond
	// DefaultHeartbeatTimeout is how long a peer may stay silent before
	// the link turns suspect, and a contender for its side is judged
	// dead: five beats, since a loaded machine fires Go timers tens of
	// milliseconds late.
	DefaultHeartbeatTimeout = 250 * time.Millisecond
	// DefaultSilentTimeout is how long a peer may stay silent before the
	// link goes down (ntb.CauseSilent): a user timeout like TCP's, since
	// a peer that is starved of CPU or stopped is not a dead one.
	DefaultSilentTimeout = 10 * time.Second

	// devClaimPoll is the pause between looks at the presence table
	// while a side claim waits or backs off.
	devClaimPoll = 2 * time.Millisecond
	// devClaimBeats bounds a side claim, in heartbeat timeouts: deciding
	// whether a contender is alive takes at most one.
	devClaimBeats = 8
)

// ErrLayout is matched (errors.Is) by the error NewDevice returns for a
// region that does not hold this backend's layout: another magic or
// version, a different size, or too small to hold it.
var ErrLayout = errors.New("ivshmem region layout mismatch")

// ErrSideTaken is matched by the error NewDevice returns when every side
// it may take is held by a live attachment.
var ErrSideTaken = errors.New("ivshmem link side held by a live peer")

// Side selects which end of the link a Device takes.
type Side int

const (
	// AnySide, the zero value, takes a free side, preferring side 0.
	AnySide Side = iota
	Side0
	Side1
)

// DeviceConfig configures NewDevice. The zero value takes any free side
// with the default heartbeat.
type DeviceConfig struct {
	// Name prefixes Device.Name (default "ivshmem<peer id>").
	Name string
	// Side is the end to take.
	Side Side
	// HeartbeatInterval is how often the device beats and checks the
	// peer; HeartbeatTimeout (> interval) how long a silent peer stays
	// up and trusted (then the link is suspect, and another attachment
	// may take the peer's side); SilentTimeout (never shorter) how long
	// until the link goes down. Both ends should use the same values.
	HeartbeatInterval time.Duration
	HeartbeatTimeout  time.Duration
	SilentTimeout     time.Duration
}

func (c *DeviceConfig) setDefaults(id int) {
	if c.Name == "" {
		c.Name = fmt.Sprintf("ivshmem%d", id)
	}
	if c.HeartbeatInterval == 0 {
		c.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if c.HeartbeatTimeout == 0 {
		c.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if c.SilentTimeout == 0 {
		c.SilentTimeout = DefaultSilentTimeout
	}
	c.SilentTimeout = max(c.SilentTimeout, c.HeartbeatTimeout)
}

// Device is one end of an NTB link emulated on an ivshmem region.
type Device struct {
	port        Port
	name        string
	id          int // our peer id, and presence slot
	side        int
	gen         uint64 // our generation
	interval    time.Duration
	timeout     time.Duration // the peer's heartbeat stands still this long: suspect
	silentAfter time.Duration // and this long: down (ntb.CauseSilent)

	mem    shmem.Mem // the whole region
	self   shmem.Mem // our presence slot
	local  shmem.Mem // registers of our side (written by the peer)
	remote shmem.Mem // registers of the peer's side (written by us)
	in     []byte
	out    []byte

	links       *ntb.LinkTracker
	stop        chan struct{} // closed by Close: stop runMonitor
	poke        chan struct{} // capacity 1: runMonitor checks now
	monitorDone chan struct{}
	waitDone    chan struct{}
	stopWait    context.CancelFunc // stops runDoorbells

	beats   atomic.Uint64 // our heartbeat count
	evicted atomic.Bool   // our side was taken over: write nothing more
	silent  atomic.Bool   // fault injection: stop heartbeating

	// guard is held by every method that touches the region, and Close
	// releases it only once they have left.
	guard closeguard.Guard

	mask  doorbell.Mask
	wake  doorbell.Waiters // this process's WaitDoorbell callers
	bells doorbell.Counters

	mu sync.Mutex
	// mu protects the following fields.
	waiters int // WaitDoorbell callers; > 0: the peer must ring
}

var (
	_ ntb.Device      = (*Device)(nil)
	_ ntb.LinkWatcher = (*Device)(nil)
	_ ntb.Liveness    = (*Device)(nil)
)

// NewDevice attaches one end of the link laid out in p's region, stamping
// the layout's header if the region is new. On success the Device owns p
// and closes it on Close; on failure p is left open for the caller.
// NewDevice returns once it holds a side, with the link still down: it
// comes up when the other side's holder has accepted this one (watch Link
// or LinkEvents). Taking a side may wait up to HeartbeatTimeout to learn
// whether a silent previous holder is dead.
func NewDevice(p Port, cfg DeviceConfig) (_ *Device, err error) {
	id := p.ID()
	defer func() {
		if err != nil {
			err = fmt.Errorf("attach ivshmem peer %d: %w", id, err)
		}
	}()
	cfg.setDefaults(id)
	switch {
	case cfg.Side < AnySide || cfg.Side > Side1:
		return nil, fmt.Errorf("invalid side %d", cfg.Side)
	case cfg.HeartbeatInterval < 0 || cfg.HeartbeatTimeout <= cfg.HeartbeatInterval:
		return nil, fmt.Errorf("heartbeat timeout %v must exceed the interval %v", cfg.HeartbeatTimeout, cfg.HeartbeatInterval)
	case id < 0 || id >= devSlots:
		return nil, fmt.Errorf("peer id %d: the layout has presence slots for ids 0..%d: %w", id, devSlots-1, ntb.ErrNotSupported)
	case p.Vectors() <= devVector:
		return nil, fmt.Errorf("port has %d doorbell vectors, need %d: %w", p.Vectors(), devVector+1, ntb.ErrNotSupported)
	}
	mem := shmem.Mem(p.Mem())
	if len(mem) < devMinRegion {
		return nil, fmt.Errorf("region of %d bytes, the layout needs at least %d: %w", len(mem), devMinRegion, ErrLayout)
	}
	if !shmem.Aligned8(mem) {
		return nil, errors.New("region is not 8-byte aligned")
	}
	window := devWindowSize(len(mem))
	if err := checkHeader(mem, window); err != nil {
		return nil, err
	}

	d := &Device{
		port:        p,
		id:          id,
		gen:         rand.Uint64() | 1,
		interval:    cfg.HeartbeatInterval,
		timeout:     cfg.HeartbeatTimeout,
		silentAfter: cfg.SilentTimeout,
		mem:         mem,
		self:        mem[devSlotOffset(id) : devSlotOffset(id)+devSlotSize],
	}
	// Announce ourselves (idle) before looking at anyone else.
	d.self.Store32(devSlotState, devStateIdle)
	d.self.Store64(devSlotBeat, 0)
	d.self.Store64(devSlotGen, d.gen)
	if d.side, err = d.claim(cfg.Side); err != nil {
		d.self.Store64(devSlotGen, 0)
		d.self.Store32(devSlotState, devStateIdle)
		return nil, err
	}
	d.name = fmt.Sprintf("%s/%d", cfg.Name, d.side)
	peer := 1 - d.side
	d.local = mem[devRegsOffset(d.side) : devRegsOffset(d.side)+devPage]
	d.remote = mem[devRegsOffset(peer) : devRegsOffset(peer)+devPage]
	d.in = mem[devWindowOffset(d.side, window) : devWindowOffset(d.side, window)+window]
	d.out = mem[devWindowOffset(peer, window) : devWindowOffset(peer, window)+window]

	// Resume the doorbell counters where they stand, so that rings meant
	// for an earlier holder of a side do not look pending, and ours carry
	// on from the earlier holder's.
	d.bells.Attach(d.local, d.remote, devRegDoorbells)
	// Tell the peer who holds our side; the id last, so a peer that sees
	// it sees a generation that matches our slot.
	d.remote.Store32(devRegPeerWaiting, 0)
	d.remote.Store64(devRegPeerAck, 0)
	d.remote.Store64(devRegPeerGen, d.gen)
	d.remote.Store32(devRegPeerID, uint32(id)+1)

	d.links = ntb.NewLinkTracker()
	d.stop = make(chan struct{})
	d.poke = make(chan struct{}, 1)
	d.monitorDone = make(chan struct{})
	d.waitDone = make(chan struct{})
	var waitCtx context.Context
	waitCtx, d.stopWait = context.WithCancel(context.Background())
	go d.runDoorbells(waitCtx)
	go d.runMonitor()
	if pid, ok := d.peerID(); ok {
		_ = d.port.Ring(pid, devVector) // "we are here": the peer checks now
	}
	return d, nil
}

// checkHeader stamps a zero header and checks any other.
func checkHeader(mem shmem.Mem, window int) error {
	if mem.Load32(devHdrMagic) == 0 {
		// Every value is a function of the region size, so a concurrent
		// stamper writes the same bytes; the magic goes last.
		mem.Store32(devHdrVersion, devVersion)
		mem.Store64(devHdrRegionSize, uint64(len(mem)))
		mem.Store64(devHdrWindowSize, uint64(window))
		mem.Store32(devHdrSlots, devSlots)
		mem.Store32(devHdrMagic, devMagic)
	}
	magic, version := mem.Load32(devHdrMagic), mem.Load32(devHdrVersion)
	size, win, slots := mem.Load64(devHdrRegionSize), mem.Load64(devHdrWindowSize), mem.Load32(devHdrSlots)
	switch {
	case magic != devMagic:
		return fmt.Errorf("header magic %#08x is not %#08x (%q): %w", magic, devMagic, "NTBI", ErrLayout)
	case version != devVersion:
		return fmt.Errorf("layout version %d, this build speaks %d: %w", version, devVersion, ErrLayout)
	case size != uint64(len(mem)):
		return fmt.Errorf("header says a region of %d bytes, the port maps %d: %w", size, len(mem), ErrLayout)
	case win != uint64(window):
		return fmt.Errorf("header says windows of %d bytes, want %d: %w", win, window, ErrLayout)
	case slots != devSlots:
		return fmt.Errorf("header says %d presence slots, want %d: %w", slots, devSlots, ErrLayout)
	}
	return nil
}

// slotView is what a claimant has seen of another attachment's presence
// slot. Nothing in it is trusted beyond comparison: a state outside the
// known values claims nothing.
type slotView struct {
	gen, beat uint64
	state     uint32
	seen      bool          // looked at once
	changed   bool          // seen to change at least once
	still     time.Duration // watched standing still since the last change
}

type liveness int

const (
	undecided liveness = iota
	dead
	alive
)

// claimer is the state of one side claim.
type claimer struct {
	d     *Device
	last  time.Time // previous observe
	views [devSlots]slotView
}

// observe reads every other presence slot and notes which changed. As in
// checkPeer, a late look of ours adds at most two intervals of stillness,
// so a stall of the claimant never makes a live holder look dead.
func (c *claimer) observe(now time.Time) {
	var gap time.Duration
	if !c.last.IsZero() {
		gap = min(now.Sub(c.last), 2*c.d.interval)
	}
	c.last = now
	for id := range devSlots {
		if id == c.d.id {
			continue
		}
		s := c.d.slot(id)
		gen, state, beat := s.Load64(devSlotGen), s.Load32(devSlotState), s.Load64(devSlotBeat)
		v := &c.views[id]
		switch {
		case !v.seen:
			*v = slotView{gen: gen, beat: beat, state: state, seen: true}
		case gen != v.gen || beat != v.beat || state != v.state:
			v.gen, v.beat, v.state, v.changed, v.still = gen, beat, state, true, 0
		default:
			v.still += gap
		}
	}
}

func (c *claimer) liveness(id int) liveness {
	v := &c.views[id]
	switch {
	case v.gen == 0 || v.still >= c.d.timeout:
		return dead
	case v.changed:
		return alive
	}
	return undecided
}

// contenders reports the live holder of side s (-1: none) and whether any
// attachment that is not known dead claims or holds it.
func (c *claimer) contenders(s int) (holder int, busy bool) {
	holder = -1
	for id := range devSlots {
		v := &c.views[id]
		if id == c.d.id || (v.state != devStateClaim+uint32(s) && v.state != devStateHold+uint32(s)) {
			continue
		}
		switch c.liveness(id) {
		case dead:
		case alive:
			if v.state == devStateHold+uint32(s) {
				return id, true
			}
			busy = true
		default:
			busy = true
		}
	}
	return holder, busy
}

// claim takes a side by the protocol in this file's comment.
func (d *Device) claim(want Side) (int, error) {
	sides := []int{0, 1}
	if want != AnySide {
		sides = []int{int(want - Side0)}
	}
	c := &claimer{d: d}
	start := time.Now()
	lastBeat := start
	for {
		now := time.Now()
		if now.Sub(lastBeat) >= d.interval {
			d.self.Store64(devSlotBeat, d.beats.Add(1))
			lastBeat = now
		}
		c.observe(now)
		free := -1
		var holders []int
		for _, s := range sides {
			holder, busy := c.contenders(s)
			if holder >= 0 {
				holders = append(holders, holder)
			} else if !busy && free < 0 {
				free = s
			}
		}
		switch {
		case len(holders) == 2:
			return -1, fmt.Errorf("both sides are held by live peers %d and %d: %w", holders[0], holders[1], ErrSideTaken)
		case len(holders) == len(sides):
			return -1, fmt.Errorf("side %d is held by live peer %d: %w", sides[0], holders[0], ErrSideTaken)
		case free >= 0:
			d.self.Store32(devSlotState, devStateClaim+uint32(free))
			c.observe(time.Now())
			if _, busy := c.contenders(free); !busy {
				d.self.Store32(devSlotState, devStateHold+uint32(free))
				return free, nil
			}
			d.self.Store32(devSlotState, devStateIdle) // contended: withdraw, retry
			time.Sleep(devClaimPoll * time.Duration(1+rand.IntN(4)))
			continue
		case now.Sub(start) > devClaimBeats*d.timeout:
			return -1, fmt.Errorf("claim a side: still contended after %v", now.Sub(start).Round(time.Millisecond))
		}
		time.Sleep(devClaimPoll)
	}
}

func (d *Device) slot(id int) shmem.Mem {
	return d.mem[devSlotOffset(id) : devSlotOffset(id)+devSlotSize]
}

// peerID is the peer id the registers name as the other side's holder, if
// it is a valid id other than ours. The word is peer-written: only its
// range is trusted.
func (d *Device) peerID() (int, bool) {
	v := d.local.Load32(devRegPeerID)
	if v == 0 || v > devSlots || int(v-1) == d.id {
		return -1, false
	}
	return int(v - 1), true
}

// wakeLocal wakes this process's WaitDoorbell callers so they re-check.
func (d *Device) wakeLocal() { d.wake.Wake() }

func (d *Device) pokeMonitor() {
	select {
	case d.poke <- struct{}{}:
	default:
	}
}

// Name is the configured name and the side, e.g. "ivshmem3/0".
func (d *Device) Name() string { return d.name }

// Side is the end of the link this Device holds: 0 or 1.
func (d *Device) Side() int { return d.side }

// Port is the same as Side.
func (d *Device) Port() int { return d.side }

// InboundWindow is this side's window in the region. The peer writes it;
// its contents are untrusted. Valid until Close.
func (d *Device) InboundWindow() []byte { return d.in }

// OutboundWindow is the peer's inbound window. Valid until Close.
func (d *Device) OutboundWindow() []byte { return d.out }

func (d *Device) DoorbellCount() int { return devDoorbellBits }

// RingPeer adds one to the peer's counter of every bit set and, if the
// peer sleeps in WaitDoorbell, raises its doorbell vector. A peer that has
// just left is not an error: the link goes down.
func (d *Device) RingPeer(bits uint64) error {
	if !d.guard.Enter() {
		return ntb.ErrClosed
	}
	defer d.guard.Exit()
	if d.evicted.Load() {
		return fmt.Errorf("ring peer: side %d taken over: %w", d.side, ntb.ErrLinkDown)
	}
	d.bells.Ring(bits)
	if d.local.Load32(devRegPeerWaiting) == 0 {
		return nil // awake: it will see the counters without an interrupt
	}
	id, ok := d.peerID()
	if !ok {
		return nil
	}
	if err := d.port.Ring(id, devVector); err != nil && !errors.Is(err, ErrNoPeer) {
		return fmt.Errorf("ring peer %d: %w", id, err)
	}
	return nil
}

func (d *Device) Doorbells() uint64 {
	if !d.guard.Enter() {
		return 0
	}
	defer d.guard.Exit()
	return d.bells.Pending()
}

func (d *Device) ClearDoorbells(bits uint64) {
	if !d.guard.Enter() {
		return
	}
	defer d.guard.Exit()
	d.bells.Clear(bits)
}

func (d *Device) SetDoorbellMask(bits uint64) { d.mask.Update(bits, 0, nil) }

func (d *Device) ClearDoorbellMask(bits uint64) {
	d.mask.Update(0, bits, nil)
	d.wakeLocal() // a newly unmasked bit may be pending
}

// WaitDoorbell sleeps until an unmasked bit of want is pending. While any
// caller sleeps the peer is asked to raise the doorbell vector on every
// ring; link changes, Close and ctx wake it too.
func (d *Device) WaitDoorbell(ctx context.Context, want uint64) (uint64, error) {
	if !d.guard.Enter() {
		return 0, ntb.ErrClosed
	}
	defer d.guard.Exit()
	linkSeq := d.links.Seq()
	d.setWaiting(1)
	defer d.setWaiting(-1)
	return d.wake.Wait(ctx, func() (bool, uint64, error) {
		p := d.bells.Pending() & want
		return doorbell.Done(ctx, d.guard.Closed(), p, d.mask.Load(), d.links.Seq() != linkSeq)
	})
}

// setWaiting counts WaitDoorbell callers in and out and tells the peer
// whether to raise the vector when it rings.
func (d *Device) setWaiting(delta int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.waiters += delta
	if d.evicted.Load() {
		return
	}
	switch {
	case delta > 0 && d.waiters == 1:
		d.remote.Store32(devRegPeerWaiting, 1)
	case delta < 0 && d.waiters == 0:
		d.remote.Store32(devRegPeerWaiting, 0)
	}
}

func (d *Device) ScratchpadCount() int { return devScratchpadRegs }

// Scratchpad reads local scratchpad i, as the peer last wrote it.
func (d *Device) Scratchpad(i int) (uint32, error) {
	if i < 0 || i >= devScratchpadRegs {
		return 0, fmt.Errorf("scratchpad %d of %d: out of range", i, devScratchpadRegs)
	}
	if !d.guard.Enter() {
		return 0, ntb.ErrClosed
	}
	defer d.guard.Exit()
	return d.local.Load32(devRegScratchpads + 4*i), nil
}

func (d *Device) SetPeerScratchpad(i int, v uint32) error {
	if i < 0 || i >= devScratchpadRegs {
		return fmt.Errorf("scratchpad %d of %d: out of range", i, devScratchpadRegs)
	}
	if !d.guard.Enter() {
		return ntb.ErrClosed
	}
	defer d.guard.Exit()
	if d.evicted.Load() {
		return fmt.Errorf("set peer scratchpad %d: side %d taken over: %w", i, d.side, ntb.ErrLinkDown)
	}
	d.remote.Store32(devRegScratchpads+4*i, v)
	return nil
}

func (d *Device) Link() ntb.LinkState { return d.links.Link() }

// Suspect reports an up link whose peer's heartbeat has stood still
// longer than DeviceConfig.HeartbeatTimeout (see ntb.Liveness).
func (d *Device) Suspect() bool { return d.links.Suspect() }

// LinkCause says why the link is down (see ntb.Liveness). A peer whose
// process exited is gone at once where the Port lists its peers (the
// host-side Client); behind a PCI port it ends silent.
func (d *Device) LinkCause() ntb.Cause { return d.links.Cause() }

// LinkReason says why the link entered its current state.
func (d *Device) LinkReason() string { return d.links.Reason() }

func (d *Device) LinkEvents() <-chan ntb.LinkEvent { return d.links.Events() }

// LinkChanged returns a channel closed by the next link change (see
// ntb.LinkWatcher).
func (d *Device) LinkChanged() <-chan struct{} { return d.links.Changed() }

// Close detaches — the peer sees the link go down at once — and closes
// the Port. It is idempotent.
func (d *Device) Close() error {
	return d.guard.Close(func() {
		close(d.stop)
		<-d.monitorDone
	}, func() {
		d.links.CloseLocal(time.Now())
		d.wakeLocal() // WaitDoorbell callers return ErrClosed
	}, func() error { // methods in flight have finished: nothing writes after us
		d.self.Store64(devSlotGen, 0)
		d.self.Store32(devSlotState, devStateIdle)
		if !d.evicted.Load() {
			d.remote.Store32(devRegPeerWaiting, 0)
			d.remote.Store64(devRegPeerGen, 0)
			d.remote.Store32(devRegPeerID, 0)
			if id, ok := d.peerID(); ok {
				_ = d.port.Ring(id, devVector) // "gone": the peer checks now
			}
		}
		d.stopWait()
		<-d.waitDone
		if err := d.port.Close(); err != nil {
			return fmt.Errorf("close %s: %w", d.name, err)
		}
		return nil
	})
}
