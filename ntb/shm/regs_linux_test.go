package shm

import (
	"encoding/binary"
	"testing"
	"time"

	"github.com/ntstack/ntstack/internal/prim/shmem"
	"github.com/ntstack/ntstack/ntb"
)

// Steps of FuzzRegisters: 6 bytes each, an operation, a byte argument a
// and a 32-bit value v. The words the peer writes lie in the first 1 KiB
// of the block (the rest is reserved), at 4a.
const (
	regOpStore32 = iota // the peer writes v at 4a (any word of our registers)
	regOpStore64        // the peer writes v, zero-extended, at 4a rounded down to 8 (generation, heartbeat)
	regOpPoll           // we read the pending doorbells and clear bits v<<32(a&1)
	regOpBeat           // a monitor beat 4a ms later; v&1: forced down, v&2: the peer's process is gone
	regOpSpads          // we read every scratchpad
	regOpRing           // we ring bits v<<32(a&1) on the peer
	regOps

	regStep = 6
	// regMaxSteps bounds an execution. The fuzzer minimises every input
	// it keeps at a cost that grows with the square of its length: bytes
	// past what the target reads are cut at once, and what it reads stays
	// short.
	regMaxSteps = 24
)

func regOp(op int, a uint8, v uint32) []byte {
	return binary.LittleEndian.AppendUint32([]byte{byte(op), a}, v)
}

