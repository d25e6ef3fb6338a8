package intel

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/internal/closeguard"
	"github.com/ntstack/ntstack/ntb/internal/doorbell"
	"github.com/ntstack/ntstack/vfio"
)

// Defaults for Options. A peer whose heartbeat stands still for
// DefaultHeartbeatTimeout (plus at most one interval: 70 ms) makes the
// link suspect; only DefaultSilentTimeout of silence, a user timeout like
// TCP's, takes it down, since a driver that is starved of CPU beats late
// and is not gone. A peer that detaches, and the PCIe link going down,
// are seen at the next poll. Each tick costs a handful of register
// accesses: nothing measurable at idle.
const (
	DefaultWindowSize        = 16 << 20
	DefaultHeartbeatInterval = 10 * time.Millisecond
	DefaultHeartbeatTimeout  = 60 * time.Millisecond
	DefaultSilentTimeout     = 10 * time.Second
)

// Options configure Open and SimulatedPair.Open. The zero value is usable.
type Options struct {
	// WindowSize is the inbound window in bytes: a power of two, at least
	// 4 KiB and at most the window BAR's size. Both ends must agree, or
	// the link stays down. Default: 16 MiB, or the BAR size if smaller.
	WindowSize int
	// WindowIOVA is where the inbound buffer is mapped for the device; it
	// must be a multiple of the window BAR's size (the hardware wants the
	// translation aligned so). 0 picks the first such address inside the
	// IOMMU's valid ranges.
	WindowIOVA vfio.IOVA
	// AllowUncachedWindow maps the window BAR uncached when no
	// write-combined mapping exists, instead of failing with an error
	// matching ntb.ErrNotSupported. Uncached, every store is its own
	// PCIe write: expect a fraction of the bandwidth.
	AllowUncachedWindow bool
	HeartbeatInterval   time.Duration
	// HeartbeatTimeout is how long the peer's heartbeat may stand still
	// before the link turns suspect (ntb.LinkEvent.Suspect).
	HeartbeatTimeout time.Duration
	// SilentTimeout is how long it may stand still before the link goes
	// down with ntb.CauseSilent; never shorter than HeartbeatTimeout.
	SilentTimeout time.Duration
}

