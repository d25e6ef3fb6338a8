package proxy

import (
	"testing"

	"github.com/ntstack/ntstack/internal/daemon/config"
)

// FuzzLegRecv feeds arbitrary bytes, as a peer proxy could send them, to a
// leg's receive loop, in reads of chunk bytes (0: as many as fit): it must
// end with an error or EOF, never panic, never count more bytes received
// than the input held, and never queue more than the window allows. The
// transport and the application are memConns: an execution runs no
// goroutine of its own.
func FuzzLegRecv(f *testing.F) {
	const legFuzzMax = 256
	frame := func(typ byte, seq uint64, payload []byte) []byte {
		b := putLegHdr(make([]byte, legHdr+len(payload)), typ, seq, len(payload))
		copy(b[legHdr:], payload)
		return b
	}
	f.Add(frame(legData, 0, []byte("hello")), uint8(0))
	f.Add(frame(legData, 0, []byte("hello")), uint8(3))
	f.Add(append(frame(legData, 0, []byte("ab")), frame(legFin, 2, nil)...), uint8(0))
	f.Add(append(frame(legData, 0, []byte("ab")), frame(legData, 1, []byte("bcd"))...), uint8(7)) // overlaps: b again
	f.Add(frame(legAck, 1<<40, nil), uint8(0))
	f.Add(frame(legData, 7, []byte("gap")), uint8(0))
	f.Add(frame(legReset, 0, nil), uint8(1))
	f.Add(append(frame(legFin, 0, nil), frame(legData, 0, []byte("late"))...), uint8(0))
	f.Add([]byte{legData, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, uint8(0))
	f.Fuzz(func(t *testing.T, in []byte, chunk uint8) {
		// A dozen frames reach every state of the loop. The fuzzer
		// minimises every input it keeps at a cost that grows with the
		// square of its length: bytes past what the target reads are
		// cut at once, and what it reads stays short.
		in = in[:min(len(in), legFuzzMax)]
		s := &Server{logf: func(string, ...any) {}, legs: map[legKey]*leg{}, conns: map[uint64]*pconn{}, apps: map[uint64]*app{}}
		pc := &pconn{id: 1}
		c := newMemConn(in, int(chunk))
		l := s.newLeg(pc, newMemConn(nil, 0), config.Peer{Host: "b"}, legKey{"b", 1}, false, c, "ntb", legLimits{})
		l.runRecv(c, 1)
		l.dmu.Lock()
		queued, received := l.rx.n, l.rxSeq
		l.dmu.Unlock()
		if queued > legMaxUnacked {
			t.Fatalf("queued %d bytes, over the window of %d", queued, legMaxUnacked)
		}
		if received > uint64(len(in)) {
			t.Fatalf("received %d bytes from %d", received, len(in))
		}
		if !c.isClosed() {
			t.Fatal("the receive loop returned with its transport open")
		}
		l.close(nil)
	})
}
