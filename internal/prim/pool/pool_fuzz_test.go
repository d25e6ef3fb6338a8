package pool

import (
	"math"
	"testing"
)

// FuzzGeometry: a pool's geometry arrives in the Welcome (the application
// maps what ntproxy announces), and slot indices in pool grants. Whatever
// CheckGeometry accepts must describe a mapping whose size fits an int and
// in which every slot index below slots lies; whatever NewSlot accepts
// must give two rings of the asked size inside the memory it was given,
// apart from the header and from each other, that appends cannot spill
// from. Anything else is an error, never a panic.
func FuzzGeometry(f *testing.F) {
	f.Add(32, 1<<20, 5, uint16(SlotSize(MinRing)), uint8(0))
	f.Add(MaxSlots, MaxRing, MaxSlots-1, uint16(0), uint8(0))
	f.Add(1, MinRing, 0, uint16(SlotSize(MinRing)), uint8(4))
	f.Add(1, 3<<20, 1, uint16(100), uint8(0))
	f.Add(0, -MinRing, -1, uint16(0xffff), uint8(8))
	f.Add(1, 1<<62, 0, uint16(SlotSize(MinRing)), uint8(0))
	f.Add(math.MaxInt, math.MinInt, math.MaxInt, uint16(1), uint8(1))
	backing := make([]uint64, (2*SlotSize(MinRing)+64)/8) // 8-byte aligned
	buf := unsafeBytes(backing)
	f.Fuzz(func(t *testing.T, slots, ring, index int, length uint16, offset uint8) {
		if err := CheckGeometry(slots, ring); err == nil {
			if ring < MinRing || ring > MaxRing || ring&(ring-1) != 0 || slots < 1 || slots > MaxSlots {
				t.Fatalf("accepted %d slots of %d-byte rings", slots, ring)
			}
			n := uint64(SlotSize(ring))
			if total := uint64(slots) * n; total/n != uint64(slots) || total > math.MaxInt {
				t.Fatalf("%d slots of %d bytes overflow", slots, n)
			}
			if index >= 0 && index < slots && uint64(index+1)*n > uint64(slots)*n {
				t.Fatalf("slot %d ends past the pool of %d", index, slots)
			}
		}
		off := int(offset) % 64
		mem := buf[off : off+min(int(length), len(buf)-off)]
		s, err := NewSlot(mem, ring)
		if err != nil {
			return
		}
		if addr(mem)%8 != 0 || ring < MinRing || ring&(ring-1) != 0 || len(mem) < SlotSize(ring) {
			t.Fatalf("accepted rings of %d in %d bytes at offset %d", ring, len(mem), off)
		}
		if s.Ring() != ring || len(s.In) != ring || cap(s.Out) != ring || cap(s.In) != ring {
			t.Fatalf("rings of %d and %d (caps %d, %d), asked %d", len(s.Out), len(s.In), cap(s.Out), cap(s.In), ring)
		}
		out, in := addr(s.Out)-addr(mem), addr(s.In)-addr(mem)
		if out < HeaderSize || in < out+uintptr(ring) || in+uintptr(ring) > uintptr(len(mem)) {
			t.Fatalf("rings at %d and %d of %d bytes in %d", out, in, ring, len(mem))
		}
		// Every word the other side writes is reachable.
		s.SetOutHead(1)
		s.SetInTail(2)
		s.SetFlags(App, FlagFin|FlagClosed|FlagAbort)
		s.SetFlags(Proxy, FlagReset)
		if s.OutHead() != 1 || s.InTail() != 2 || s.AppFlags() != FlagFin|FlagClosed|FlagAbort || s.ProxyFlags() != FlagReset {
			t.Fatal("slot words do not read back")
		}
		clear(mem)
	})
}
