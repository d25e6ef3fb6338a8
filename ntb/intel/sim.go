package intel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
)

// Simulator constants. BAR0 is 64 KiB (it must reach gen4's PPD1 at
// 0xb4c0); the window BAR is as large as the window, so the IOVA the
// backend picks is the window size itself.
const (
	simBAR0Size   = 64 << 10
	simConfigSize = 4 << 10
	simBARBase    = 0x3800_0000_0000 // bus address of side 0's window BAR; side 1's is +1<<32
	simEMBar1     = 0x2000_0000_000c // gen3 EMBAR1 reset value: base | 64-bit prefetchable flags
	simLogMax     = 4096             // writes recorded per side
)

// RegWrite is one register write the simulator saw.
type RegWrite struct {
	Off   int
	Width int // bytes
	Value uint64
}

// SimulatedPair is two Intel NTB ports of one generation joined back to
// back: side 0 upstream (USD), side 1 downstream (DSD). It models, at
// register level: the peer doorbell registers setting the other side's
// interrupt status bits (write 1 to clear, masked by the interrupt
// disable register), the B2B scratchpad registers landing in the other
// side's scratchpads, the link (up while the "cable" is in and both sides
// have enabled it: NTBCNTL on gen3; LINK_CTRL and PPD0 training on gen4)
// raising the link status bit on both sides, gen4's DLLSCS latch, the
// PCIe link status word, the identity and port-definition registers, and
// one interrupt source per side. Every other register is plain storage,
// so translation and limit values can be read back. The windows are heap
// memory: what side 0 writes to its outbound window is side 1's inbound
// window, whatever the translation registers say.
type SimulatedPair struct {
	lay layout

	mu sync.Mutex
	// mu protects the following fields.
	cable  bool
	active bool
	ports  [2]simPort
}

type simPort struct {
	bar0   []byte
	cfg    []byte
	window []byte
	dllscs bool    // gen4: link changed, SLOTSTS not yet cleared
	irq    *simIRQ // nil while the side is not open
	log    []RegWrite
}

// NewSimulatedPair returns a pair of gen ports with windows of
// windowSize bytes (a power of two, at least 4 KiB), cable plugged in.
func NewSimulatedPair(gen Gen, windowSize int) *SimulatedPair {
	lay, ok := layouts[gen]
	if !ok {
		panic(fmt.Sprintf("intel: no simulator for %v", gen))
	}
	p := &SimulatedPair{lay: lay, cable: true}
	for side := range p.ports {
		sp := &p.ports[side]
		sp.bar0, sp.cfg, sp.window = make([]byte, simBAR0Size), make([]byte, simConfigSize), alignedBytes(windowSize)
		put(sp.cfg, cfgVendorID, 2, VendorIntel)
		if gen == Gen3 {
			put(sp.cfg, cfgDeviceID, 2, DeviceSKX)
			put(sp.cfg, cfgGen3PPD, 1, uint64(gen3PPDConnB2B|side*gen3PPDDevDSD))
			put(sp.bar0, regNTBCntl, 4, ntbCtlDisable|ntbCtlCfgLock)
			put(sp.bar0, regGen3EMBar1, 8, simEMBar1)
		} else {
			put(sp.cfg, cfgDeviceID, 2, DeviceICX)
			put(sp.cfg, cfgRevision, 1, 4)
			put(sp.bar0, regGen4PPD1, 4, uint64(gen4PPDConnB2B|side*gen4PPDDevDSD))
		}
	}
	return p
}