func (o *Options) setDefaults() {
	if o.HeartbeatInterval <= 0 {
		o.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if o.HeartbeatTimeout <= 0 {
		o.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if o.SilentTimeout <= 0 {
		o.SilentTimeout = DefaultSilentTimeout
	}
	o.SilentTimeout = max(o.SilentTimeout, o.HeartbeatTimeout)
}

// windowSize checks o.WindowSize against a window BAR of barSize bytes.
func (o *Options) windowSize(barSize uint64) (int, error) {
	size := uint64(o.WindowSize)
	if size == 0 {
		size = min(DefaultWindowSize, barSize)
	}
	if size < minWindow || size&(size-1) != 0 || size > barSize {
		return 0, fmt.Errorf("window size %d: want a power of two from %d to the BAR size %d", size, minWindow, barSize)
	}
	return int(size), nil
}

// NotSupportedError reports a device, topology or platform capability
// this backend cannot use. It matches ntb.ErrNotSupported.
type NotSupportedError struct{ What string }

func (e *NotSupportedError) Error() string        { return e.What + ": not supported" }
func (e *NotSupportedError) Is(target error) bool { return target == ntb.ErrNotSupported }

func notSupported(format string, a ...any) error {
	return &NotSupportedError{What: fmt.Sprintf(format, a...)}
}

// irqSource delivers the port's interrupts: Wait returns once per batch
// of MSI-X messages, and with an error once Close has been called. A
// *vfio.Eventfd behind the VFIO path, a channel behind the simulator.
type irqSource interface {
	Wait() (uint64, error)
	Close() error
}

// hardware is what Open or the simulator hands the common code.
type hardware struct {
	name    string
	lay     layout
	port    int
	regs    Regs
	in, out []byte
	iova    uint64 // where in lands for the device
	barBase uint64 // bus address of the window BAR: LIMIT = barBase + size
	barSize uint64
	cfg     configSpace
	irq     irqSource
	release func() error // unmaps and closes what the hardware holds
}

// Device is one Intel NTB port driven from user space.
type Device struct {
	hw    hardware
	regs  Regs
	valid uint64 // doorbell bits offered
	nonce uint32 // this instance, as the peer sees it

	interval, timeout, silentAfter time.Duration

	links  *ntb.LinkTracker
	stop   chan struct{}
	done   chan struct{} // runMonitor has returned
	irqEnd chan struct{} // runInterrupts has returned
	nudge  chan struct{} // a link interrupt arrived

	reason atomic.Pointer[string]
	hwUp   atomic.Bool
	silent atomic.Bool // tests: a hung driver stops heartbeating

	// guard is held by every method that touches registers, and Close
	// tears them down only once they have left.
	guard closeguard.Guard

	mask doorbell.Mask    // mirrored in the interrupt disable register
	wake doorbell.Waiters // WaitDoorbell callers
}

var (
	_ ntb.Device      = (*Device)(nil)
	_ ntb.LinkWatcher = (*Device)(nil)
	_ ntb.Liveness    = (*Device)(nil)
)

// start brings the port up and starts its goroutines. It releases hw on
// failure.
func start(hw hardware, o Options) (*Device, error) {
	o.setDefaults()
	d := &Device{
		hw:          hw,
		regs:        hw.regs,
		valid:       uint64(1)<<hw.lay.doorbells - 1,
		nonce:       rand.Uint32() | 1,
		interval:    o.HeartbeatInterval,
		timeout:     o.HeartbeatTimeout,
		silentAfter: o.SilentTimeout,
		links:       ntb.NewLinkTracker(),
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
		irqEnd:      make(chan struct{}),
		nudge:       make(chan struct{}, 1),
	}
	why := "waiting for the peer"
	d.reason.Store(&why)
	if err := d.bringUp(); err != nil {
		d.quiesce()
		return nil, errors.Join(fmt.Errorf("bring up: %w", err), hw.irq.Close(), hw.release())
	}
	go d.runInterrupts()
	go d.runMonitor()
	return d, nil
}

// bringUp programs the port as Linux's gen3_init_dev/gen4_init_dev,
// mw_set_trans and link_enable do, then clears what a previous session
// left behind.
func (d *Device) bringUp() error {
	r, gen := d.regs, d.hw.lay.gen
	// Mask every doorbell and shut the inbound window while setting up
	// (*_init_ntb, *_setup_b2b_mw: limit == base is a zero-length window).
	r.Write64(regIntDisable, uint64(1)<<hwDoorbells-1)
	r.Write64(regIMLimit, d.hw.barBase)
	r.Write64(regIMXlat, 0)
	if gen == Gen3 {
		r.Write16(regGen3SPCICmd, pciCommandMemory|pciCommandMaster)
	} else {
		r.Write16(regGen4LinkCtrl, r.Read16(regGen4LinkCtrl)|gen4LinkDisable)
	}
	// Reset routes sources 1-32,0 to vectors 0-32; route source i to
	// vector i. SKX's vector 32 is broken: its link source goes to 31.
	for i := range msixVectors {
		r.Write8(d.hw.lay.intVec+i, uint8(i))
	}
	if gen == Gen3 {
		r.Write8(d.hw.lay.intVec+msixVectors-1, msixVectors-2)
	}
	// What a previous session left, cleared before the link is enabled:
	// once it is, the peer's handshake and hello may arrive at any time.
	for i := spadMagic; i < hwSpads; i++ {
		r.Write32(regSpad+4*i, 0) // a previous peer's handshake
	}
	r.Write64(regIntStatus, d.valid|d.hw.lay.helloBit|d.hw.lay.linkBits) // stale rings
	if err := d.setTranslation(); err != nil {
		return err
	}
	if err := d.enableLink(); err != nil {
		return err
	}
	r.Write64(regIntDisable, 0)
	return nil
}

// setTranslation points inbound window 0 at our buffer, verifying each
// register by reading it back (intel_ntb3_mw_set_trans,
// intel_ntb4_mw_set_trans, DPDK intel_ntb_mw_set_trans).
func (d *Device) setTranslation() error {
	r, size := d.regs, uint64(len(d.hw.in))
	if d.hw.iova == 0 || d.hw.iova%d.hw.barSize != 0 {
		return fmt.Errorf("inbound iova %#x is not a non-zero multiple of the BAR size %#x", d.hw.iova, d.hw.barSize)
	}
	set := func(name string, off int, v uint64) error {
		r.Write64(off, v)
		if got := r.Read64(off); got != v {
			r.Write64(regIMLimit, d.hw.barBase)
			r.Write64(regIMXlat, 0)
			return fmt.Errorf("set %s: wrote %#x, reads back %#x", name, v, got)
		}
		return nil
	}
	if err := set("xlat", regIMXlat, d.hw.iova); err != nil {
		return err
	}
	if err := set("limit", regIMLimit, d.hw.barBase+size); err != nil {
		return err
	}
	if d.hw.lay.gen == Gen4 {
		// ICX wants the window size as a log2 index too (NTB_HWERR_BAR_ALIGN).
		idx := uint16(bits.TrailingZeros64(size))
		if r.Write16(regGen4IMBaseIdx, idx); r.Read16(regGen4IMBaseIdx) != idx {
			return fmt.Errorf("set base index %d: does not read back", idx)
		}
		return nil
	}
	// SKX: the external side's limit too, from its BAR base.
	return set("external limit", regGen3EMLimit, r.Read64(regGen3EMBar1)&^0xf+size)
}

func (d *Device) enableLink() error {
	r := d.regs
	if d.hw.lay.gen == Gen3 {
		r.Write32(regNTBCntl, r.Read32(regNTBCntl)&^(ntbCtlDisable|ntbCtlCfgLock)|ntbCtlSnoop)
		return nil
	}
	r.Write32(regNTBCntl, ntbCtlSnoop)
	r.Write16(regGen4LinkCtrl, r.Read16(regGen4LinkCtrl)&^gen4LinkDisable)
	r.Write32(regGen4PPD0, r.Read32(regGen4PPD0)|gen4PPDLinkTrain)
	if r.Read32(regGen4PPD0)&gen4PPDLinkTrain == 0 {
		return errors.New("enable link: link is not training (PPD0)")
	}
	return nil
}

// quiesce shuts the inbound window, masks doorbells and disables the
// link (intel_ntb_link_disable, intel_ntb4_link_disable; DPDK clears the
// translation on stop so the peer cannot reach our memory).
func (d *Device) quiesce() {
	r := d.regs
	r.Write64(regIMXlat, 0)
	r.Write64(regIMLimit, d.hw.barBase)
	r.Write64(regIntDisable, uint64(1)<<hwDoorbells-1)
	if d.hw.lay.gen == Gen3 {
		r.Write32(regNTBCntl, r.Read32(regNTBCntl)&^ntbCtlSnoop|ntbCtlDisable|ntbCtlCfgLock)
		return
	}
	r.Write32(regNTBCntl, r.Read32(regNTBCntl)&^ntbCtlSnoop)
	r.Write16(regGen4LinkCtrl, r.Read16(regGen4LinkCtrl)|gen4LinkDisable)
}

// pollLink acknowledges the link interrupt and the peer's hello, before
// the monitor reads what they announce, and reads the link status
// (gen3_poll_link, gen4_poll_link: ICX wants DLLSCS cleared first).
func (d *Device) pollLink() uint16 {
	if d.hw.lay.gen == Gen4 {
		d.regs.Write16(regGen4SlotStatus, gen4SlotDLLSCS)
	}
	d.regs.Write64(regIntStatus, d.hw.lay.linkBits|d.hw.lay.helloBit)
	if d.hw.lay.gen == Gen4 {
		return d.regs.Read16(regGen4LinkStatus)
	}
	sta, err := readConfig16(d.hw.cfg, cfgGen3LinkStatus)
	if err != nil {
		return 0 // cannot tell: down
	}
	return sta
}

// kick wakes every WaitDoorbell caller to re-check.
func (d *Device) kick() { d.wake.Wake() }

// Name is "intel-ntb/<pci address>", or "sim-<gen>/<side>".
func (d *Device) Name() string { return d.hw.name }

// Port is 0 on the upstream (USD) end of the back-to-back link, 1 on the
// downstream (DSD) end.
func (d *Device) Port() int { return d.hw.port }

// Gen is the hardware generation.
func (d *Device) Gen() Gen { return d.hw.lay.gen }

// InboundWindow is the DMA buffer the inbound translation points at. It
// is valid until Close; the peer writes it at any time, so its contents
// are untrusted.
func (d *Device) InboundWindow() []byte { return d.hw.in }

// OutboundWindow is the window BAR, mapped write-combined (or uncached if
// Options allowed it). It is valid until Close. Stores are posted, and
// write-combined ones may leave in any order until the buffers drain:
// publish with a sync/atomic store, which on amd64 is a locked XCHG and
// drains them.
func (d *Device) OutboundWindow() []byte { return d.hw.out }

// DoorbellCount is 30 on gen3 (bit 31 carries link interrupts there) and
// 31 on gen4: the highest bit left is the monitor's hello.
func (d *Device) DoorbellCount() int { return d.hw.lay.doorbells }

// RingPeer writes 1 to the peer doorbell register of every bit set. It
// fails with ntb.ErrLinkDown while the PCIe link is down (the writes
// would be dropped).
func (d *Device) RingPeer(bits uint64) error {
	if bits&^d.valid != 0 {
		return fmt.Errorf("ring peer %#x: bits beyond the %d doorbells", bits, d.hw.lay.doorbells)
	}
	if !d.guard.Enter() {
		return ntb.ErrClosed
	}
	defer d.guard.Exit()
	if !d.hwUp.Load() {
		return ntb.ErrLinkDown
	}
	for i := 0; bits != 0; i, bits = i+1, bits>>1 {
		if bits&1 != 0 {
			d.regs.Write32(regPeerDoorbell+4*i, 1)
		}
	}
	return nil
}

// Doorbells reads the interrupt status register.
func (d *Device) Doorbells() uint64 {
	if !d.guard.Enter() {
		return 0
	}
	defer d.guard.Exit()
	return d.regs.Read64(regIntStatus) & d.valid
}

// ClearDoorbells writes bits to the write-1-to-clear status register.
func (d *Device) ClearDoorbells(bits uint64) {
	if !d.guard.Enter() {
		return
	}
	defer d.guard.Exit()
	d.regs.Write64(regIntStatus, bits&d.valid)
}

// SetDoorbellMask sets bits in the interrupt disable register.
func (d *Device) SetDoorbellMask(bits uint64) { d.updateMask(bits, 0) }

// ClearDoorbellMask clears bits in the interrupt disable register.
func (d *Device) ClearDoorbellMask(bits uint64) { d.updateMask(0, bits) }

func (d *Device) updateMask(set, clear uint64) {
	if !d.guard.Enter() {
		return
	}
	defer d.guard.Exit()
	d.mask.Update(set&d.valid, clear, func(mask uint64) { d.regs.Write64(regIntDisable, mask) })
	if clear != 0 {
		d.kick() // a newly unmasked bit may be pending
	}
}

// WaitDoorbell sleeps until an unmasked bit of want is pending. It is
// woken by the port's interrupts (every MSI-X message kicks all waiters,
// which re-read the status register), link changes, ctx and Close.
func (d *Device) WaitDoorbell(ctx context.Context, want uint64) (uint64, error) {
	if !d.guard.Enter() {
		return 0, ntb.ErrClosed
	}
	defer d.guard.Exit()
	seq := d.links.Seq()
	want &= d.valid
	return d.wake.Wait(ctx, func() (bool, uint64, error) {
		p := d.regs.Read64(regIntStatus) & want
		return doorbell.Done(ctx, d.guard.Closed(), p, d.mask.Load(), d.links.Seq() != seq)
	})
}

// ScratchpadCount is 12: the top four of the 16 carry the handshake.
func (d *Device) ScratchpadCount() int { return userSpads }

// Scratchpad reads local scratchpad register i.
func (d *Device) Scratchpad(i int) (uint32, error) {
	if i < 0 || i >= userSpads {
		return 0, fmt.Errorf("scratchpad %d of %d: out of range", i, userSpads)
	}
	if !d.guard.Enter() {
		return 0, ntb.ErrClosed
	}
	defer d.guard.Exit()
	return d.regs.Read32(regSpad + 4*i), nil
}

// SetPeerScratchpad writes the peer's scratchpad i through the B2B
// scratchpad registers. It fails with ntb.ErrLinkDown while the PCIe link
// is down.
func (d *Device) SetPeerScratchpad(i int, v uint32) error {
	if i < 0 || i >= userSpads {
		return fmt.Errorf("scratchpad %d of %d: out of range", i, userSpads)
	}
	if !d.guard.Enter() {
		return ntb.ErrClosed
	}
	defer d.guard.Exit()
	if !d.hwUp.Load() {
		return ntb.ErrLinkDown
	}
	d.regs.Write32(d.hw.lay.peerSpad+4*i, v)
	return nil
}

// Link is up while the PCIe link is active and the peer's driver has
// completed the handshake and keeps heartbeating.
func (d *Device) Link() ntb.LinkState { return d.links.Link() }

// Suspect reports an up link whose peer's heartbeat has stood still
// longer than Options.HeartbeatTimeout (see ntb.Liveness).
func (d *Device) Suspect() bool { return d.links.Suspect() }

// LinkCause says why the link is down (see ntb.Liveness). A peer host
// that crashed cannot be told from one that hangs: both end silent.
func (d *Device) LinkCause() ntb.Cause { return d.links.Cause() }

// SilenceHeartbeat is fault injection, a hung driver: while on, this end
// stops heartbeating (the peer finds the link suspect, then silent).
func (d *Device) SilenceHeartbeat(on bool) { d.silent.Store(on) }

// LinkReason says why the link is in its current state.
func (d *Device) LinkReason() string { return *d.reason.Load() }

func (d *Device) LinkEvents() <-chan ntb.LinkEvent { return d.links.Events() }

// LinkChanged returns a channel closed by the next link change (see
// ntb.LinkWatcher).
func (d *Device) LinkChanged() <-chan struct{} { return d.links.Changed() }

// runInterrupts turns MSI-X messages into wake-ups. It returns when the
// interrupt source is closed (or fails, which only closing it does).
func (d *Device) runInterrupts() {
	defer close(d.irqEnd)
	for {
		if _, err := d.hw.irq.Wait(); err != nil {
			return
		}
		d.kick()
		if d.regs.Read64(regIntStatus)&(d.hw.lay.linkBits|d.hw.lay.helloBit) != 0 {
			select {
			case d.nudge <- struct{}{}:
			default:
			}
		}
	}
}

// runMonitor polls the link every interval, or at once on a link
// interrupt, writes our handshake and heartbeat into the peer's
// scratchpads while the PCIe link is up, and judges the peer's.
func (d *Device) runMonitor() {
	defer close(d.done)
	t := time.NewTicker(d.interval)
	defer t.Stop()
	r, peer := d.regs, d.hw.lay.peerSpad
	hello := regPeerDoorbell + 4*bits.TrailingZeros64(d.hw.lay.helloBit)
	pages := uint32(len(d.hw.in) / minWindow)
	var beat, lastBeat, upNonce uint32
	var lastMove time.Time // zero until the peer's heartbeat moves
	state, suspect := ntb.LinkDown, false
	// helloDue: the hello is rung with the first handshake written after
	// start or the PCIe link's return, and then not again, so that two
	// ends whose link stays down (their windows differ, say) do not wake
	// each other's monitors without end.
	helloDue := true
	for {
		now := time.Now()
		sta := d.pollLink()
		hw := sta&lnkStaActive != 0
		d.hwUp.Store(hw)
		if !hw {
			helloDue = true
		}
		if hw && !d.silent.Load() {
			beat++
			r.Write32(peer+4*spadMagic, handshakeWord)
			r.Write32(peer+4*spadNonce, d.nonce)
			r.Write32(peer+4*spadWindow, pages)
			r.Write32(peer+4*spadHeartbeat, beat)
			if helloDue {
				r.Write32(hello, 1) // after the handshake: the peer reads it now
				helloDue = false
			}
		}
		magic, nonce := r.Read32(regSpad+4*spadMagic), r.Read32(regSpad+4*spadNonce)
		window, peerBeat := r.Read32(regSpad+4*spadWindow), r.Read32(regSpad+4*spadHeartbeat)
		if !hw {
			lastMove = time.Time{} // a fresh beat must follow the link's return
		} else if peerBeat != lastBeat {
			lastBeat, lastMove = peerBeat, now
		}
		ev := ntb.LinkEvent{State: ntb.LinkUp, Reason: "peer driver ready", Time: now}
		down := func(c ntb.Cause, why string) { ev.State, ev.Cause, ev.Reason = ntb.LinkDown, c, why }
		quiet := now.Sub(lastMove)
		switch {
		case !hw && nonce == 0 && upNonce != 0:
			// The peer's driver cleared its nonce, then disabled the link.
			down(ntb.CauseClosed, fmt.Sprintf("peer driver detached (link status %#04x)", sta))
		case !hw:
			down(ntb.CauseHardware, fmt.Sprintf("pcie link down (link status %#04x)", sta))
		case magic == 0 || nonce == 0:
			down(ntb.CauseClosed, "peer driver not attached")
		case magic != handshakeWord:
			down(ntb.CauseHardware, fmt.Sprintf("peer handshake %#x, this end speaks %#x", magic, handshakeWord))
		case window != pages:
			down(ntb.CauseHardware, fmt.Sprintf("peer window %d KiB, this end's %d KiB", window*4, pages*4))
		case lastMove.IsZero():
			down(ntb.CauseNone, "waiting for the peer's heartbeat")
		case quiet > d.silentAfter:
			down(ntb.CauseSilent, fmt.Sprintf("peer heartbeat silent for %v", quiet.Round(time.Millisecond)))
		case quiet > d.timeout:
			ev.Suspect, ev.Reason = true, fmt.Sprintf("peer heartbeat silent for %v", quiet.Round(time.Millisecond))
		}
		if state == ntb.LinkUp && ev.State == ntb.LinkUp && nonce != upNonce {
			d.setLink(ntb.LinkEvent{State: ntb.LinkDown, Cause: ntb.CauseGone, Reason: "peer driver re-attached", Time: now})
			state = ntb.LinkDown
		}
		d.reason.Store(&ev.Reason)
		switch {
		case ev.State != state:
			d.setLink(ev)
			state, upNonce, suspect = ev.State, nonce, ev.Suspect
		case state == ntb.LinkUp && ev.Suspect != suspect:
			if !ev.Suspect {
				ev.Reason = "peer heard again"
			}
			d.setLink(ev)
			suspect = ev.Suspect
		}
		select {
		case <-d.stop:
			return
		case <-t.C:
		case <-d.nudge:
		}
	}
}

func (d *Device) setLink(ev ntb.LinkEvent) {
	d.links.Publish(ev)
	d.kick()
}

// Close tells the peer we are leaving, shuts the inbound window, disables
// the link and releases the mappings, DMA buffer and interrupts. The
// caller's vfio objects stay open. It is idempotent.
func (d *Device) Close() error {
	var irqErr error
	return d.guard.Close(func() {
		close(d.stop)
		irqErr = d.hw.irq.Close()
		<-d.done
		<-d.irqEnd
	}, func() {
		d.links.CloseLocal(time.Now())
		d.kick()
	}, func() error { // the methods in flight have left
		if d.hwUp.Load() {
			d.regs.Write32(d.hw.lay.peerSpad+4*spadNonce, 0)
		}
		d.quiesce()
		d.hwUp.Store(false)
		return errors.Join(irqErr, d.hw.release())
	})
}
