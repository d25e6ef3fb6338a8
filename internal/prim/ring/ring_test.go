package ring

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

// newPair formats a ring of size bytes on heap memory and attaches both ends.
func newPair(t testing.TB, size int) (*Producer, *Consumer, []byte, []byte) {
	t.Helper()
	data := make([]byte, RegionSize(size))
	ctl := make([]byte, CtlSize)
	require.NoError(t, Format(data))
	require.NoError(t, FormatCtl(ctl))
	p, err := NewProducer(data, ctl)
	require.NoError(t, err)
	c, err := NewConsumer(data, ctl)
	require.NoError(t, err)
	return p, c, data, ctl
}

func put(t testing.TB, p *Producer, tag uint32, payload []byte) {
	t.Helper()
	b, err := p.Reserve(len(payload))
	require.NoError(t, err)
	copy(b, payload)
	p.Commit(tag)
}

func TestSingleRecord(t *testing.T) {
	p, c, _, _ := newPair(t, MinSize)
	_, _, ok, err := c.Peek()
	require.NoError(t, err)
	require.False(t, ok, "fresh ring must be empty")

	put(t, p, 42, []byte("hello"))
	tag, b, ok, err := c.Peek()
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, uint32(42), tag)
	require.Equal(t, "hello", string(b))
	// Peek is idempotent until Release.
	_, b2, _, _ := c.Peek()
	require.Equal(t, b, b2)
	c.Release()
	_, _, ok, _ = c.Peek()
	require.False(t, ok)
}

func TestZeroLengthAndMaxTag(t *testing.T) {
	p, c, _, _ := newPair(t, MinSize)
	put(t, p, MaxTag, nil)
	tag, b, ok, err := c.Peek()
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, uint32(MaxTag), tag)
	require.Empty(t, b)
	c.Release()
}

// TestWrapAndFull fills the ring in a single goroutine, checks ErrFull, and
// drains it across many laps so padding records are exercised. Some
// reservations are cancelled and the rest shrunk to a random part before
// Commit (padding is decided for the reserved length): a shrunk record
// reads back as what was written, a cancelled one not at all.
func TestWrapAndFull(t *testing.T) {
	p, c, _, _ := newPair(t, MinSize)
	rng := rand.New(rand.NewPCG(1, 2))
	var sent, got uint64
	var lens []int // of the records committed and not yet read
	for lap := 0; lap < 200; lap++ {
		for {
			b, err := p.Reserve(rng.IntN(p.MaxPayload() + 1))
			if errors.Is(err, ErrFull) {
				break
			}
			require.NoError(t, err)
			if rng.IntN(4) == 0 {
				p.Cancel()
				continue
			}
			n := len(b)
			if rng.IntN(2) == 0 {
				n = rng.IntN(len(b) + 1)
				p.Shrink(n)
			}
			for i := range n {
				b[i] = byte(sent + uint64(i))
			}
			p.Commit(uint32(sent & MaxTag))
			lens = append(lens, n)
			sent++
		}
		for {
			tag, b, ok, err := c.Peek()
			require.NoError(t, err)
			if !ok {
				break
			}
			require.Equal(t, uint32(got&MaxTag), tag)
			require.Len(t, b, lens[0])
			lens = lens[1:]
			for i := range b {
				require.Equal(t, byte(got+uint64(i)), b[i])
			}
			c.Release()
			got++
		}
		require.Equal(t, sent, got)
	}
	_, err := p.Reserve(8)
	require.NoError(t, err)
	require.Panics(t, func() { p.Shrink(9) }, "a reservation only shrinks")
}

func TestWriteBackWakesProducer(t *testing.T) {
	p, c, _, _ := newPair(t, MinSize)
	// Fill until full; the producer then sleeps on a space wake.
	for {
		b, err := p.Reserve(100)
		if errors.Is(err, ErrFull) {
			break
		}
		require.NoError(t, err)
		_ = b
		p.Commit(1)
	}
	p.ArmSpaceWake()
	_, err := p.Reserve(100)
	require.ErrorIs(t, err, ErrFull, "re-check after arming still full")
	woken := false
	for {
		_, _, ok, err := c.Peek()
		require.NoError(t, err)
		if !ok {
			break
		}
		if c.Release() {
			woken = true
		}
	}
	require.True(t, woken, "a flagged record must write back and wake the producer")
	_, err = p.Reserve(100)
	require.NoError(t, err)
}

