package intel

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/ntbtest"
	"github.com/ntstack/ntstack/vfio"
)

const testWindow = 64 << 10

// fast polls often and never times a peer out on a loaded machine.
var fast = Options{HeartbeatInterval: 5 * time.Millisecond, HeartbeatTimeout: 500 * time.Millisecond}

var gens = []Gen{Gen3, Gen4}

// openPair opens both sides of a fresh pair and waits for the link.
func openPair(t *testing.T, gen Gen, o Options) (*SimulatedPair, *Device, *Device) {
	t.Helper()
	p := NewSimulatedPair(gen, testWindow)
	a, err := p.Open(0, o)
	require.NoError(t, err)
	t.Cleanup(func() { a.Close() })
	b, err := p.Open(1, o)
	require.NoError(t, err)
	t.Cleanup(func() { b.Close() })
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	ntbtest.WaitLink(t, b, ntb.LinkUp, ntbtest.LivenessTimeout)
	return p, a, b
}

// waitReason waits for d's link reason to contain s.
func waitReason(t *testing.T, d *Device, s string) {
	t.Helper()
	if !waitfor.Until(func() bool { return strings.Contains(d.LinkReason(), s) }) {
		t.Fatalf("%s: link reason %q, want %q", d.Name(), d.LinkReason(), s)
	}
}

// requireInOrder checks that want appears in got as a subsequence.
func requireInOrder(t *testing.T, got, want []RegWrite) {
	t.Helper()
	i := 0
	for _, w := range got {
		if i < len(want) && w == want[i] {
			i++
		}
	}
	if i < len(want) {
		t.Fatalf("register write %d of %d not seen in order: %+v", i, len(want), want[i])
	}
}

func TestConformance(t *testing.T) {
	for _, gen := range gens {
		t.Run(gen.String(), func(t *testing.T) {
			ntbtest.Conformance(t, func(t *testing.T) (ntb.Device, ntb.Device) {
				_, a, b := openPair(t, gen, fast)
				return a, b
			})
		})
	}
}

func TestBringUpSequence(t *testing.T) {
	const iova, size = testWindow, testWindow // the simulator's BAR is the window
	for _, gen := range gens {
		t.Run(gen.String(), func(t *testing.T) {
			p, a, b := openPair(t, gen, fast)
			lay := layouts[gen]
			want := []RegWrite{
				{regIntDisable, 8, 0xffffffff},
				{regIMLimit, 8, simBARBase},
				{regIMXlat, 8, 0},
			}
			clear := []RegWrite{ // a previous session's handshake and rings, before the link is enabled
				{regSpad + 4*spadMagic, 4, 0},
				{regIntStatus, 8, uint64(1)<<lay.doorbells - 1 | lay.helloBit | lay.linkBits},
			}
			if gen == Gen3 {
				want = append(want,
					RegWrite{regGen3SPCICmd, 2, pciCommandMemory | pciCommandMaster},
					RegWrite{lay.intVec, 1, 0},
					RegWrite{lay.intVec + 32, 1, 31}) // the SKX vector 32 erratum
				want = append(want, clear...)
				want = append(want,
					RegWrite{regIMXlat, 8, iova},
					RegWrite{regIMLimit, 8, simBARBase + size},
					RegWrite{regGen3EMLimit, 8, simEMBar1&^0xf + size},
					RegWrite{regNTBCntl, 4, ntbCtlSnoop})
			} else {
				want = append(want,
					RegWrite{regGen4LinkCtrl, 2, gen4LinkDisable},
					RegWrite{lay.intVec, 1, 0},
					RegWrite{lay.intVec + 32, 1, 32})
				want = append(want, clear...)
				want = append(want,
					RegWrite{regIMXlat, 8, iova},
					RegWrite{regIMLimit, 8, simBARBase + size},
					RegWrite{regGen4IMBaseIdx, 2, 16}, // log2(64 KiB)
					RegWrite{regNTBCntl, 4, ntbCtlSnoop},
					RegWrite{regGen4LinkCtrl, 2, 0},
					RegWrite{regGen4PPD0, 4, gen4PPDLinkTrain})
			}
			want = append(want, RegWrite{regIntDisable, 8, 0})
			if gen == Gen4 { // the monitor's link poll
				want = append(want, RegWrite{regGen4SlotStatus, 2, gen4SlotDLLSCS})
			}
			want = append(want,
				RegWrite{regIntStatus, 8, lay.linkBits | lay.helloBit},
				RegWrite{lay.peerSpad + 4*spadMagic, 4, handshakeWord},
				RegWrite{lay.peerSpad + 4*spadWindow, 4, size / 4096},
				RegWrite{regPeerDoorbell + 4*lay.doorbells, 4, 1}) // the hello, after the handshake
			requireInOrder(t, p.Writes(0), want)

			for side, base := range []uint64{simBARBase, simBARBase + 1<<32} {
				r := p.Regs(side)
				require.Equal(t, uint64(iova), r.Read64(regIMXlat), "side %d xlat", side)
				require.Equal(t, base+size, r.Read64(regIMLimit), "side %d limit", side)
			}
			require.Equal(t, 0, a.Port(), "side 0 is the upstream port")
			require.Equal(t, 1, b.Port())
			// The link interrupt is acknowledged; on gen4 only because
			// DLLSCS was cleared first.
			waitfor.True(t, "the link interrupt acknowledged", func() bool { return p.Regs(0).Read64(regIntStatus)&linkDoorbell == 0 })
		})
	}
}

