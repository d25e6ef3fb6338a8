package transport

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/ntstack/ntstack/internal/prim/ring"
	"github.com/ntstack/ntstack/ntb/ntbtest"
	"github.com/ntstack/ntstack/partition"
)

// FuzzFrames plays a hostile peer: it publishes fuzzer-chosen frames (any
// tag, any payload) into an endpoint's ring and lets the endpoint dispatch
// them. The endpoint must never panic; a violation must end the session
// with an error, and the endpoint must stay usable.
//
// Input: a sequence of [tag: 3 bytes][n: 1 byte][payload: n bytes];
// CREDIT and WANT frames go on the control ring, the rest on the data ring.
// Only the first maxFuzzFrames bytes are played (see there).
func FuzzFrames(f *testing.F) {
	frame := func(kind, id uint32, payload ...byte) []byte {
		t := makeTag(kind, id)
		return append([]byte{byte(t), byte(t >> 8), byte(t >> 16), byte(len(payload))}, payload...)
	}
	open := openMsg{port: 1, window: 1 << 20, gen: 1}.encode(nil)
	f.Add(frame(kindOpen, 5, open...))
	f.Add(append(append(frame(kindOpen, 5, open...), frame(kindData, 1, 'h', 'i')...), frame(kindClose, 1)...))
	f.Add(append(frame(kindOpen, 5, open...), frame(kindCredit, 1, 0, 0, 0, 0, 0, 0, 0, 9, 1, 0, 0, 0)...))
	f.Add(append(frame(kindOpen, 5, open...), frame(kindWant, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 1, 0)...))
	f.Add(frame(kindAccept, 1, 1, 0, 0, 0, 0, 0, 16, 0, 1, 0, 0, 0))
	f.Add(append(frame(kindOpen, 5, open...), frame(kindMove, 1, 3, 0, 0, 0)...))
	f.Add(frame(kindData, 77, 1, 2, 3))
	f.Add(frame(15, 0))
	f.Fuzz(func(t *testing.T, data []byte) {
		data = data[:min(len(data), maxFuzzFrames)]
		da, db := ntbtest.NewPair(64 << 10)
		defer da.Close()
		defer db.Close()
		ep, err := Attach(db, Config{Logf: func(string, ...any) {}})
		if err != nil {
			t.Fatal(err)
		}
		defer ep.Close()
		ln, err := ep.Listen(1)
		if err != nil {
			t.Fatal(err)
		}
		sessions := make(chan *partition.Session, 4)
		hostile, err := partition.Open(da, partition.Config{OnSession: func(s *partition.Session) { sessions <- s }})
		if err != nil {
			t.Fatal(err)
		}
		defer hostile.Close()
		var s *partition.Session
		select {
		case s = <-sessions:
		case <-time.After(5 * time.Second):
			t.Fatal("no session")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		st, err := ep.session(ctx)
		cancel()
		if err != nil {
			t.Fatal("endpoint has no session:", err)
		}
		for len(data) >= 4 {
			tag := uint32(data[0]) | uint32(data[1])<<8 | uint32(data[2])<<16
			n := min(int(data[3]), len(data)-4)
			p := s.Partitions()[0]
			if kind, _ := splitTag(tag); kind == kindCredit || kind == kindWant {
				p = s.Control()
			}
			if p.TrySend(tag&ring.MaxTag, data[4:4+n], nil) != nil {
				break
			}
			data = data[4+n:]
		}
		for {
			if _, records := st.poll(nil, nil); records == 0 {
				break
			}
		}
		if err := st.sess.Err(); err != nil && s.Err() == nil {
			// The endpoint ended the session: it must say why.
			if err.Error() == "" {
				t.Fatal("session ended without a reason")
			}
		}
		for {
			select {
			case c := <-ln.acceptq:
				// Must not panic, whatever the peer did; the peer never
				// reads, so a full ring may block: bound it.
				c.SetWriteDeadline(time.Now().Add(10 * time.Millisecond))
				c.Write([]byte("x"))
				c.Close()
				continue
			default:
			}
			break
		}
	})
}

// maxFuzzFrames bounds what FuzzFrames plays of an input. The fuzzer
// minimizes every input that widens coverage, and its minimizer tries on the
// order of n*n/2 candidates for an n-byte input, each a whole run of this
// target (a fabric pair, an endpoint, a hostile session; a few hundred
// microseconds with coverage on). An input of a kilobyte keeps a worker
// minimizing for the whole -fuzzminimizetime (60 s by default), and the
// fuzzer counts those runs only when the minimization ends: with both
// workers minimizing it reports 0 execs/s. 256 bytes holds ten or more
// frames of every kind (an OPEN is 24 bytes, a WANT 20) and keeps a
// minimization to seconds; bytes past the bound do not reach the target, so
// the minimizer cuts them in a few tries.
const maxFuzzFrames = 256

// FuzzDecodeResume feeds a peer's RESUME payloads to their decoder: it
// accepts only a payload of the exact size naming a valid id, with credit
// within received and a floor within the largest window, and what it
// accepts encodes back to the same bytes.
func FuzzDecodeResume(f *testing.F) {
	f.Add(resumeMsg{nonce: 7, received: 1 << 20, credit: 1 << 19, floor: 64 << 10, id: 3}.encode(nil))
	f.Add(resumeMsg{nonce: 1, received: 0, credit: 0, floor: floorPooled | 16<<10, id: maxID}.encode(nil))
	f.Add(resumeMsg{nonce: 1, received: 5, credit: 6, id: 1}.encode(nil))       // credit beyond received
	f.Add(resumeMsg{nonce: 1, received: 1 << 63, credit: 0, id: 1}.encode(nil)) // received out of range
	f.Add(resumeMsg{nonce: 1, id: 0}.encode(nil))                               // no such id
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, p []byte) {
		m, err := decodeResume(p)
		if err != nil {
			return
		}
		switch {
		case len(p) != resumeSize:
			t.Fatalf("accepted a %d-byte payload", len(p))
		case m.id == 0 || m.id > maxID:
			t.Fatalf("accepted id %d", m.id)
		case m.credit > m.received || m.received > 1<<62:
			t.Fatalf("accepted credit %d, received %d", m.credit, m.received)
		case m.floor&^floorPooled > maxWindow:
			t.Fatalf("accepted floor %#x", m.floor)
		}
		if !bytes.Equal(m.encode(nil), p) {
			t.Fatalf("%x decodes to %+v, which encodes to %x", p, m, m.encode(nil))
		}
	})
}
