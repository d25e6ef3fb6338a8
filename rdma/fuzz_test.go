package rdma

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

// fuzzMaxStream bounds the stream FuzzStream decodes: the decoder's state
// between records is a header's progress, a record's remainder and an
// error, which a few records reach. The fuzzer minimises every input it
// keeps at a cost that grows with the square of its length; bytes past
// what the target reads are cut at once, and what it reads stays short
// (an unbounded stream kept the workers minimising, thousands of
// executions in 10 s).
const fuzzMaxStream = 128

// FuzzStream feeds peer-written bytes to the TCP provider's record
// decoder: it must not panic, must deliver only payload of well-formed
// data records, and stops at the first malformed one.
func FuzzStream(f *testing.F) {
	var rec [recHdrSize]byte
	putHeader(rec[:], recData, 5)
	f.Add(append(rec[:], "hello"...))
	putHeader(rec[:], recFin, 0)
	f.Add(rec[:])
	f.Add([]byte("garbage that is not a record"))
	f.Fuzz(func(t *testing.T, b []byte) {
		b = b[:min(len(b), fuzzMaxStream)]
		r := streamReader{br: bufio.NewReaderSize(bytes.NewReader(b), 16)}
		buf := make([]byte, 7)
		total := 0
		for range len(b) + 2 {
			n, err := r.read(buf)
			total += n
			if err != nil {
				if err != io.EOF && !errors.Is(err, errProtocol) {
					t.Fatalf("error %v is neither io.EOF nor a protocol violation", err)
				}
				break
			}
		}
		if total > len(b) {
			t.Fatalf("delivered %d bytes from %d", total, len(b))
		}
	})
}

// FuzzRing: a peer controls the whole receive ring and every immediate.
// The receiver must not panic or read out of bounds, and the positions
// stay consistent: the consumer never passes the producer, which never
// runs more than a ring ahead.
func FuzzRing(f *testing.F) {
	ring := make([]byte, MinRingSize)
	putHeader(ring, recData, 5)
	copy(ring[recHdrSize:], "hello")
	putHeader(ring[16:], recFin, 0)
	f.Add(ring[:64], []byte{16, 0, 0, 0, 24, 0, 0, 0})
	f.Add([]byte{}, []byte{0xff, 0xff, 0xff, 0x7f})
	f.Fuzz(func(t *testing.T, contents, imms []byte) {
		rx := newRxRing(make([]byte, MinRingSize))
		copy(rx.buf, contents)
		buf := make([]byte, 100)
		for len(imms) >= 4 {
			imm := binary.LittleEndian.Uint32(imms) &^ immCredit
			imms = imms[4:]
			if err := rx.publish(imm); err != nil {
				if !errors.Is(err, errProtocol) {
					t.Fatal(err)
				}
				return
			}
			for {
				n, err := rx.read(buf)
				if err != nil {
					if !errors.Is(err, errProtocol) {
						t.Fatal(err)
					}
					return
				}
				if rx.cons > rx.published || rx.published-rx.cons > rx.size {
					t.Fatalf("consumer %d, producer %d, ring %d", rx.cons, rx.published, rx.size)
				}
				if n == 0 {
					break
				}
			}
		}
	})
}

// FuzzHandshake: hellos and control messages from the peer.
func FuzzHandshake(f *testing.F) {
	h := hello{provider: provVerbs, ringSize: DefaultRingSize, qpn: 17, psn: 5, mtu: 3}
	f.Add(h.marshal())
	f.Add(ctlMsg{typ: ctlBye, final: 100}.marshal())
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, p := range []byte{provTCP, provVerbs} {
			if h, err := parseHello(b, p); err == nil {
				if !bytes.Equal(h.marshal(), b) {
					t.Fatalf("hello %+v does not re-encode to its input", h)
				}
			}
		}
		if m, err := parseCtl(b); err == nil && (m.typ != ctlReady && m.typ != ctlBye) {
			t.Fatalf("accepted control message type %d", m.typ)
		}
	})
}
