package proxy

import (
	"io"
	"net"
	"testing"

	"github.com/ntstack/ntstack/internal/daemon/config"
)

// FuzzLegRecv feeds arbitrary bytes, as a peer proxy could send them, to a
// leg's receive loop: it must end with an error or EOF, never panic, and
// never queue more than the window allows.
func FuzzLegRecv(f *testing.F) {
	frame := func(typ byte, seq uint64, payload []byte) []byte {
		b := putLegHdr(make([]byte, legHdr+len(payload)), typ, seq, len(payload))
		copy(b[legHdr:], payload)
		return b
	}
	f.Add(frame(legData, 0, []byte("hello")))
	f.Add(append(frame(legData, 0, []byte("ab")), frame(legFin, 2, nil)...))
	f.Add(frame(legAck, 1<<40, nil))
	f.Add(frame(legData, 7, []byte("gap")))
	f.Add(frame(legReset, 0, nil))
	f.Add([]byte{legData, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, in []byte) {
		s := &Server{logf: func(string, ...any) {}, legs: map[legKey]*leg{}, conns: map[uint64]*pconn{}, apps: map[uint64]*app{}}
		appEnd, appPeer := net.Pipe()
		go io.Copy(io.Discard, appPeer)
		defer appPeer.Close()
		ours, theirs := net.Pipe()
		pc := &pconn{id: 1}
		l := s.newLeg(pc, appEnd, config.Peer{Host: "b"}, legKey{"b", 1}, false, ours, "ntb", 0)
		go func() {
			theirs.Write(in)
			theirs.Close()
		}()
		l.runRecv(ours, 1)
		l.dmu.Lock()
		queued := l.rx.n
		l.dmu.Unlock()
		if queued > legMaxUnacked {
			t.Fatalf("queued %d bytes, over the window of %d", queued, legMaxUnacked)
		}
		l.close(nil)
	})
}
