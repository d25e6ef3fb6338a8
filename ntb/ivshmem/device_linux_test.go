package ivshmem

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ntstack/ntstack/internal/prim/shmem"
	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/ntbtest"
)

// deviceRegion is the region size of most device tests: 64 KiB windows.
const deviceRegion = devOffWindows + 2*64<<10

// attach dials s and attaches a Device on the new client; the device is
// closed at the end of the test.
func attach(t *testing.T, s *Server, cfg DeviceConfig) *Device {
	t.Helper()
	d, err := NewDevice(dial(t, s), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := d.Close(); err != nil {
			t.Errorf("close %s: %v", d.Name(), err)
		}
	})
	return d
}

// upPair attaches two devices to a new server and waits for the link.
func upPair(t *testing.T, size int64, cfg DeviceConfig) (*Server, *Device, *Device) {
	t.Helper()
	s := startServer(t, ServerConfig{Size: size, Vectors: 2})
	a, b := attach(t, s, cfg), attach(t, s, cfg)
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	ntbtest.WaitLink(t, b, ntb.LinkUp, ntbtest.LivenessTimeout)
	return s, a, b
}

// downEvent returns the latest link event of d once it reports the link
// down. The tracker stores the state before it queues the event, so a
// WaitLink that saw the link down may return before the event is there.
func downEvent(t *testing.T, d ntb.Device) ntb.LinkEvent {
	t.Helper()
	var ev ntb.LinkEvent
	timeout := time.After(ntbtest.LivenessTimeout)
	for {
		select {
		case e, ok := <-d.LinkEvents():
			if !ok {
				return ev
			}
			ev = e
			continue
		default:
		}
		if ev.State == ntb.LinkDown && ev.Reason != "" {
			return ev
		}
		select {
		case e, ok := <-d.LinkEvents():
			if !ok {
				return ev
			}
			ev = e
		case <-timeout:
			t.Fatalf("%s: no link-down event (latest %+v)", d.Name(), ev)
		}
	}
}

// roundTrip rings b from a and waits until b sees it, then clears it.
func roundTrip(t *testing.T, a, b ntb.Device, bit uint64) {
	t.Helper()
	if err := a.RingPeer(bit); err != nil {
		t.Fatal(err)
	}
	got, err := b.WaitDoorbell(testCtx(t), bit)
	if err != nil || got != bit {
		t.Fatalf("%s: doorbell %#x, err %v; want %#x", b.Name(), got, err, bit)
	}
	b.ClearDoorbells(bit)
}