// TestWakeArmedBeforeAttach: a consumer that arms before the producer
// attaches must still be woken by the first record.
func TestWakeArmedBeforeAttach(t *testing.T) {
	data := make([]byte, RegionSize(MinSize))
	ctl := make([]byte, CtlSize)
	require.NoError(t, Format(data))
	require.NoError(t, FormatCtl(ctl))
	c, err := NewConsumer(data, ctl)
	require.NoError(t, err)
	c.ArmDataWake()
	p, err := NewProducer(data, ctl)
	require.NoError(t, err)
	_, err = p.Reserve(1)
	require.NoError(t, err)
	require.True(t, p.Commit(1))
}

func TestDataWake(t *testing.T) {
	p, c, _, _ := newPair(t, MinSize)
	put(t, p, 1, []byte{1})
	c.Release2(t)
	c.ArmDataWake()
	b, _ := p.Reserve(1)
	b[0] = 2
	require.True(t, p.Commit(1), "armed consumer must be woken")
	b, _ = p.Reserve(1)
	b[0] = 3
	require.False(t, p.Commit(1), "one wake per arming")
}

// Release2 drains one record in tests.
func (c *Consumer) Release2(t *testing.T) {
	_, _, ok, err := c.Peek()
	require.NoError(t, err)
	require.True(t, ok)
	c.Release()
}

// TestConcurrent streams records of random size between two goroutines
// with the consumer arming wakes and the producer sleeping on space, and
// checks content and order.
func TestConcurrent(t *testing.T) {
	const n = 200000
	p, c, _, _ := newPair(t, 64<<10)
	type wake struct{}
	dataBell := make(chan wake, 1)
	spaceBell := make(chan wake, 1)
	ring := func(ch chan wake) {
		select {
		case ch <- wake{}:
		default:
		}
	}
	done := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(3, 4))
		for i := 0; i < n; i++ {
			size := 4 + rng.IntN(2048)
			for {
				b, err := p.Reserve(size)
				if errors.Is(err, ErrFull) {
					p.ArmSpaceWake() // then re-check before sleeping
					if b, err = p.Reserve(size); errors.Is(err, ErrFull) {
						<-spaceBell
						continue
					}
				}
				if err != nil {
					done <- err
					return
				}
				binary.LittleEndian.PutUint32(b, uint32(i))
				for j := 4; j < len(b); j++ {
					b[j] = byte(i * j)
				}
				if p.Commit(uint32(i) & MaxTag) {
					ring(dataBell)
				}
				break
			}
		}
		done <- nil
	}()
	var sum uint32
	for i := 0; i < n; {
		tag, b, ok, err := c.Peek()
		require.NoError(t, err)
		if !ok {
			c.ArmDataWake()
			if _, _, ok, _ = c.Peek(); !ok {
				<-dataBell
			}
			continue
		}
		require.Equal(t, uint32(i)&MaxTag, tag)
		for j := 4; j < len(b); j++ {
			if b[j] != byte(i*j) {
				t.Fatalf("record %d byte %d: got %d", i, j, b[j])
			}
		}
		sum = crc32.Update(sum, crc32.IEEETable, b)
		if c.Release() {
			ring(spaceBell)
		}
		i++
		if i%1000 == 0 {
			runtime.Gosched()
		}
	}
	require.NoError(t, <-done)
}

func TestAttachRefusesMismatch(t *testing.T) {
	data := make([]byte, RegionSize(MinSize))
	ctl := make([]byte, CtlSize)
	require.NoError(t, FormatCtl(ctl))
	_, err := NewConsumer(data, ctl)
	require.ErrorIs(t, err, ErrLayout, "unformatted region")

	require.NoError(t, Format(data))
	binary.LittleEndian.PutUint16(data[offVersion:], Version+1)
	_, err = NewProducer(data, ctl)
	require.ErrorIs(t, err, ErrLayout)
	require.Contains(t, err.Error(), "version 2")

	require.NoError(t, Format(data))
	binary.LittleEndian.PutUint64(data[offSize:], 2*MinSize)
	_, err = NewProducer(data, ctl)
	require.ErrorIs(t, err, ErrLayout)

	require.Error(t, Format(make([]byte, RegionSize(MinSize)+8)), "size not a power of two")
	require.Error(t, Format(make([]byte, 100)))
	require.ErrorIs(t, FormatCtl(make([]byte, 8)), ErrLayout)
}

