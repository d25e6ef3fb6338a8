package ivshmem

import (
	"encoding/binary"
	"errors"
	"testing"
)

type msg struct {
	v  int64
	fd bool
}

// handshake is a valid handshake for a client with id self that finds
// the given peers, with n vectors each.
func handshake(self, n int, peers ...int) []msg {
	m := []msg{{0, false}, {int64(self), false}, {-1, true}}
	for _, p := range append(peers, self) {
		for range n {
			m = append(m, msg{int64(p), true})
		}
	}
	return m
}

func feed(d *decoder, ms []msg) error {
	for i, m := range ms {
		if _, err := d.next(m.v, m.fd); err != nil {
			return errorAt{i, err}
		}
	}
	return nil
}

type errorAt struct {
	i   int
	err error
}

func (e errorAt) Error() string { return e.err.Error() }
func (e errorAt) Unwrap() error { return e.err }

func TestDecoderAcceptsValidSequences(t *testing.T) {
	d := newDecoder(2)
	ms := append(handshake(1, 2, 0, 2), msg{3, true}, msg{3, true}, msg{0, false}, msg{3, false}, msg{0, true}, msg{0, true})
	if err := feed(d, ms); err != nil {
		t.Fatal(err)
	}
	if d.state != stRunning || d.self != 1 || len(d.known) != 2 || !d.known[0] || !d.known[2] {
		t.Fatalf("state %d self %d known %v", d.state, d.self, d.known)
	}
}

func TestDecoderRejectsMalformed(t *testing.T) {
	base := handshake(0, 2)
	for _, tc := range []struct {
		name string
		ms   []msg
		at   int // index of the message that must fail
	}{
		{"version 1", []msg{{1, false}}, 0},
		{"version with fd", []msg{{0, true}}, 0},
		{"negative own id", []msg{{0, false}, {-2, false}}, 1},
		{"own id 65536", []msg{{0, false}, {65536, false}}, 1},
		{"own id with fd", []msg{{0, false}, {1, true}}, 1},
		{"shm without fd", []msg{{0, false}, {0, false}, {-1, false}}, 2},
		{"shm marker missing", []msg{{0, false}, {0, false}, {0, true}}, 2},
		{"peer without fd in handshake", append(handshake(0, 2)[:3], msg{1, false}), 3},
		{"peer short of vectors", append(handshake(0, 2)[:3], msg{1, true}, msg{0, true}), 4},
		{"negative peer id", append(handshake(0, 2)[:3], msg{-5, true}), 3},
		{"peer twice", append(handshake(0, 2)[:3], msg{1, true}, msg{1, true}, msg{1, true}), 5},
		{"own vectors again", append(base[:len(base):len(base)], msg{0, true}), len(base)},
		{"unknown disconnect", append(base[:len(base):len(base)], msg{7, false}), len(base)},
		{"own disconnect", append(base[:len(base):len(base)], msg{0, false}), len(base)},
		{"disconnect mid-peer", append(base[:len(base):len(base)], msg{1, true}, msg{1, false}), len(base) + 1},
		{"huge id", append(base[:len(base):len(base)], msg{1 << 40, true}), len(base)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDecoder(2)
			err := feed(d, tc.ms)
			var at errorAt
			if !errors.As(err, &at) || !errors.Is(err, ErrProtocol) {
				t.Fatalf("err = %v, want a protocol error", err)
			}
			if at.i != tc.at {
				t.Fatalf("failed at message %d (%v), want %d", at.i, err, tc.at)
			}
			if _, err := d.next(0, false); !errors.Is(err, ErrProtocol) {
				t.Fatalf("decoder not broken after an error: %v", err)
			}
		})
	}
}

const fuzzMaxMessages = 24

// FuzzDecoder feeds arbitrary message sequences, 9 bytes each (int64 and
// an fd flag), to the decoder: it must never panic, never accept an id
// outside 0..65535, and stay broken after an error.
func FuzzDecoder(f *testing.F) {
	enc := func(ms []msg) []byte {
		var b []byte
		for _, m := range ms {
			b = binary.LittleEndian.AppendUint64(b, uint64(m.v))
			if m.fd {
				b = append(b, 1)
			} else {
				b = append(b, 0)
			}
		}
		return b
	}
	f.Add(uint8(1), enc(handshake(0, 1)))
	f.Add(uint8(2), enc(append(handshake(3, 2, 0, 1), msg{4, true}, msg{4, true}, msg{1, false})))
	f.Add(uint8(1), enc([]msg{{0, false}, {-1, false}}))
	f.Fuzz(func(t *testing.T, vectors uint8, b []byte) {
		// At most fuzzMaxMessages: a handshake with a few peers and
		// then some. The fuzzer minimises every input it keeps at a
		// cost that grows with the square of its length; bytes past
		// what the target reads are cut at once, and what it reads
		// stays short (unbounded inputs kept the workers minimising).
		b = b[:min(len(b), 9*fuzzMaxMessages)]
		d := newDecoder(int(vectors%8) + 1)
		broken := false
		for ; len(b) >= 9; b = b[9:] {
			v := int64(binary.LittleEndian.Uint64(b))
			m, err := d.next(v, b[8]&1 != 0)
			if broken && err == nil {
				t.Fatal("decoder accepted a message after an error")
			}
			if err != nil {
				if !errors.Is(err, ErrProtocol) {
					t.Fatalf("error %v does not match ErrProtocol", err)
				}
				broken = true
				continue
			}
			if m.peer < 0 || m.peer >= MaxPeers || m.vector < 0 || m.vector >= d.vectors {
				t.Fatalf("accepted %+v", m)
			}
		}
	})
}