func TestDoorbellRegisters(t *testing.T) {
	for _, gen := range gens {
		t.Run(gen.String(), func(t *testing.T) {
			p, a, b := openPair(t, gen, fast)
			require.NoError(t, a.RingPeer(1<<4|1<<9))
			requireInOrder(t, p.Writes(0), []RegWrite{{regPeerDoorbell + 4*4, 4, 1}, {regPeerDoorbell + 4*9, 4, 1}})
			user := uint64(1)<<b.DoorbellCount() - 1 // the monitor owns the bits above
			require.Equal(t, uint64(1<<4|1<<9), p.Regs(1).Read64(regIntStatus)&user)
			require.Equal(t, uint64(1<<4|1<<9), b.Doorbells())

			b.SetDoorbellMask(1 << 4)
			require.Equal(t, uint64(1<<4), p.Regs(1).Read64(regIntDisable))
			b.ClearDoorbells(1 << 4)
			w := p.Writes(1)
			require.Contains(t, w, RegWrite{regIntStatus, 8, 1 << 4})
			require.Equal(t, uint64(1<<9), b.Doorbells())
			b.ClearDoorbellMask(1 << 4)
			require.Zero(t, p.Regs(1).Read64(regIntDisable))

			require.Error(t, a.RingPeer(1<<a.DoorbellCount()), "a bit beyond the doorbells")
			want := map[Gen]int{Gen3: 30, Gen4: 31}[gen]
			require.Equal(t, want, a.DoorbellCount())
		})
	}
}

func TestScratchpadOffsets(t *testing.T) {
	for gen, peerSpad := range map[Gen]int{Gen3: 0x180, Gen4: 0x8080} {
		t.Run(gen.String(), func(t *testing.T) {
			p, a, b := openPair(t, gen, fast)
			require.NoError(t, a.SetPeerScratchpad(3, 0xabc))
			require.Contains(t, p.Writes(0), RegWrite{peerSpad + 12, 4, 0xabc})
			require.Equal(t, uint32(0xabc), p.Regs(1).Read32(regSpad+12))
			v, err := b.Scratchpad(3)
			require.NoError(t, err)
			require.Equal(t, uint32(0xabc), v)
			require.Equal(t, 12, a.ScratchpadCount())
			require.Error(t, a.SetPeerScratchpad(spadMagic, 1), "handshake scratchpads are not the user's")
		})
	}
}

func TestGen4LinkBitNeedsDLLSCS(t *testing.T) {
	p := NewSimulatedPair(Gen4, 4096)
	r0, r1 := p.Regs(0), p.Regs(1)
	r0.Write32(regGen4PPD0, gen4PPDLinkTrain)
	require.Zero(t, r0.Read16(regGen4LinkStatus)&lnkStaActive, "one end training is not a link")
	r1.Write32(regGen4PPD0, gen4PPDLinkTrain)
	require.NotZero(t, r0.Read16(regGen4LinkStatus)&lnkStaActive)
	require.NotZero(t, r0.Read64(regIntStatus)&linkDoorbell)
	r0.Write64(regIntStatus, linkDoorbell)
	require.NotZero(t, r0.Read64(regIntStatus)&linkDoorbell, "cleared without DLLSCS")
	r0.Write16(regGen4SlotStatus, gen4SlotDLLSCS)
	r0.Write64(regIntStatus, linkDoorbell)
	require.Zero(t, r0.Read64(regIntStatus)&linkDoorbell)
}

func TestLinkNeedsBothDrivers(t *testing.T) {
	for _, gen := range gens {
		t.Run(gen.String(), func(t *testing.T) {
			p := NewSimulatedPair(gen, testWindow)
			a, err := p.Open(0, fast)
			require.NoError(t, err)
			defer a.Close()
			waitReason(t, a, "pcie link down")
			_, err = p.Open(0, fast)
			require.ErrorContains(t, err, "already open")
			b, err := p.Open(1, fast)
			require.NoError(t, err)
			defer b.Close()
			ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
			ntbtest.WaitLink(t, b, ntb.LinkUp, ntbtest.LivenessTimeout)
			require.Equal(t, "peer driver ready", a.LinkReason())
		})
	}
}