func TestCorruptHeaders(t *testing.T) {
	cases := map[string]func(data []byte){
		"unknown flag":  func(d []byte) { store64(d, HeaderSize, encodeHeader(8, flagValid|0x80, 0)) },
		"not valid":     func(d []byte) { store64(d, HeaderSize, encodeHeader(8, flagPad, 0)) },
		"overrun":       func(d []byte) { store64(d, HeaderSize, encodeHeader(MinSize, flagValid, 0)) },
		"huge length":   func(d []byte) { store64(d, HeaderSize, encodeHeader(1<<31, flagValid, 0)) },
		"short padding": func(d []byte) { store64(d, HeaderSize, encodeHeader(16, flagValid|flagPad, 0)) },
		"padding at 0":  func(d []byte) { store64(d, HeaderSize, encodeHeader(MinSize-recHdr, flagValid|flagPad, 0)) },
	}
	for name, corrupt := range cases {
		t.Run(name, func(t *testing.T) {
			_, c, data, _ := newPair(t, MinSize)
			corrupt(data)
			_, _, _, err := c.Peek()
			require.ErrorIs(t, err, ErrCorrupt)
			_, _, _, err = c.Peek()
			require.ErrorIs(t, err, ErrCorrupt, "a failed ring stays failed")
		})
	}
}

func TestCorruptReadIndex(t *testing.T) {
	p, _, _, ctl := newPair(t, MinSize)
	put(t, p, 1, make([]byte, 100))
	store64(ctl, offReadIdx, 1<<40)
	_, err := p.Free()
	require.ErrorIs(t, err, ErrCorrupt)
	_, err = p.Reserve(1)
	require.ErrorIs(t, err, ErrCorrupt)
}

func TestSizeFor(t *testing.T) {
	require.Equal(t, 0, SizeFor(100))
	require.Equal(t, MinSize, SizeFor(RegionSize(MinSize)))
	require.Equal(t, MinSize, SizeFor(RegionSize(2*MinSize)-1))
	require.Equal(t, 1<<20, SizeFor(2<<20-1))
}

// FuzzConsumer lets the fuzzer write the peer's side of the ring: the whole
// record area and the control block. The consumer must never panic or
// return a payload outside the ring (reading at its head or ahead of it),
// and must keep failing once failed.
func FuzzConsumer(f *testing.F) {
	f.Add([]byte{}, uint64(0))
	seed := make([]byte, 64)
	binary.LittleEndian.PutUint64(seed, encodeHeader(5, flagValid, 7))
	f.Add(seed, uint64(0))
	binary.LittleEndian.PutUint64(seed, encodeHeader(MinSize-8, flagValid|flagPad, 0))
	f.Add(seed, uint64(3))
	f.Fuzz(func(t *testing.T, peer []byte, start uint64) {
		data := make([]byte, RegionSize(MinSize))
		ctl := make([]byte, CtlSize)
		if err := Format(data); err != nil {
			t.Fatal(err)
		}
		if err := FormatCtl(ctl); err != nil {
			t.Fatal(err)
		}
		c, err := NewConsumer(data, ctl)
		if err != nil {
			t.Fatal(err)
		}
		c.read = (start % (1 << 20)) &^ 7 // start anywhere, as after many laps
		copy(data[HeaderSize:], peer)
		for i := 0; i < 2*MinSize/8; i++ {
			_, b, ok, err := c.Peek()
			if err != nil {
				if _, _, _, err2 := c.Peek(); err2 == nil {
					t.Fatal("consumer recovered from corruption")
				}
				return
			}
			if !ok {
				return
			}
			if len(b) > MaxPayloadFor(MinSize) {
				t.Fatalf("payload of %d bytes", len(b))
			}
			k := 0
			_ = c.Ahead(MaxTaken, func(_ uint32, b []byte) (take, stop bool) {
				if len(b) > MaxPayloadFor(MinSize) {
					t.Fatalf("payload ahead of %d bytes", len(b))
				}
				k++
				return k%2 == 0, false
			})
			c.Release()
		}
	})
}