// Open opens side 0 or 1. o.WindowSize, if set, may be smaller than the
// pair's windows.
func (p *SimulatedPair) Open(side int, o Options) (_ *Device, err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("open simulated %v port %d: %w", p.lay.gen, side, err)
		}
	}()
	if side != 0 && side != 1 {
		return nil, errors.New("no such side")
	}
	regs, cfg := p.Regs(side), simConfig{p, side}
	lay, err := identify(cfg)
	if err != nil {
		return nil, err
	}
	port, err := topology(lay, cfg, regs)
	if err != nil {
		return nil, err
	}
	barSize := uint64(len(p.ports[side].window))
	size, err := o.windowSize(barSize)
	if err != nil {
		return nil, err
	}
	irq := &simIRQ{ch: make(chan struct{}, 1), done: make(chan struct{})}
	p.mu.Lock()
	if p.ports[side].irq != nil {
		p.mu.Unlock()
		return nil, errors.New("already open")
	}
	p.ports[side].irq = irq
	p.mu.Unlock()
	return start(hardware{
		name: fmt.Sprintf("sim-%v/%d", lay.gen, side), lay: lay, port: port, regs: regs, cfg: cfg,
		in: p.ports[side].window[:size], out: p.ports[1-side].window[:size],
		iova: barSize, barBase: simBARBase + uint64(side)<<32, barSize: barSize, irq: irq,
		release: func() error {
			p.mu.Lock()
			p.ports[side].irq = nil
			p.mu.Unlock()
			return nil
		},
	}, o)
}

// SetLink plugs the cable in or pulls it.
func (p *SimulatedPair) SetLink(up bool) {
	p.mu.Lock()
	p.cable = up
	fire := p.updateLinkLocked()
	p.mu.Unlock()
	p.fire(fire)
}

// Regs is side's register file, as the backend sees it.
func (p *SimulatedPair) Regs(side int) Regs { return simRegs{p, side} }

// Writes returns the first 4096 register writes side's backend made.
func (p *SimulatedPair) Writes(side int) []RegWrite {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]RegWrite(nil), p.ports[side].log...)
}

func (p *SimulatedPair) enabledLocked(side int) bool {
	b := p.ports[side].bar0
	if p.lay.gen == Gen3 {
		return get(b, regNTBCntl, 4)&ntbCtlDisable == 0
	}
	return get(b, regGen4LinkCtrl, 2)&gen4LinkDisable == 0 && get(b, regGen4PPD0, 4)&gen4PPDLinkTrain != 0
}

// linkStatusLocked is the PCIe link status word: active, gen3/gen4 speed, x16.
func (p *SimulatedPair) linkStatusLocked() uint64 {
	if !p.active {
		return 0
	}
	return lnkStaActive | 16<<4 | uint64(p.lay.gen)
}

// updateLinkLocked recomputes the link and, on a change, raises the link
// status bit on both sides; it returns the sides to interrupt.
func (p *SimulatedPair) updateLinkLocked() (fire [2]bool) {
	active := p.cable && p.enabledLocked(0) && p.enabledLocked(1)
	if active == p.active {
		return fire
	}
	p.active = active
	for side := range p.ports {
		p.ports[side].dllscs = p.lay.gen == Gen4
		fire[side] = p.raiseLocked(side, linkDoorbell)
	}
	return fire
}

// raiseLocked sets status bits on side and reports whether any is unmasked.
func (p *SimulatedPair) raiseLocked(side int, bits uint64) bool {
	b := p.ports[side].bar0
	put(b, regIntStatus, 8, get(b, regIntStatus, 8)|bits)
	return bits&^get(b, regIntDisable, 8) != 0
}

func (p *SimulatedPair) fire(fire [2]bool) {
	for side, f := range fire {
		if !f {
			continue
		}
		p.mu.Lock()
		irq := p.ports[side].irq
		p.mu.Unlock()
		if irq != nil {
			irq.signal()
		}
	}
}

func (p *SimulatedPair) read(side, off, width int) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch lay := p.lay; {
	case lay.gen == Gen4 && off == regGen4LinkStatus:
		return p.linkStatusLocked()
	case off >= lay.peerSpad && off < lay.peerSpad+4*hwSpads:
		if !p.active {
			return 1<<(8*width) - 1 // a read across a dead link
		}
		return get(p.ports[1-side].bar0, regSpad+off-lay.peerSpad, width)
	}
	return get(p.ports[side].bar0, off, width)
}

