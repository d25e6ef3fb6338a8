package rdma

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

// moveRange "writes" tx's next range into rx like the NIC would and
// publishes it with the range's immediate.
func moveRange(t *testing.T, tx *txRing, rx *rxRing) bool {
	t.Helper()
	off, n, end := tx.next()
	if n == 0 {
		return false
	}
	copy(rx.buf[off:off+n], tx.buf[off:off+n])
	tx.posted, tx.acked = end, end
	if err := rx.publish(dataImm(end)); err != nil {
		t.Fatalf("publish %d: %v", end, err)
	}
	return true
}

// TestRingRoundTrip streams random-sized writes through a small ring,
// with credits as the connection sends them, and checks every byte: the
// ring wraps many times, records are cut at the end, pads appear.
func TestRingRoundTrip(t *testing.T) {
	const size = MinRingSize
	rng := rand.New(rand.NewPCG(1, 2))
	fill := rand.NewChaCha8([32]byte{1})
	tx := newTxRing(make([]byte, size))
	rx := newRxRing(make([]byte, size))
	var sent, got bytes.Buffer
	pads := 0
	buf := make([]byte, 3000)
	for range 2000 {
		p := make([]byte, 1+rng.IntN(2*size))
		fill.Read(p)
		for len(p) > 0 {
			before := tx.prod
			k := tx.placeData(p)
			if tx.prod-before > alignUp(recHdrSize+uint64(k)) {
				pads++
			}
			sent.Write(p[:k])
			p = p[k:]
			for moveRange(t, tx, rx) {
			}
			n, err := rx.read(buf[:1+rng.IntN(len(buf)-1)])
			if err != nil {
				t.Fatal(err)
			}
			got.Write(buf[:n])
			if rx.creditDue() {
				rx.credited = rx.cons
				if err := tx.credit(creditImm(rx.cons)); err != nil {
					t.Fatal(err)
				}
			}
			if k == 0 && n == 0 && !rx.creditDue() {
				// Stuck would mean a deadlock: no room, nothing to read.
				rx.credited = rx.cons
				if err := tx.credit(creditImm(rx.cons)); err != nil {
					t.Fatal(err)
				}
				if tx.free() < recHdrSize+ringAlign {
					t.Fatalf("deadlock: free %d with everything read", tx.free())
				}
			}
		}
	}
	for {
		n, err := rx.read(buf)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		got.Write(buf[:n])
	}
	if !bytes.Equal(sent.Bytes(), got.Bytes()) {
		t.Fatalf("received %d bytes differ from the %d sent", got.Len(), sent.Len())
	}
	if tx.prod < 100*size {
		t.Fatalf("only %d bytes through a %d-byte ring", tx.prod, size)
	}
	t.Logf("%d bytes, %d ring laps, %d pads", sent.Len(), tx.prod/size, pads)
}

// TestRingFlowControl: a sender never places more than the ring holds
// past the receiver's credited position, and a full ring takes nothing.
func TestRingFlowControl(t *testing.T) {
	tx := newTxRing(make([]byte, MinRingSize))
	p := make([]byte, 10*MinRingSize)
	total := 0
	for {
		k := tx.placeData(p)
		if k == 0 {
			break
		}
		total += k
	}
	if tx.prod-tx.peerCons > MinRingSize {
		t.Fatalf("placed %d bytes in a %d-byte ring", tx.prod, MinRingSize)
	}
	if total < MinRingSize-64 {
		t.Fatalf("only %d payload bytes fit a %d-byte ring", total, MinRingSize)
	}
	if tx.placeFin() && tx.free() > MinRingSize {
		t.Fatal("free space overflowed")
	}
}

