package guest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ntstack/ntstack/ntb/ivshmem"
	"github.com/ntstack/ntstack/vfio"
)

// params returns the ntvm.* parameters of the kernel command line, or
// skips the test on a machine that was not booted by the VM harness.
func params(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		t.Skipf("no /proc/cmdline (%v): these tests run inside make vmtest's guests", err)
	}
	p := make(map[string]string)
	for _, f := range strings.Fields(string(b)) {
		if k, v, ok := strings.Cut(f, "="); ok && strings.HasPrefix(k, "ntvm.") {
			p[k] = v
		}
	}
	if len(p) == 0 {
		t.Skip("no ntvm.* parameters on /proc/cmdline: these tests run inside make vmtest's guests (package test/vm boots them)")
	}
	return p
}

func intParam(t *testing.T, p map[string]string, name string) int {
	t.Helper()
	v, err := strconv.Atoi(p[name])
	if err != nil {
		t.Fatalf("kernel parameter %s=%q: %v", name, p[name], err)
	}
	return v
}

// metric prints a metric line the host harness copies into its log.
func metric(scenario string, kv ...any) {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", MarkerMetric, scenario)
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&b, " %v=%v", kv[i], kv[i+1])
	}
	fmt.Println(b.String())
}

// onlyDevice returns the PCI address of the guest's one ivshmem device.
func onlyDevice(t *testing.T) string {
	t.Helper()
	addrs, err := ivshmem.FindPCI(vfio.Host{})
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 {
		t.Fatalf("ivshmem devices %v, want exactly one", addrs)
	}
	return addrs[0]
}

// openPort opens the guest's ivshmem device, binding it to vfio-pci.
func openPort(t *testing.T, addr string) *ivshmem.PCIPort {
	t.Helper()
	p, err := ivshmem.OpenPCI(ivshmem.PCIConfig{Addr: addr, Bind: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("close port: %v", err)
		}
	})
	return p
}