// FuzzRegisters: the peer writes every word of our register block — the
// doorbell counters, the scratchpads, its generation, heartbeat, bell and
// link-down words — and the first bytes of the link file. Our reads of
// them must not panic and must mean what the layout says: a doorbell is
// pending exactly while its counter differs from what our last clear saw;
// scratchpad i reads word i, and an index outside 0..63 is an error; the
// monitor reports the link up only while we are not forcing it down, the
// peer's process is there, its generation is not 0 nor one seen while its
// process was not, it is not forcing the link down, and its heartbeat or
// generation moved within the silent timeout; suspect exactly while that
// was longer than the heartbeat timeout ago; every down carries a cause;
// and it reports only changes. A header is accepted exactly when magic,
// version and window size all match.
func FuzzRegisters(f *testing.F) {
	hdr := func(magic, version uint32, window uint64) []byte {
		b := binary.LittleEndian.AppendUint32(nil, magic)
		b = binary.LittleEndian.AppendUint32(b, version)
		return binary.LittleEndian.AppendUint64(b, window)
	}
	cat := func(ops ...[]byte) []byte {
		var b []byte
		for _, o := range ops {
			b = append(b, o...)
		}
		return b
	}
	const beat = uint8(DefaultHeartbeatInterval / time.Millisecond / 4)
	up := cat(regOp(regOpStore64, regGeneration/4, 0xabc1), regOp(regOpBeat, beat, 0),
		regOp(regOpStore64, regHeartbeat/4, 1), regOp(regOpBeat, beat, 0))
	f.Add(hdr(fileMagic, fileVersion, DefaultWindowSize), up)
	f.Add(hdr(fileMagic, fileVersion, 4096), cat(up, regOp(regOpStore64, regGeneration/4, 0xabc3), regOp(regOpStore64, regHeartbeat/4, 2),
		regOp(regOpBeat, beat, 0))) // re-attached
	f.Add(hdr(fileMagic, fileVersion+1, DefaultWindowSize), cat(up, regOp(regOpBeat, 150, 0))) // heartbeat suspect
	f.Add(hdr(fileMagic, fileVersion, DefaultWindowSize), cat(up, regOp(regOpBeat, 255, 0), regOp(regOpBeat, 255, 0), regOp(regOpBeat, 255, 0),
		regOp(regOpBeat, 255, 0), regOp(regOpBeat, 255, 0), regOp(regOpBeat, 255, 0), regOp(regOpBeat, 255, 0), regOp(regOpBeat, 255, 0),
		regOp(regOpBeat, 255, 0), regOp(regOpBeat, 255, 0), regOp(regOpBeat, 255, 0))) // heartbeat silent
	f.Add(hdr(fileMagic, fileVersion, DefaultWindowSize), cat(up, regOp(regOpBeat, beat, 2), regOp(regOpBeat, beat, 0),
		regOp(regOpStore64, regGeneration/4, 0xabc5), regOp(regOpBeat, beat, 0))) // gone, its generation stale, then a new peer
	f.Add(hdr(fileMagic^1, fileVersion, DefaultWindowSize), cat(up, regOp(regOpStore32, regPeerDown/4, 1), regOp(regOpBeat, beat, 0),
		regOp(regOpBeat, beat, 1), regOp(regOpBeat, beat, 2)))
	f.Add(hdr(fileMagic, fileVersion, 1<<63), cat(regOp(regOpStore32, regDoorbells/4+63, 5), regOp(regOpPoll, 0, 0),
		regOp(regOpPoll, 1, 1<<31), regOp(regOpPoll, 0, 0), regOp(regOpStore32, regScratchpads/4+63, 7), regOp(regOpSpads, 0, 0)))
	f.Add([]byte{}, cat(regOp(regOpStore32, regBells/4, 1), regOp(regOpRing, 0, ^uint32(0)), regOp(regOpStore32, regBells/4, 7), regOp(regOpRing, 1, 1)))
	f.Fuzz(func(t *testing.T, header, steps []byte) {
		var h [16]byte
		copy(h[:], header)
		for _, window := range []int{4096, DefaultWindowSize} {
			ok := le.Uint32(h[offFileMagic:]) == fileMagic && le.Uint32(h[offFileVersion:]) == fileVersion &&
				le.Uint64(h[offFileWindow:]) == uint64(window)
			if got := checkHeader(h, window); (got == "") != ok {
				t.Fatalf("header %x for a window of %d: %q", h, window, got)
			}
		}

		local, remote := shmem.Mem(make([]byte, regsSize)), shmem.Mem(make([]byte, regsSize))
		d := &Device{local: local, remote: remote}
		d.bells.Attach(local, remote, regDoorbells)
		var seen [doorbellBits]uint32 // the counters at our last clear of each bit
		var rung [doorbellBits]uint32 // our rings of each bit
		now := time.Unix(1e9, 0)
		w := watch{state: ntb.LinkDown}
		var lastMove time.Time
		var lastBeat, lastGen, stale uint64
		for k := 0; len(steps) >= regStep && k < regMaxSteps; steps, k = steps[regStep:], k+1 {
			op, a, v := int(steps[0])%regOps, int(steps[1]), binary.LittleEndian.Uint32(steps[2:])
			bits := uint64(v) << (32 * (a & 1))
			switch op {
			case regOpStore32:
				local.Store32(4*a, v)
			case regOpStore64:
				local.Store64(4*a&^7, uint64(v))
			case regOpPoll:
				var want uint64
				for i := range doorbellBits {
					if local.Load32(regDoorbells+4*i) != seen[i] {
						want |= 1 << i
					}
				}
				if got := d.Doorbells(); got != want {
					t.Fatalf("pending %#x, counters say %#x", got, want)
				}
				d.ClearDoorbells(bits)
				for i := range doorbellBits {
					if bits&(1<<i) != 0 {
						seen[i] = local.Load32(regDoorbells + 4*i)
					}
				}
			case regOpBeat:
				now = now.Add(time.Duration(4*a) * time.Millisecond)
				forced, attached := v&1 != 0, v&2 == 0
				gen := local.Load64(regGeneration)
				if !attached {
					stale = gen
				}
				if gen != lastGen {
					lastGen, lastMove = gen, now
				}
				if b := local.Load64(regHeartbeat); b != lastBeat {
					lastBeat, lastMove = b, now
				}
				state, susp := w.state, w.suspect
				w.observe(local, gen, forced, attached, "", now, DefaultHeartbeatTimeout, DefaultSilentTimeout, func(ev ntb.LinkEvent) {
					if ev.State == state && (ev.State == ntb.LinkDown || ev.Suspect == susp) {
						t.Fatalf("reported %+v while %v (suspect %v)", ev, state, susp)
					}
					if (ev.State == ntb.LinkDown) != (ev.Cause != ntb.CauseNone) || ev.State == ntb.LinkDown && ev.Suspect {
						t.Fatalf("reported %+v", ev)
					}
					state, susp = ev.State, ev.Suspect
				})
				if state != w.state || susp != w.suspect {
					t.Fatalf("reported %v (suspect %v), watching %v (suspect %v)", state, susp, w.state, w.suspect)
				}
				quiet := now.Sub(lastMove)
				live := !forced && attached && gen != 0 && gen != stale && local.Load32(regPeerDown) == 0 && quiet <= DefaultSilentTimeout
				if (w.state == ntb.LinkUp) != live {
					t.Fatalf("link %v: forced %v, attached %v, generation %#x (stale %#x), peer down %d, heartbeat still for %v",
						w.state, forced, attached, gen, stale, local.Load32(regPeerDown), quiet)
				}
				if w.state == ntb.LinkUp && w.suspect != (quiet > DefaultHeartbeatTimeout) {
					t.Fatalf("suspect %v with the heartbeat still for %v", w.suspect, quiet)
				}
			case regOpSpads:
				for i := -1; i <= scratchpadRegs; i++ {
					got, err := d.Scratchpad(i)
					if (err != nil) != (i < 0 || i >= scratchpadRegs) {
						t.Fatalf("scratchpad %d: %v", i, err)
					}
					if err == nil && got != local.Load32(regScratchpads+4*i) {
						t.Fatalf("scratchpad %d reads %#x", i, got)
					}
				}
			case regOpRing:
				if err := d.RingPeer(bits); err != nil {
					t.Fatal(err)
				}
				for i := range doorbellBits {
					if bits&(1<<i) != 0 {
						rung[i]++
					}
					if remote.Load32(regDoorbells+4*i) != rung[i] {
						t.Fatalf("peer's counter %d is %d after %d rings", i, remote.Load32(regDoorbells+4*i), rung[i])
					}
				}
			}
		}
	})
}
