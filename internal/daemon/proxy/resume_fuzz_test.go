package proxy

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"testing"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/wire/appproto"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// FuzzResumeAccept feeds what another host sends first on a connection to
// this proxy — over the NTB link from a (via 1), from c (via 2), or on the
// TCP fallback, which any host reaches (via 0) — to serveInbound, with
// one live leg a/7 registered whose peer may resume anywhere in
// base..base+held. Bytes after the first frame are what the new transport
// carries next. No listener exists, so only a resume can succeed.
//
// A frame that does not resume a/7 from a host the connection may come
// from, presenting the leg's secret, never touches the leg. One that does moves the leg onto the
// connection when its RxSeq lies in base..base+held, and otherwise ends
// the leg (the peer and this side disagree on the stream). Every open
// that can be read is answered: with a refusal and its code, or for a
// resume with how much of the leg this side has received.
func FuzzResumeAccept(f *testing.F) {
	frame := func(v any) []byte {
		body, err := json.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		return append(binary.LittleEndian.AppendUint32(nil, uint32(len(body))), body...)
	}
	data := putLegHdr(make([]byte, legHdr+2), legData, 0, 2)
	secret := bytes.Repeat([]byte{0x5a}, legSecretLen) // the leg's, as its opener sent it
	wrong := bytes.Repeat([]byte{0x5b}, legSecretLen)
	f.Add(uint8(0), frame(appproto.RackOpen{From: "a", Resume: 7, RxSeq: 100, Secret: secret}), uint64(100), uint16(10))
	f.Add(uint8(1), frame(appproto.RackOpen{From: "a", Resume: 7, RxSeq: 110, Secret: secret}), uint64(100), uint16(10))
	f.Add(uint8(1), append(frame(appproto.RackOpen{From: "a", Resume: 7, RxSeq: 5, Secret: secret}), data...), uint64(5), uint16(0))
	f.Add(uint8(0), frame(appproto.RackOpen{From: "a", Resume: 7, RxSeq: 99, Secret: secret}), uint64(100), uint16(10)) // behind
	f.Add(uint8(0), frame(appproto.RackOpen{From: "a", Resume: 7, RxSeq: ^uint64(0), Secret: secret}), ^uint64(0)-5, uint16(5))
	f.Add(uint8(2), frame(appproto.RackOpen{From: "a", Resume: 7}), uint64(0), uint16(0))                               // over c's link
	f.Add(uint8(0), frame(appproto.RackOpen{From: "a", Resume: 8, Secret: secret}), uint64(0), uint16(0))               // another leg
	f.Add(uint8(0), frame(appproto.RackOpen{From: "a", Resume: 7, RxSeq: 100}), uint64(100), uint16(10))                // no secret
	f.Add(uint8(1), frame(appproto.RackOpen{From: "a", Resume: 7, RxSeq: 100, Secret: wrong}), uint64(100), uint16(10)) // wrong secret
	f.Add(uint8(0), frame(appproto.RackOpen{From: "c", Resume: 7}), uint64(0), uint16(0))                               // another host
	f.Add(uint8(1), frame(appproto.RackOpen{From: "a", Port: 80, Token: 9, Window: 1 << 20}), uint64(0), uint16(0))
	f.Add(uint8(0), []byte("\x05\x00\x00\x00{\"\":0"), uint64(0), uint16(0))
	f.Fuzz(func(t *testing.T, via uint8, in []byte, base uint64, held uint16) {
		from := []string{"", "a", "c"}[int(via)%3]
		path := ctlapi.PathTCP
		if from != "" {
			path = ctlapi.PathNTB
		}
		s := &Server{cfg: &config.Config{Host: "b"}, logf: func(string, ...any) {},
			legs: map[legKey]*leg{}, conns: map[uint64]*pconn{}, apps: map[uint64]*app{}, listeners: map[int]*listener{}}
		old := newMemConn(nil, 0)
		key := legKey{"a", 7}
		l := s.newLeg(&pconn{id: 1, secret: secret}, newMemConn(nil, 0), config.Peer{Host: "a"}, key, false, old, ctlapi.PathNTB, legLimits{})
		l.tx.base = base
		if held > 0 {
			l.tx.commit(len(l.tx.free(int(held), int(held))))
		}
		end := l.tx.end()
		s.legs[key] = l

		fc := newMemConn(in, 0)
		s.serveInbound(fc, inbound{from: from, path: path, via: "test"})
		l.busy.Wait() // a receive loop on fc, if the leg moved there
		s.wg.Wait()

		var open appproto.RackOpen
		readable := appproto.ReadFrame(bytes.NewReader(in), &open) == nil
		names := readable && open.Resume == key.token && open.From == key.from && (from == "" || from == key.from) &&
			bytes.Equal(open.Secret, secret)
		// A readable open is answered: a refusal with its code, or (a
		// resume) how much of the leg this side has received, nothing yet.
		var reply appproto.DialReply
		err := appproto.ReadFrame(bytes.NewReader(fc.written()), &reply)
		switch {
		case !readable && err == nil:
			t.Fatalf("unreadable open answered %+v", reply)
		case readable && err != nil:
			t.Fatalf("open %+v not answered: %v", open, err)
		case readable && !names && reply.Code == ctlapi.OK:
			t.Fatalf("open %+v via %q answered %+v", open, from, reply)
		case names && (reply.Code != ctlapi.OK || reply.RxSeq != 0):
			t.Fatalf("resume %+v answered %+v", open, reply)
		}
		l.mu.Lock()
		switches, closed, cur := l.switches, l.closed, l.cur
		l.mu.Unlock()
		switch {
		case !names:
			if switches != 0 || closed || cur != old || old.isClosed() {
				t.Fatalf("open %+v via %q touched leg %v (switches %d, closed %v)", open, from, key, switches, closed)
			}
		case open.RxSeq >= base && open.RxSeq <= end:
			if switches != 1 {
				t.Fatalf("resume at %d in %d..%d not installed", open.RxSeq, base, end)
			}
		default:
			if switches != 0 || !closed {
				t.Fatalf("resume at %d outside %d..%d: switches %d, closed %v", open.RxSeq, base, end, switches, closed)
			}
		}
		l.close(nil)
	})
}