// TestProbe walks the VFIO path by hand on the guest's one ivshmem device,
// checking the typed errors on the way, then through ivshmem.OpenPCI.
func TestProbe(t *testing.T) {
	p := params(t)
	shmSize := intParam(t, p, ParamShm)
	vectors := intParam(t, p, ParamVectors)
	var h vfio.Host
	addr := onlyDevice(t)

	// Before binding: no driver owns the device (Debian has no ivshmem
	// driver), so VFIO refuses it with ErrNotBound.
	if _, err := h.CheckGroup(addr); !errors.Is(err, vfio.ErrNotBound) {
		t.Fatalf("CheckGroup before binding: %v, want ErrNotBound", err)
	}
	if _, err := ivshmem.OpenPCI(ivshmem.PCIConfig{Addr: addr}); !errors.Is(err, vfio.ErrNotBound) {
		t.Fatalf("OpenPCI before binding: %v, want ErrNotBound", err)
	}
	if _, err := h.CheckGroup("0000:00:1f.7"); !errors.Is(err, vfio.ErrNoSuchDevice) {
		t.Errorf("CheckGroup of an absent device: %v, want ErrNoSuchDevice", err)
	}
	if err := h.BindVFIO(addr); err != nil {
		t.Fatal(err)
	}
	group, err := h.CheckGroup(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("device %s bound to vfio-pci, iommu group %d", addr, group)

	// The raw path, step by step.
	c, err := h.OpenContainer()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	g, err := h.OpenGroup(group)
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if _, err := h.OpenGroup(group); !errors.Is(err, vfio.ErrDeviceBusy) {
		t.Errorf("second OpenGroup: %v, want ErrDeviceBusy", err)
	}
	if err := g.SetContainer(c); err != nil {
		t.Fatal(err)
	}
	if err := c.SetIOMMU(); err != nil {
		t.Fatal(err)
	}
	d, err := g.OpenDevice(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	info, err := d.Info()
	if err != nil {
		t.Fatal(err)
	}
	if info.Flags&vfio.DevicePCI == 0 || info.NumRegions <= uint32(vfio.RegionConfig) {
		t.Fatalf("device info %+v: want a PCI device with config space", info)
	}
	// BARs, ROM and config space; vfio-pci refuses the VGA region (EINVAL)
	// of a device that is not a VGA controller.
	regions := make(map[vfio.RegionIndex]vfio.RegionInfo)
	for i := vfio.RegionBAR0; i <= vfio.RegionConfig; i++ {
		r, err := d.RegionInfo(i)
		if err != nil {
			t.Fatal(err)
		}
		regions[i] = r
		t.Logf("region %d: size %#x flags %#x sparse %v", i, r.Size, r.Flags, r.SparseAreas)
	}
	if _, err := d.RegionInfo(vfio.RegionVGA); err == nil {
		t.Errorf("region info of the VGA region of a non-VGA device succeeded")
	}
	bar0, bar2 := regions[vfio.RegionBAR0], regions[vfio.RegionBAR2]
	if bar0.Size != 256 {
		t.Errorf("BAR0 is %d bytes, want ivshmem's 256", bar0.Size)
	}
	if bar2.Size != uint64(shmSize) {
		t.Errorf("BAR2 is %d bytes, want the server's %d", bar2.Size, shmSize)
	}
	if err := d.RequireBARs(map[int]uint64{0: 256, 2: uint64(shmSize)}); err != nil {
		t.Fatal(err)
	}
	if err := d.RequireBARs(map[int]uint64{4: 1}); !errors.Is(err, vfio.ErrMissingBAR) {
		t.Errorf("RequireBARs of absent BAR4: %v, want ErrMissingBAR", err)
	}

	var reg [4]byte
	if err := d.ReadRegion(bar0, 0x8, reg[:]); err != nil { // IVPosition
		t.Fatal(err)
	}
	if id := binary.LittleEndian.Uint32(reg[:]); id != 0 {
		t.Errorf("IVPosition = %d, want 0 (the server's first peer)", id)
	}
	m0, err := d.MapBAR(0)
	if err != nil {
		t.Fatal(err)
	}
	defer m0.Close()
	m2, err := d.MapBAR(2)
	if err != nil {
		t.Fatal(err)
	}
	defer m2.Close()
	if len(m2.Bytes()) != shmSize {
		t.Errorf("BAR2 maps %d bytes, want %d", len(m2.Bytes()), shmSize)
	}
	copy(m2.Bytes()[OffProbeMarker:], ProbeMarker) // the host checks its file

	// Bus Master Enable, then an MSI-X interrupt rung by the device on
	// itself: the doorbell register written through the device file.
	if err := d.SetBusMaster(true); err != nil {
		t.Fatal(err)
	}
	var cmd [2]byte
	if err := d.ReadConfig(4, cmd[:]); err != nil || cmd[0]&(1<<2) == 0 {
		t.Errorf("PCI command % x (%v): Bus Master Enable not set", cmd, err)
	}
	msix, err := d.IRQInfo(vfio.IRQMSIX)
	if err != nil {
		t.Fatal(err)
	}
	if msix.Count != uint32(vectors) {
		t.Errorf("%d MSI-X vectors, want %d", msix.Count, vectors)
	}
	ev, err := vfio.NewEventfd()
	if err != nil {
		t.Fatal(err)
	}
	defer ev.Close()
	if err := d.SetIRQEventfds(vfio.IRQMSIX, vectors-1, []int{ev.FD()}); err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint32(reg[:], uint32(0<<16|(vectors-1))) // peer 0 (us), last vector
	if err := d.WriteRegion(bar0, 0xc, reg[:]); err != nil {
		t.Fatal(err)
	}
	if err := ev.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if n, err := ev.Wait(); err != nil || n != 1 {
		t.Fatalf("MSI-X vector %d after a self ring: count %d, %v", vectors-1, n, err)
	}
	if err := d.DisableIRQs(vfio.IRQMSIX); err != nil {
		t.Error(err)
	}

	// DMA: pin a buffer at the lowest IOVA the IOMMU offers.
	iommu, err := c.IOMMUInfo()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("iommu: page sizes %#x, iova ranges %v", iommu.PageSizes, iommu.IOVARanges)
	buf, err := vfio.NewDMABuffer(1 << 16)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Close()
	var iova vfio.IOVA
	if len(iommu.IOVARanges) > 0 {
		iova = iommu.IOVARanges[0].Start
	}
	if err := c.MapDMA(buf, iova, vfio.DMARead|vfio.DMAWrite); err != nil {
		t.Fatal(err)
	}
	if err := c.UnmapDMA(iova, uint64(len(buf.Bytes()))); err != nil {
		t.Error(err)
	}

	// While this process holds the group, OpenPCI finds it busy.
	if _, err := ivshmem.OpenPCI(ivshmem.PCIConfig{Addr: addr}); !errors.Is(err, vfio.ErrDeviceBusy) {
		t.Errorf("OpenPCI of a held device: %v, want ErrDeviceBusy", err)
	}
	for _, closeFn := range []func() error{m0.Close, m2.Close, d.Close, g.Close, c.Close} {
		if err := closeFn(); err != nil {
			t.Fatal(err)
		}
	}

	// The same through the Port.
	port := openPort(t, "")
	if port.ID() != 0 || port.Vectors() != vectors || len(port.Mem()) != shmSize {
		t.Errorf("port: id %d, %d vectors, %d bytes of memory", port.ID(), port.Vectors(), len(port.Mem()))
	}
	if !bytes.HasPrefix(port.Mem()[OffProbeMarker:], []byte(ProbeMarker)) {
		t.Error("BAR2 lost the marker across a reopen")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for v := range vectors {
		if err := port.Ring(port.ID(), v); err != nil {
			t.Fatal(err)
		}
		if err := port.Wait(ctx, v); err != nil {
			t.Fatalf("self ring of vector %d: %v", v, err)
		}
	}
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancelShort()
	if err := port.Wait(short, 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Wait with nothing rung: %v, want the context's error", err)
	}
	if err := port.Close(); err != nil {
		t.Fatal(err)
	}
	if err := port.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	// Closed means released: the group opens again.
	again := openPort(t, addr)
	if again.ID() != 0 {
		t.Errorf("reopened port has id %d", again.ID())
	}
	store64(again.Mem(), OffReadyOf(0), ReadyMagic)
}

// TestDoorbell plays ping-pong between two guests: peer 0 writes a payload
// and its sequence number into BAR2 and rings peer 1's vector 0; peer 1
// checks them, answers in its own slot and rings peer 0's vector 1.
func TestDoorbell(t *testing.T) {
	p := params(t)
	rounds := intParam(t, p, ParamRounds)
	port := openPort(t, onlyDevice(t))
	mem := port.Mem()
	if len(mem) < LayoutSize || port.Vectors() < 2 {
		t.Fatalf("%d bytes of shared memory and %d vectors; the test needs %d and 2", len(mem), port.Vectors(), LayoutSize)
	}
	me := port.ID()
	if me > 1 {
		t.Fatalf("peer id %d: the scenario has two guests, ids 0 and 1", me)
	}
	peer := 1 - me
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()

	// Rendezvous: a ring before the peer routed its vectors would be lost,
	// so the peer's ready word is polled, the one event no interrupt can
	// carry.
	store64(mem, OffReadyOf(me), ReadyMagic)
	for load64(mem, OffReadyOf(peer)) != ReadyMagic {
		select {
		case <-ctx.Done():
			t.Fatalf("peer %d never became ready", peer)
		case <-time.After(5 * time.Millisecond):
		}
	}

	// await waits on vector until the sequence word at off reaches seq.
	await := func(vector, off int, seq uint64) {
		for load64(mem, off) != seq {
			if err := port.Wait(ctx, vector); err != nil {
				t.Fatalf("waiting for sequence %d at %#x (have %d): %v", seq, off, load64(mem, off), err)
			}
		}
	}
	payload := func(seq uint64, reply bool) []byte {
		b := make([]byte, PayloadSize)
		for i := range b {
			b[i] = byte(seq*31 + uint64(i))
			if reply {
				b[i] = ^b[i]
			}
		}
		return b
	}
	check := func(off int, seq uint64, reply bool) {
		got, want := mem[off+8:off+8+PayloadSize], payload(seq, reply)
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("round %d: payload byte %d at %#x is %#02x, want %#02x", seq, i, off, got[i], want[i])
			}
		}
	}

	rtts := make([]time.Duration, 0, rounds)
	for seq := uint64(1); seq <= uint64(rounds); seq++ {
		if me == 0 {
			start := time.Now()
			copy(mem[OffPing+8:], payload(seq, false))
			store64(mem, OffPing, seq)
			if err := port.Ring(peer, 0); err != nil {
				t.Fatal(err)
			}
			await(1, OffPong, seq)
			rtts = append(rtts, time.Since(start))
			check(OffPong, seq, true)
		} else {
			await(0, OffPing, seq)
			check(OffPing, seq, false)
			copy(mem[OffPong+8:], payload(seq, true))
			store64(mem, OffPong, seq)
			if err := port.Ring(peer, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	store64(mem, OffDoneOf(me), uint64(rounds))
	if me == 0 {
		slices.Sort(rtts)
		metric("doorbell", "rounds", rounds,
			"rtt_p50", rtts[len(rtts)/2].Round(time.Microsecond),
			"rtt_p99", rtts[len(rtts)*99/100].Round(time.Microsecond),
			"rtt_max", rtts[len(rtts)-1].Round(time.Microsecond))
	}
}
