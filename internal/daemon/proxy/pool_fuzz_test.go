package proxy

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/pool"
)

// Shared-pool mode: the application writes its slot's out head, in tail
// and flags, and the peer proxy sends data, acknowledgements and a FIN.
const (
	poolOpHead  = iota // the application publishes its out head
	poolOpTail         // the application publishes its in tail
	poolOpFlags        // the application sets its flags
	poolOpData         // the peer sends v%ring+1 bytes at what is next
	poolOpAck          // the peer acknowledges up to v
	poolOpFin          // the peer finishes at v
	poolOps

	// poolMaxSteps bounds an execution. The fuzzer minimises every input
	// it keeps at a cost that grows with the square of its length: bytes
	// past what the target reads are cut at once, and what it reads stays
	// short. 32 steps fill and drain both rings and finish both ways.
	poolMaxSteps = 32
)

// poolOp encodes one step of FuzzPoolSlot's input.
func poolOp(op int, v uint64) []byte {
	return binary.LittleEndian.AppendUint64([]byte{byte(op)}, v)
}

// FuzzPoolSlot plays a shared-pool connection's other parties — the
// application, through the words of its slot, and the peer proxy — against
// its leg, one step of 9 bytes (operation, value) at a time, each followed
// by one pass of runPool's loop (poolOut, poolIn). Whatever they write,
// the leg must not panic; an index it accepts keeps its queues inside the
// slot's rings (the out head at most a ring ahead of what the peer
// acknowledged, the in tail between what was delivered and received), and
// FlagAbort in its flags queues a reset; one it refuses ends the
// connection with an error, as runPool would.
func FuzzPoolSlot(f *testing.F) {
	cat := func(ops ...[]byte) []byte {
		var b []byte
		for _, o := range ops {
			b = append(b, o...)
		}
		return b
	}
	const ring = pool.MinRing
	f.Add(cat(poolOp(poolOpHead, 100), poolOp(poolOpAck, 60), poolOp(poolOpAck, 100),
		poolOp(poolOpData, 49), poolOp(poolOpTail, 20), poolOp(poolOpTail, 50),
		poolOp(poolOpFlags, uint64(pool.FlagFin)), poolOp(poolOpFin, 50)))
	f.Add(cat(poolOp(poolOpHead, ring), poolOp(poolOpAck, ring), poolOp(poolOpHead, 2*ring))) // full ring, twice
	f.Add(cat(poolOp(poolOpData, ring-1), poolOp(poolOpData, 0), poolOp(poolOpTail, ring+1))) // in ring full, then more
	f.Add(cat(poolOp(poolOpHead, ring+1)))                                                    // more than a ring
	f.Add(cat(poolOp(poolOpHead, 10), poolOp(poolOpHead, 5)))                                 // head backwards
	f.Add(cat(poolOp(poolOpData, 9), poolOp(poolOpTail, 11)))                                 // tail past head
	f.Add(cat(poolOp(poolOpHead, 10), poolOp(poolOpAck, 11)))                                 // ack past what was sent
	f.Add(cat(poolOp(poolOpData, 9), poolOp(poolOpFlags, uint64(pool.FlagClosed)), poolOp(poolOpData, 5)))
	f.Add(cat(poolOp(poolOpHead, 30), poolOp(poolOpFlags, uint64(pool.FlagFin)), poolOp(poolOpHead, 40),
		poolOp(poolOpFlags, uint64(pool.FlagFin|pool.FlagClosed|pool.FlagAbort)), poolOp(poolOpData, 5))) // abort after a half close
	f.Add(cat(poolOp(poolOpHead, ^uint64(0)), poolOp(poolOpTail, ^uint64(0)), poolOp(poolOpFlags, ^uint64(0))))
	f.Add(cat(poolOp(poolOpFin, 0), poolOp(poolOpData, 1)))
	f.Fuzz(func(t *testing.T, in []byte) {
		mem := make([]byte, pool.SlotSize(ring)) // the heap aligns it to 8 bytes
		slot, err := pool.NewSlot(mem, ring)
		if err != nil {
			t.Fatal(err)
		}
		s := &Server{logf: func(string, ...any) {}, legs: map[legKey]*leg{}, conns: map[uint64]*pconn{}, apps: map[uint64]*app{}}
		pc := &pconn{id: 1, slot: &poolUse{Slot: slot}}
		c := newMemConn(nil, 0)
		l := s.newLeg(pc, newMemConn(nil, 0), config.Peer{Host: "b"}, legKey{"b", 1}, false, c, "ntb", legLimits{})
		data := make([]byte, ring)
		for k := 0; len(in) >= 9 && k < poolMaxSteps; in, k = in[9:], k+1 {
			op, v := int(in[0])%poolOps, binary.LittleEndian.Uint64(in[1:])
			var err error
			switch op {
			case poolOpHead:
				slot.SetOutHead(v)
			case poolOpTail:
				slot.SetInTail(v)
			case poolOpFlags:
				slot.SetFlags(pool.App, uint32(v))
			case poolOpData:
				l.dmu.Lock()
				seq := l.rxSeq
				l.dmu.Unlock()
				err = l.receive(c, 1, seq, int(v%ring)+1, data[:v%ring+1], data)
			case poolOpAck:
				err = l.acked(v)
			case poolOpFin:
				err = l.finished(1, v)
			}
			if err != nil {
				if !errors.Is(err, errLegProtocol) {
					t.Fatalf("peer step %d(%d): %v is not a protocol violation", op, v, err)
				}
				return // the leg fails its transport
			}
			af, head, tail := slot.AppFlags(), slot.OutHead(), slot.InTail()
			if err := l.poolOut(af, head); err != nil {
				return // runPool closes the connection
			}
			l.mu.Lock()
			base, end, reset := l.tx.base, l.tx.end(), l.resetQueued
			l.mu.Unlock()
			if end != head || end-base > ring {
				t.Fatalf("out head %d accepted as %d..%d of a %d-byte ring", head, base, end, ring)
			}
			if af&pool.FlagAbort != 0 && !reset {
				t.Fatalf("flags %#x queue no reset", af)
			}
			if err := l.poolIn(af, tail); err != nil {
				return
			}
			l.dmu.Lock()
			rxBase, rxEnd, received := l.rx.base, l.rx.end(), l.rxSeq
			l.dmu.Unlock()
			if rxEnd != received || rxEnd-rxBase > ring || (af&pool.FlagClosed == 0 && rxBase != tail) {
				t.Fatalf("in tail %d accepted as %d..%d (received %d) of a %d-byte ring", tail, rxBase, rxEnd, received, ring)
			}
			if af&pool.FlagClosed == 0 && slot.InHead() != received {
				t.Fatalf("in head %d, received %d", slot.InHead(), received)
			}
		}
	})
}