func (p *SimulatedPair) write(side, off, width int, v uint64) {
	p.mu.Lock()
	me, lay := &p.ports[side], p.lay
	if len(me.log) < simLogMax {
		me.log = append(me.log, RegWrite{Off: off, Width: width, Value: v})
	}
	var fire [2]bool
	switch {
	case off == regIntStatus: // write 1 to clear
		if me.dllscs {
			v &^= linkDoorbell
		}
		put(me.bar0, off, 8, get(me.bar0, off, 8)&^v)
	case off == regIntDisable:
		put(me.bar0, off, 8, v)
		fire[side] = get(me.bar0, regIntStatus, 8)&^v != 0
	case off >= regPeerDoorbell && off < regPeerDoorbell+4*hwDoorbells:
		if p.active && v != 0 {
			fire[1-side] = p.raiseLocked(1-side, 1<<((off-regPeerDoorbell)/4))
		}
	case off >= lay.peerSpad && off < lay.peerSpad+4*hwSpads:
		if p.active {
			put(p.ports[1-side].bar0, regSpad+off-lay.peerSpad, width, v)
		}
	case lay.gen == Gen4 && off == regGen4SlotStatus:
		if v&gen4SlotDLLSCS != 0 {
			me.dllscs = false
		}
	default:
		put(me.bar0, off, width, v)
	}
	link := p.updateLinkLocked()
	p.mu.Unlock()
	p.fire([2]bool{fire[0] || link[0], fire[1] || link[1]})
}

func get(b []byte, off, width int) uint64 {
	switch width {
	case 1:
		return uint64(b[off])
	case 2:
		return uint64(binary.LittleEndian.Uint16(b[off:]))
	case 4:
		return uint64(binary.LittleEndian.Uint32(b[off:]))
	}
	return binary.LittleEndian.Uint64(b[off:])
}

func put(b []byte, off, width int, v uint64) {
	switch width {
	case 1:
		b[off] = byte(v)
	case 2:
		binary.LittleEndian.PutUint16(b[off:], uint16(v))
	case 4:
		binary.LittleEndian.PutUint32(b[off:], uint32(v))
	default:
		binary.LittleEndian.PutUint64(b[off:], v)
	}
}

// simRegs is one side's register file.
type simRegs struct {
	p    *SimulatedPair
	side int
}

var _ Regs = simRegs{}

func (r simRegs) Write8(off int, v uint8)   { r.p.write(r.side, off, 1, uint64(v)) }
func (r simRegs) Read16(off int) uint16     { return uint16(r.p.read(r.side, off, 2)) }
func (r simRegs) Write16(off int, v uint16) { r.p.write(r.side, off, 2, uint64(v)) }
func (r simRegs) Read32(off int) uint32     { return uint32(r.p.read(r.side, off, 4)) }
func (r simRegs) Write32(off int, v uint32) { r.p.write(r.side, off, 4, uint64(v)) }
func (r simRegs) Read64(off int) uint64     { return r.p.read(r.side, off, 8) }
func (r simRegs) Write64(off int, v uint64) { r.p.write(r.side, off, 8, v) }

// simConfig is one side's config space; gen3's link status is computed.
type simConfig struct {
	p    *SimulatedPair
	side int
}

func (c simConfig) ReadConfig(off int64, b []byte) error {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if off < 0 || off+int64(len(b)) > simConfigSize {
		return fmt.Errorf("config read at %#x: out of range", off)
	}
	copy(b, c.p.ports[c.side].cfg[off:])
	if c.p.lay.gen == Gen3 && off == cfgGen3LinkStatus && len(b) == 2 {
		binary.LittleEndian.PutUint16(b, uint16(c.p.linkStatusLocked()))
	}
	return nil
}

// simIRQ is an interrupt line: signal coalesces like an eventfd counter.
type simIRQ struct {
	ch   chan struct{}
	done chan struct{}
	once sync.Once
}

func (q *simIRQ) signal() {
	select {
	case q.ch <- struct{}{}:
	default:
	}
}

func (q *simIRQ) Wait() (uint64, error) {
	select {
	case <-q.ch:
		return 1, nil
	case <-q.done:
		return 0, os.ErrClosed
	}
}

func (q *simIRQ) Close() error {
	q.once.Do(func() { close(q.done) })
	return nil
}