func TestDeviceConformance(t *testing.T) {
	ntbtest.Conformance(t, func(t *testing.T) (ntb.Device, ntb.Device) {
		s := startServer(t, ServerConfig{Size: deviceRegion})
		a, err := NewDevice(dial(t, s), DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := NewDevice(dial(t, s), DeviceConfig{})
		if err != nil {
			_ = a.Close()
			t.Fatal(err)
		}
		return a, b
	})
}

func TestDeviceLayout(t *testing.T) {
	_, a, b := upPair(t, deviceRegion, DeviceConfig{})
	if a.Port() != 0 || b.Port() != 1 {
		t.Fatalf("ports %d and %d, want 0 and 1", a.Port(), b.Port())
	}
	if got, want := len(a.InboundWindow()), 64<<10; got != want {
		t.Fatalf("window of %d bytes, want %d", got, want)
	}
	// The windows follow the registers, side 0's first.
	mem := a.mem
	if &a.InboundWindow()[0] != &mem[devOffWindows] || &b.InboundWindow()[0] != &b.mem[devOffWindows+64<<10] {
		t.Error("windows are not where the layout says")
	}
	if got := binary.LittleEndian.Uint32(mem[devHdrMagic:]); got != devMagic {
		t.Errorf("magic %#x", got)
	}
	if got := string(mem[devHdrMagic : devHdrMagic+4]); got != "NTBI" {
		t.Errorf("magic reads %q", got)
	}
	if !strings.HasPrefix(a.Name(), "ivshmem") || !strings.HasSuffix(a.Name(), "/0") {
		t.Errorf("name %q", a.Name())
	}
}

func TestDeviceSides(t *testing.T) {
	s := startServer(t, ServerConfig{Size: deviceRegion})
	b := attach(t, s, DeviceConfig{Side: Side1})
	a := attach(t, s, DeviceConfig{}) // AnySide: the free one
	if a.Port() != 0 || b.Port() != 1 {
		t.Fatalf("ports %d and %d, want 0 and 1", a.Port(), b.Port())
	}
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	ntbtest.WaitLink(t, b, ntb.LinkUp, ntbtest.LivenessTimeout)
	for _, side := range []Side{Side0, Side1, AnySide} {
		c := dial(t, s)
		_, err := NewDevice(c, DeviceConfig{Side: side})
		if !errors.Is(err, ErrSideTaken) {
			t.Fatalf("side %d of a live link: %v, want ErrSideTaken", side, err)
		}
		t.Logf("side %d: %v", side, err)
		// The failed attachment left the port open and its slot empty.
		if err := c.Ring(c.ID(), devVector); err != nil {
			t.Fatalf("port after a failed attach: %v", err)
		}
		if gen := shmem.Mem(c.Mem()).Load64(devSlotOffset(c.ID()) + devSlotGen); gen != 0 {
			t.Errorf("slot of a failed attachment has generation %#x", gen)
		}
	}
	// Several racing for a fresh region get distinct sides.
	s2 := startServer(t, ServerConfig{Size: deviceRegion})
	cs := []*Client{dial(t, s2), dial(t, s2)}
	devs := make(chan *Device, 2)
	for _, c := range cs {
		go func() {
			d, err := NewDevice(c, DeviceConfig{})
			if err != nil {
				t.Error(err)
			}
			devs <- d
		}()
	}
	d1, d2 := <-devs, <-devs
	if d1 == nil || d2 == nil {
		t.FailNow()
	}
	defer d1.Close()
	defer d2.Close()
	if d1.Port() == d2.Port() {
		t.Fatalf("both took side %d", d1.Port())
	}
	ntbtest.WaitLink(t, d1, ntb.LinkUp, ntbtest.LivenessTimeout)
	ntbtest.WaitLink(t, d2, ntb.LinkUp, ntbtest.LivenessTimeout)
}

func TestDeviceRejectsBadLayout(t *testing.T) {
	le := binary.LittleEndian
	stamp := func(mem []byte) {
		le.PutUint32(mem[devHdrMagic:], devMagic)
		le.PutUint32(mem[devHdrVersion:], devVersion)
		le.PutUint64(mem[devHdrRegionSize:], uint64(len(mem)))
		le.PutUint64(mem[devHdrWindowSize:], uint64(devWindowSize(len(mem))))
		le.PutUint32(mem[devHdrSlots:], devSlots)
	}
	for _, tc := range []struct {
		name  string
		size  int64
		patch func(mem []byte)
		want  string
	}{
		{"too small", devMinRegion - devPage, nil, "region of 20480 bytes, the layout needs at least 24576"},
		{"bad magic", deviceRegion, func(mem []byte) { le.PutUint32(mem[devHdrMagic:], 0xdeadbeef) }, "magic 0xdeadbeef is not"},
		{"bad version", deviceRegion, func(mem []byte) { stamp(mem); le.PutUint32(mem[devHdrVersion:], 9) }, "layout version 9, this build speaks 1"},
		{"other size", deviceRegion, func(mem []byte) { stamp(mem); le.PutUint64(mem[devHdrRegionSize:], 1<<20) }, "region of 1048576 bytes, the port maps"},
		{"other window", deviceRegion, func(mem []byte) { stamp(mem); le.PutUint64(mem[devHdrWindowSize:], 4096) }, "windows of 4096 bytes"},
		{"other slots", deviceRegion, func(mem []byte) { stamp(mem); le.PutUint32(mem[devHdrSlots:], 7) }, "7 presence slots"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, ServerConfig{Size: tc.size})
			c := dial(t, s)
			if tc.patch != nil {
				tc.patch(c.Mem())
			}
			d, err := NewDevice(c, DeviceConfig{})
			if err == nil {
				_ = d.Close()
				t.Fatal("attach succeeded")
			}
			if !errors.Is(err, ErrLayout) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("attach: %v\nwant ErrLayout and %q", err, tc.want)
			}
			if !strings.HasPrefix(err.Error(), "attach ivshmem peer 0: ") {
				t.Errorf("error %q does not say what failed", err)
			}
		})
	}
	s := startServer(t, ServerConfig{Size: deviceRegion})
	for _, cfg := range []DeviceConfig{
		{Side: Side1 + 1},
		{HeartbeatInterval: time.Second, HeartbeatTimeout: time.Second},
	} {
		if d, err := NewDevice(dial(t, s), cfg); err == nil {
			_ = d.Close()
			t.Errorf("NewDevice(%+v) succeeded", cfg)
		}
	}
}