// A batch becomes visible with its EndBatch, in order, across a wrap.
func TestBatch(t *testing.T) {
	p, c, _, _ := newPair(t, MinSize)
	seq := uint32(0)
	for round := range 20 {
		p.BeginBatch()
		n := 1 + round%5
		for range n {
			put(t, p, seq, make([]byte, 300))
			seq++
		}
		_, _, ok, err := c.Peek()
		require.NoError(t, err)
		require.False(t, ok, "round %d: a record of an open batch is visible", round)
		p.EndBatch()
		for i := range n {
			tag, b, ok, err := c.Peek()
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, seq-uint32(n-i), tag)
			require.Len(t, b, 300)
			c.Release()
		}
		_, _, ok, _ = c.Peek()
		require.False(t, ok)
	}
	require.False(t, p.EndBatch(), "an empty batch asks for no doorbell")
}

// Records taken ahead of the head (Ahead) are never seen again, the others
// come in order, and the room of both comes back: over many laps, with
// write-backs asked for by taken records as by others, the producer never
// waits for room the consumer has done with.
func TestAhead(t *testing.T) {
	p, c, _, _ := newPair(t, MinSize)
	rng := rand.New(rand.NewPCG(1, 2))
	payload := func(tag uint32, n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(tag + uint32(i))
		}
		return b
	}
	var sent, got []uint32 // tags in ring order; tags consumed, in either way
	gone := map[uint32]bool{}
	next := uint32(0)
	for len(got) < 5000 {
		// Fill with records of random sizes until the ring is full.
		for {
			tag, n := next, rng.IntN(MaxPayloadFor(MinSize)/2)
			b, err := p.Reserve(n)
			if errors.Is(err, ErrFull) {
				break
			}
			require.NoError(t, err)
			copy(b, payload(tag, n))
			p.Commit(tag)
			sent, next = append(sent, tag), next+1
		}
		// Take some records ahead of the head, then release the head.
		tag, _, ok, err := c.Peek()
		require.NoError(t, err)
		require.True(t, ok, "the ring is full but the consumer sees nothing")
		require.False(t, gone[tag], "record %d seen again after it was taken", tag)
		require.NoError(t, c.Ahead(4, func(tag uint32, b []byte) (take, stop bool) {
			require.False(t, gone[tag], "record %d seen again after it was taken", tag)
			require.Equal(t, payload(tag, len(b)), b)
			if rng.IntN(3) == 0 {
				gone[tag] = true
				got = append(got, tag)
				return true, rng.IntN(2) == 0
			}
			return false, false
		}))
		gone[tag] = true
		got = append(got, tag)
		c.Release()
		require.LessOrEqual(t, len(c.taken), MaxTaken)
	}
	// Drain: what is left comes in ring order, without the taken records.
	for {
		tag, _, ok, err := c.Peek()
		require.NoError(t, err)
		if !ok {
			break
		}
		require.False(t, gone[tag], "record %d seen again after it was taken", tag)
		gone[tag] = true
		c.Release()
	}
	require.Len(t, gone, len(sent), "every record consumed once")
	require.Empty(t, c.taken)
	free, err := p.Free()
	require.NoError(t, err)
	require.Equal(t, MinSize, free, "all room handed back")
}

// Reading ahead stops at an open batch: its records show with its first
// header, as they do to Peek.
func TestAheadStopsAtOpenBatch(t *testing.T) {
	p, c, _, _ := newPair(t, MinSize)
	put(t, p, 1, make([]byte, 100))
	p.BeginBatch()
	put(t, p, 2, make([]byte, 100))
	put(t, p, 3, make([]byte, 100))
	_, _, ok, err := c.Peek()
	require.NoError(t, err)
	require.True(t, ok)
	var seen []uint32
	ahead := func(tag uint32, b []byte) (take, stop bool) { seen = append(seen, tag); return false, false }
	require.NoError(t, c.Ahead(8, ahead))
	require.Empty(t, seen)
	p.EndBatch()
	require.NoError(t, c.Ahead(8, ahead))
	require.Equal(t, []uint32{2, 3}, seen)
}