// TestRingPad: where only a header fits at the end, a pad moves the next
// record to offset 0 and the reader skips it.
func TestRingPad(t *testing.T) {
	tx := newTxRing(make([]byte, MinRingSize))
	rx := newRxRing(make([]byte, MinRingSize))
	first := make([]byte, MinRingSize-2*recHdrSize) // leaves exactly one header at the end
	if k := tx.placeData(first); k != len(first) {
		t.Fatalf("placed %d of %d", k, len(first))
	}
	moveRange(t, tx, rx)
	buf := make([]byte, MinRingSize)
	if n, err := rx.read(buf); err != nil || n != len(first) {
		t.Fatalf("read %d, %v", n, err)
	}
	if err := tx.credit(creditImm(rx.cons)); err != nil {
		t.Fatal(err)
	}
	if k := tx.placeData([]byte("after the pad")); k != 13 {
		t.Fatalf("placed %d", k)
	}
	if tx.prod%MinRingSize != alignUp(recHdrSize+13) {
		t.Fatalf("record after the pad ends at offset %d", tx.prod%MinRingSize)
	}
	for moveRange(t, tx, rx) {
	}
	n, err := rx.read(buf)
	if err != nil || string(buf[:n]) != "after the pad" {
		t.Fatalf("read %q, %v", buf[:n], err)
	}
}

// TestRingRejects: corrupt immediates and headers fail with errProtocol.
func TestRingRejects(t *testing.T) {
	cases := []struct {
		name string
		run  func(rx *rxRing, tx *txRing) error
	}{
		{"immediate beyond the ring", func(rx *rxRing, _ *txRing) error { return rx.publish(dataImm(2 * MinRingSize)) }},
		{"immediate that does not advance", func(rx *rxRing, _ *txRing) error { return rx.publish(dataImm(0)) }},
		{"credit beyond what was sent", func(_ *rxRing, tx *txRing) error { return tx.credit(creditImm(64)) }},
		{"garbage header", func(rx *rxRing, _ *txRing) error {
			copy(rx.buf, "garbage!")
			if err := rx.publish(dataImm(64)); err != nil {
				return err
			}
			_, err := rx.read(make([]byte, 10))
			return err
		}},
		{"record past the published bytes", func(rx *rxRing, _ *txRing) error {
			putHeader(rx.buf, recData, 100)
			if err := rx.publish(dataImm(16)); err != nil {
				return err
			}
			_, err := rx.read(make([]byte, 10))
			return err
		}},
		{"record across the ring end", func(rx *rxRing, _ *txRing) error {
			rx.cons, rx.published = MinRingSize-16, MinRingSize-16
			putHeader(rx.buf[MinRingSize-16:], recData, 100)
			if err := rx.publish(dataImm(MinRingSize + 200)); err != nil {
				return err
			}
			_, err := rx.read(make([]byte, 10))
			return err
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.run(newRxRing(make([]byte, MinRingSize)), newTxRing(make([]byte, MinRingSize)))
			if !errors.Is(err, errProtocol) {
				t.Fatalf("error %v, want errProtocol", err)
			}
		})
	}
}

func TestAdvance(t *testing.T) {
	for _, c := range []struct{ cur, pos uint64 }{
		{0, 8}, {1<<31 - 8, 1<<31 + 8}, {5<<31 + 16, 5<<31 + 16 + MaxRingSize}, {1 << 40, 1<<40 + 1},
	} {
		if got := advance(c.cur, dataImm(c.pos)); got != c.pos {
			t.Errorf("advance(%d, imm of %d) = %d", c.cur, c.pos, got)
		}
		if got := advance(c.cur, creditImm(c.pos)&immPosMask); got != c.pos {
			t.Errorf("advance(%d, credit of %d) = %d", c.cur, c.pos, got)
		}
	}
}

func TestCheckRingSize(t *testing.T) {
	for _, ok := range []uint64{MinRingSize, DefaultRingSize, MaxRingSize} {
		if err := checkRingSize(ok); err != nil {
			t.Errorf("%d: %v", ok, err)
		}
	}
	for _, bad := range []uint64{0, 1, MinRingSize / 2, 3 * MinRingSize, 2 * MaxRingSize} {
		if checkRingSize(bad) == nil {
			t.Errorf("%d accepted", bad)
		}
	}
}