func TestDeviceRestart(t *testing.T) {
	s, a, b := upPair(t, deviceRegion, DeviceConfig{})
	roundTrip(t, a, b, 1<<7)
	if err := b.SetPeerScratchpad(5, 0x1234); err != nil {
		t.Fatal(err)
	}
	side := b.Port()
	start := time.Now()
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	ntbtest.WaitLink(t, a, ntb.LinkDown, ntbtest.LivenessTimeout)
	t.Logf("close seen in %v: %q", time.Since(start).Round(time.Millisecond), downEvent(t, a).Reason)
	if err := b.RingPeer(1); !errors.Is(err, ntb.ErrClosed) {
		t.Errorf("RingPeer after Close: %v", err)
	}

	// A new attachment takes the freed side and the link comes back.
	for round := range 3 {
		start = time.Now()
		c := attach(t, s, DeviceConfig{})
		if c.Port() != side {
			t.Fatalf("round %d: restarted peer took side %d, want %d", round, c.Port(), side)
		}
		ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
		ntbtest.WaitLink(t, c, ntb.LinkUp, ntbtest.LivenessTimeout)
		t.Logf("round %d: link back in %v (%s)", round, time.Since(start).Round(time.Millisecond), c.Name())
		if p := c.Doorbells(); p&(1<<7) != 0 {
			t.Errorf("round %d: the old peer's cleared ring is pending for the new one: %#x", round, p)
		}
		roundTrip(t, a, c, 1<<9)
		roundTrip(t, c, a, 1<<2)
		if err := c.SetPeerScratchpad(5, uint32(round)); err != nil {
			t.Fatal(err)
		}
		if v, err := a.Scratchpad(5); err != nil || v != uint32(round) {
			t.Fatalf("scratchpad %#x, %v", v, err)
		}
		c.OutboundWindow()[100] = byte(round + 1)
		if a.InboundWindow()[100] != byte(round+1) {
			t.Fatal("window not shared with the new peer")
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		ntbtest.WaitLink(t, a, ntb.LinkDown, ntbtest.LivenessTimeout)
	}
}

func TestDeviceHeartbeatLossAndTakeover(t *testing.T) {
	cfg := DeviceConfig{HeartbeatInterval: 5 * time.Millisecond, HeartbeatTimeout: 50 * time.Millisecond, SilentTimeout: 300 * time.Millisecond}
	s, a, b := upPair(t, deviceRegion, cfg)

	b.SilenceHeartbeat(true) // hung: attached, but silent: suspect, then down
	_, before := ntbtest.WaitEvent(t, a, ntbtest.LivenessTimeout, "suspect", ntbtest.IsSuspect(true))
	for _, ev := range before {
		if ev.State == ntb.LinkDown {
			t.Fatalf("down before suspect: %+v", ev)
		}
	}
	if ev, _ := ntbtest.WaitEvent(t, a, ntbtest.LivenessTimeout, "silent", ntbtest.IsDown(ntb.CauseSilent)); !strings.Contains(ev.Reason, "heartbeat silent") {
		t.Errorf("down because %q", ev.Reason)
	}
	b.SilenceHeartbeat(false)
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	ntbtest.WaitLink(t, b, ntb.LinkUp, ntbtest.LivenessTimeout)

	// Silent for long enough, b is taken for dead and its side taken over.
	b.SilenceHeartbeat(true)
	ntbtest.WaitLink(t, a, ntb.LinkDown, ntbtest.LivenessTimeout)
	cfg.Side = Side(b.Port()) + Side0
	c := attach(t, s, cfg)
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	ntbtest.WaitLink(t, c, ntb.LinkUp, ntbtest.LivenessTimeout)
	ntbtest.WaitLink(t, b, ntb.LinkDown, ntbtest.LivenessTimeout)
	if ev := downEvent(t, b); !strings.Contains(ev.Reason, "taken over") {
		t.Errorf("b down because %q", ev.Reason)
	}
	if err := b.RingPeer(1); !errors.Is(err, ntb.ErrLinkDown) {
		t.Errorf("RingPeer of an evicted device: %v", err)
	}
	b.SilenceHeartbeat(false)
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	// The evicted device's Close does not disturb its successor's link.
	roundTrip(t, a, c, 1)
	roundTrip(t, c, a, 1<<63)
	if a.Link() != ntb.LinkUp || c.Link() != ntb.LinkUp {
		t.Fatalf("links %v and %v after the evicted device closed", a.Link(), c.Link())
	}
}

func TestDeviceCloseWakesWaiter(t *testing.T) {
	_, a, _ := upPair(t, deviceRegion, DeviceConfig{})
	woke := make(chan error, 1)
	go func() {
		_, err := a.WaitDoorbell(context.Background(), 1)
		woke <- err
	}()
	waitfor.Blocked(t, "ivshmem.(*Device).WaitDoorbell") // Close must wake a waiter already asleep
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-woke:
		if !errors.Is(err, ntb.ErrClosed) {
			t.Fatalf("WaitDoorbell: %v, want ErrClosed", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Close did not wake WaitDoorbell")
	}
	for range a.LinkEvents() { // closed by Close
	}
}

// TestDeviceGarbageRegisters has the peer's registers and the presence
// table overwritten with random bytes, as a broken or hostile peer might:
// the device must take the link down, never panic or ring a bogus peer.
func TestDeviceGarbageRegisters(t *testing.T) {
	_, a, b := upPair(t, deviceRegion, DeviceConfig{HeartbeatInterval: 5 * time.Millisecond, HeartbeatTimeout: 50 * time.Millisecond})
	rng := rand.New(rand.NewPCG(1, 2))
	for off := 0; off < devPage; off += 4 {
		a.local.Store32(off, rng.Uint32()) // the words b writes
	}
	ntbtest.WaitLink(t, a, ntb.LinkDown, ntbtest.LivenessTimeout)
	t.Logf("garbage registers: %q", downEvent(t, a).Reason)
	for off := 0; off < devPage; off += 4 {
		if off/devSlotSize != a.id {
			a.mem.Store32(devOffPresence+off, rng.Uint32())
		}
	}
	if err := a.RingPeer(^uint64(0)); err != nil {
		t.Errorf("RingPeer: %v", err)
	}
	_ = a.Doorbells()
	a.ClearDoorbells(^uint64(0))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	defer cancel()
	if _, err := a.WaitDoorbell(ctx, 1); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitDoorbell: %v", err)
	}
	for i := range devScratchpadRegs {
		if _, err := a.Scratchpad(i); err != nil {
			t.Fatal(err)
		}
	}
	beats := a.beats.Load()
	waitfor.True(t, "three monitor rounds over the garbage", func() bool { return a.beats.Load() >= beats+3 })
	if a.Link() != ntb.LinkDown {
		t.Error("link up over garbage registers")
	}
	_ = b
}

func TestDeviceCloseReleases(t *testing.T) {
	s := startServer(t, ServerConfig{Size: deviceRegion})
	run := func() {
		c1, err := Dial(testCtx(t), s.Addr(), 1)
		if err != nil {
			t.Fatal(err)
		}
		c2, err := Dial(testCtx(t), s.Addr(), 1)
		if err != nil {
			t.Fatal(err)
		}
		a, err := NewDevice(c1, DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		b, err := NewDevice(c2, DeviceConfig{})
		if err != nil {
			t.Fatal(err)
		}
		ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
		if err := errors.Join(a.Close(), b.Close(), a.Close(), b.Close()); err != nil {
			t.Fatal(err)
		}
	}
	run()
	fds, goroutines := fdCount(t), runtime.NumGoroutine()
	run()
	waitfor.Until(func() bool { return fdCount(t) <= fds && runtime.NumGoroutine() <= goroutines })
	if n := fdCount(t); n > fds {
		t.Errorf("%d fds open after Close, %d before", n, fds)
	}
	if n := runtime.NumGoroutine(); n > goroutines {
		t.Errorf("%d goroutines after Close, %d before", n, goroutines)
	}
}

// TestDeviceSocklikeEcho runs the socket API over the backend: 10,000
// messages of mixed sizes echoed back and checked byte for byte.
func TestDeviceSocklikeEcho(t *testing.T) {
	const msgs = 10000
	_, da, db := upPair(t, 4<<20, DeviceConfig{})
	cfg := transport.Config{Logf: t.Logf}
	ea, err := transport.Attach(da, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ea.Close()
	eb, err := transport.Attach(db, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer eb.Close()
	ln, err := eb.Listen(7)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	echoed := make(chan error, 1)
	go func() {
		c, err := ln.AcceptConn()
		if err != nil {
			echoed <- err
			return
		}
		defer c.Close()
		if _, err := io.Copy(c, c); err != nil {
			echoed <- err
			return
		}
		echoed <- c.CloseWrite()
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	conn, err := ea.DialContext(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	// message i: a 4-byte length, then that many bytes, both drawn from
	// a seeded generator the reader replays.
	message := func(rng *rand.Rand, buf []byte) []byte {
		var n int
		switch r := rng.IntN(100); {
		case r < 70:
			n = rng.IntN(257)
		case r < 98:
			n = 257 + rng.IntN(4096-257)
		default:
			n = 4096 + rng.IntN(64<<10-4096)
		}
		buf = binary.LittleEndian.AppendUint32(buf[:0], uint32(n))
		for range n {
			buf = append(buf, byte(rng.Uint32()))
		}
		return buf
	}
	wrote := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(6, 2))
		var buf []byte
		for range msgs {
			buf = message(rng, buf)
			if _, err := conn.Write(buf); err != nil {
				wrote <- err
				return
			}
		}
		wrote <- conn.CloseWrite()
	}()
	rng := rand.New(rand.NewPCG(6, 2))
	var want []byte
	got := make([]byte, 4+64<<10)
	var total int
	for i := range msgs {
		want = message(rng, want)
		if _, err := io.ReadFull(conn, got[:len(want)]); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		if !bytes.Equal(got[:len(want)], want) {
			t.Fatalf("message %d of %d bytes differs", i, len(want)-4)
		}
		total += len(want)
	}
	if n, err := conn.Read(got); n != 0 || err != io.EOF {
		t.Fatalf("after the last message: %d bytes, %v; want io.EOF", n, err)
	}
	if err := errors.Join(<-wrote, <-echoed); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d messages, %d bytes echoed", msgs, total)
}