// Each end comes up as soon as the other has written its handshake: with
// a heartbeat interval of an hour no tick of either monitor comes after
// their first looks, so only the ends' hellos can bring both links up.
func TestLinkUpOnArrival(t *testing.T) {
	o := Options{HeartbeatInterval: time.Hour, HeartbeatTimeout: time.Hour, SilentTimeout: time.Hour}
	for _, gen := range gens {
		t.Run(gen.String(), func(t *testing.T) {
			for range 20 { // either end may look first
				p := NewSimulatedPair(gen, testWindow)
				a, err := p.Open(0, o)
				require.NoError(t, err)
				b, err := p.Open(1, o)
				require.NoError(t, err)
				ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
				ntbtest.WaitLink(t, b, ntb.LinkUp, ntbtest.LivenessTimeout)
				require.NoError(t, b.Close())
				require.NoError(t, a.Close())
			}
		})
	}
}

func TestCablePull(t *testing.T) {
	p, a, b := openPair(t, Gen3, fast)
	p.SetLink(false)
	ntbtest.WaitLink(t, a, ntb.LinkDown, ntbtest.LivenessTimeout)
	ntbtest.WaitLink(t, b, ntb.LinkDown, ntbtest.LivenessTimeout)
	waitReason(t, a, "pcie link down")
	require.ErrorIs(t, a.RingPeer(1), ntb.ErrLinkDown)
	require.ErrorIs(t, a.SetPeerScratchpad(0, 1), ntb.ErrLinkDown)
	p.SetLink(true)
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	ntbtest.WaitLink(t, b, ntb.LinkUp, ntbtest.LivenessTimeout)
}

// A hung driver (link and registers fine, no beats) makes the link
// suspect, then down as silent past the silent timeout; beating again
// brings it back.
func TestHeartbeatSilence(t *testing.T) {
	o := Options{HeartbeatInterval: 5 * time.Millisecond, HeartbeatTimeout: 50 * time.Millisecond, SilentTimeout: 300 * time.Millisecond}
	_, a, b := openPair(t, Gen4, o)
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	b.SilenceHeartbeat(true)
	_, before := ntbtest.WaitEvent(t, a, ntbtest.LivenessTimeout, "suspect", ntbtest.IsSuspect(true))
	for _, ev := range before {
		require.NotEqual(t, ntb.LinkDown, ev.State, "down before suspect: %+v", ev)
	}
	ntbtest.WaitEvent(t, a, ntbtest.LivenessTimeout, "silent", ntbtest.IsDown(ntb.CauseSilent))
	waitReason(t, a, "peer heartbeat silent")
	b.SilenceHeartbeat(false)
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	require.False(t, a.Suspect())
}

func TestWindowMismatch(t *testing.T) {
	p := NewSimulatedPair(Gen3, testWindow)
	o := fast
	a, err := p.Open(0, o)
	require.NoError(t, err)
	defer a.Close()
	o.WindowSize = testWindow / 2
	b, err := p.Open(1, o)
	require.NoError(t, err)
	defer b.Close()
	waitReason(t, a, "peer window 32 KiB, this end's 64 KiB")
	waitReason(t, b, "peer window 64 KiB, this end's 32 KiB")
	require.Equal(t, ntb.LinkDown, a.Link())
	// Each end rang its hello once, when the PCIe link came up: two ends
	// whose link stays down do not wake each other's monitors without end.
	hello := RegWrite{regPeerDoorbell + 4*layouts[Gen3].doorbells, 4, 1}
	for side := range 2 {
		n := 0
		for _, w := range p.Writes(side) {
			if w == hello {
				n++
			}
		}
		require.Equal(t, 1, n, "side %d's hellos", side)
	}
}

func TestReattach(t *testing.T) {
	p, a, b := openPair(t, Gen4, fast)
	require.NoError(t, b.Close())
	ntbtest.WaitLink(t, a, ntb.LinkDown, ntbtest.LivenessTimeout)
	b2, err := p.Open(1, fast)
	require.NoError(t, err)
	defer b2.Close()
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	ntbtest.WaitLink(t, b2, ntb.LinkUp, ntbtest.LivenessTimeout)
}

