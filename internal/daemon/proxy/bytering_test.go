package proxy

import (
	"math/rand"
	"testing"
)

// TestByteRing streams numbered bytes through a small byteRing in random
// pieces — in through free/commit and put, out through span and trim,
// across wraps and grows — and checks that every byte comes out once, in
// order, and that the buffer never outgrows its limit.
func TestByteRing(t *testing.T) {
	const limit = 4 * ringMinSize
	rng := rand.New(rand.NewSource(1))
	r := newByteRing(limit)
	var in, out uint64 // next byte number to add, to take
	for round := 0; round < 20000; round++ {
		switch rng.Intn(5) {
		case 0: // put
			p := make([]byte, min(1+rng.Intn(ringMinSize), limit-r.n))
			for i := range p {
				p[i] = byte(in + uint64(i))
			}
			if !r.put(p) {
				t.Fatalf("put %d bytes with %d of %d held", len(p), r.n, limit)
			}
			in += uint64(len(p))
		case 1, 2: // read into free room
			want := min(1+rng.Intn(ringMinSize+ringMinSize/2), limit-r.n)
			room := r.free(want, want+rng.Intn(ringMinSize))
			if want > 0 && len(room) == 0 {
				t.Fatalf("no room with %d of %d held", r.n, limit)
			}
			k := rng.Intn(len(room) + 1)
			for i := range room[:k] {
				room[i] = byte(in + uint64(i))
			}
			r.commit(k)
			in += uint64(k)
		default: // write from a span, then trim
			p := r.span(out, 1+rng.Intn(2*ringMinSize))
			for i, b := range p {
				if b != byte(out+uint64(i)) {
					t.Fatalf("byte %d is %d", out+uint64(i), b)
				}
			}
			out += uint64(rng.Intn(len(p) + 1))
			r.trim(out)
		}
		if len(r.buf) > limit || r.end() != in || r.base != out {
			t.Fatalf("round %d: size %d, held %d..%d, want %d..%d", round, len(r.buf), r.base, r.end(), out, in)
		}
	}
	if in < 10*limit {
		t.Fatalf("only %d bytes went through", in)
	}
	if r.n == limit && r.put([]byte{1}) {
		t.Fatal("put past the limit")
	}
}