func TestCloseTeardown(t *testing.T) {
	before := runtime.NumGoroutine()
	for _, gen := range gens {
		p := NewSimulatedPair(gen, testWindow)
		a, err := p.Open(0, fast)
		require.NoError(t, err)
		b, err := p.Open(1, fast)
		require.NoError(t, err)
		ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
		require.NoError(t, a.Close())
		require.NoError(t, a.Close())

		r := p.Regs(0)
		require.Zero(t, r.Read64(regIMXlat), "inbound translation shut")
		require.Equal(t, uint64(simBARBase), r.Read64(regIMLimit))
		require.Equal(t, uint64(0xffffffff), r.Read64(regIntDisable))
		if gen == Gen3 {
			require.NotZero(t, r.Read32(regNTBCntl)&ntbCtlDisable)
		} else {
			require.NotZero(t, r.Read16(regGen4LinkCtrl)&gen4LinkDisable)
		}
		_, err = a.Scratchpad(0)
		require.ErrorIs(t, err, ntb.ErrClosed)
		_, err = a.WaitDoorbell(context.Background(), 1)
		require.ErrorIs(t, err, ntb.ErrClosed)
		ntbtest.WaitLink(t, b, ntb.LinkDown, ntbtest.LivenessTimeout)
		require.NoError(t, b.Close())
	}
	if !waitfor.Until(func() bool { return runtime.NumGoroutine() <= before }) {
		t.Fatalf("%d goroutines before, %d after closing", before, runtime.NumGoroutine())
	}
}

func TestUnsupported(t *testing.T) {
	for _, tc := range []struct {
		name  string
		gen   Gen
		cfg   bool // poke config space, else BAR0
		off   int
		width int
		v     uint64
		want  string
	}{
		{"vendor", Gen3, true, cfgVendorID, 2, 0x10ee, "not an Intel NTB port"},
		{"haswell", Gen3, true, cfgDeviceID, 2, 0x2f0d, "only SKX 201c and ICX 347e"},
		{"sapphire rapids", Gen4, true, cfgRevision, 1, 0x10, "revision 0x10"},
		{"gen3 transparent", Gen3, true, cfgGen3PPD, 1, 0x00, "only back-to-back"},
		{"gen3 split bar", Gen3, true, cfgGen3PPD, 1, gen3PPDConnB2B | gen3PPDSplitBAR, "split BAR"},
		{"gen4 root port", Gen4, false, regGen4PPD1, 4, 0x100, "only back-to-back"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewSimulatedPair(tc.gen, testWindow)
			if tc.cfg {
				put(p.ports[0].cfg, tc.off, tc.width, tc.v)
			} else {
				put(p.ports[0].bar0, tc.off, tc.width, tc.v)
			}
			_, err := p.Open(0, fast)
			require.ErrorIs(t, err, ntb.ErrNotSupported)
			var nse *NotSupportedError
			require.True(t, errors.As(err, &nse))
			require.ErrorContains(t, err, tc.want)
			d, err := p.Open(1, fast) // the other side is fine
			require.NoError(t, err)
			require.NoError(t, d.Close())
		})
	}
}

// The window is mapped write-combined, and without resource2_wc (and no
// permission to fall back) Open fails with ntb.ErrNotSupported.
func TestWriteCombinedMapping(t *testing.T) {
	root := t.TempDir()
	const addr = "0000:af:00.0"
	dir := filepath.Join(root, "bus/pci/devices", addr)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	port := VFIOPort{Host: vfio.Host{SysfsRoot: root}, Addr: addr}

	_, err := mapWindow(port, 8192, false)
	require.ErrorIs(t, err, ntb.ErrNotSupported)
	require.ErrorContains(t, err, filepath.Join(dir, "resource2_wc"))

	// A regular file stands in for the BAR.
	require.NoError(t, os.WriteFile(filepath.Join(dir, "resource2_wc"), make([]byte, 8192), 0o600))
	m, err := mapWindow(port, 8192, false)
	require.NoError(t, err)
	require.Len(t, m.Bytes(), 8192)
	require.NoError(t, m.Close())
}

func TestPickIOVA(t *testing.T) {
	got, err := pickIOVA(nil, 1<<20, 1<<16)
	require.NoError(t, err)
	require.Equal(t, uint64(1<<20), got)

	ranges := []vfio.IOVARange{{Start: 0, End: 0xfedfffff}, {Start: 0xfef00000, End: 1<<48 - 1}}
	got, err = pickIOVA(ranges, 1<<32, 1<<24)
	require.NoError(t, err)
	require.Equal(t, uint64(1<<32), got)

	_, err = pickIOVA([]vfio.IOVARange{{Start: 0, End: 0xffff}}, 1<<20, 4096)
	require.Error(t, err)
}

func TestWindowSizeOption(t *testing.T) {
	for _, tc := range []struct {
		size int
		bar  uint64
		want int // 0: error
	}{
		{0, 1 << 16, 1 << 16},
		{0, 1 << 30, DefaultWindowSize},
		{3000, 1 << 16, 0},
		{1 << 17, 1 << 16, 0},
		{6 << 10, 1 << 16, 0},
	} {
		o := Options{WindowSize: tc.size}
		got, err := o.windowSize(tc.bar)
		if tc.want == 0 {
			require.Error(t, err, "size %d bar %d", tc.size, tc.bar)
			continue
		}
		require.NoError(t, err)
		require.Equal(t, tc.want, got)
	}
}
