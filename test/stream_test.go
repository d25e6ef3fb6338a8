//go:build integration

package test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ntstack/ntstack/internal/transport"
)

// Verified message streams, used by every test. A stream is the sequence
// of messages one side sends on one connection; both sides derive it from
// the seed, the connection and the direction, so the receiver knows what
// every message must be:
//
//	off  size  field (little endian)
//	  0     8  seq: 0, 1, 2, ... within the stream
//	  8     4  len: payload bytes
//	 12     4  crc: CRC-32C (Castagnoli) of the payload
//	 16   len  payload
//
// The payload is a slice of a pseudo-random pool at an offset drawn, with
// its length, from the stream's generator: cheap to produce (no per-message
// fill) and different for every connection, direction and seq.
const (
	hdrLen  = 16
	maxMsg  = 256 << 10 // largest payload
	poolLen = 1 << 20

	// coalesceMax: payloads up to this size go out with their header in
	// one Write; larger ones as a header Write and a payload Write, so
	// both small frames and MTU segmentation are exercised.
	coalesceMax = 4 << 10
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Direction of a stream: which process sends it.
const (
	fromParent = 0
	fromChild  = 1
)

// newPool is the pseudo-random bytes payloads are cut from.
func newPool(seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, 0x706f6f6c))
	b := make([]byte, poolLen)
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b
}

// logUniform returns a size in [1, n] whose logarithm is uniform: every
// octave (1-2 B, ..., 128-256 KiB) is equally likely. For n = 256 KiB the
// median is 512 B and the mean is n/ln(n+1) ≈ 20.5 KiB (21,010 B), so a
// million messages carry ≈ 21 GB; a uniform size would carry six times
// that and not fit the time budget on two cores.
func logUniform(r *rand.Rand, n int) int {
	v := int(math.Exp(r.Float64() * math.Log(float64(n)+1)))
	return min(max(v, 1), n)
}

// stream generates the messages of one connection and direction.
type stream struct {
	rng  *rand.Rand
	pool []byte
	seq  uint64
}

func newStream(seed uint64, pool []byte, conn, dir int) *stream {
	return &stream{rng: rand.New(rand.NewPCG(seed, 1<<32|uint64(conn)<<8|uint64(dir))), pool: pool}
}

// next returns the next message's seq and payload. The payload aliases the
// pool: nobody may modify it.
func (s *stream) next() (uint64, []byte) {
	n := logUniform(s.rng, maxMsg)
	off := s.rng.IntN(len(s.pool) - n + 1)
	seq := s.seq
	s.seq++
	return seq, s.pool[off : off+n]
}

// stats are the totals of one stream, as one side counted them. Sum chains
// CRC-32C over every header in order, so equal sums mean the same messages
// in the same order with the same payload checksums.
type stats struct {
	Msgs  int64  `json:"msgs"`
	Bytes int64  `json:"bytes"` // payload bytes
	Sum   uint32 `json:"sum"`
}

func (s *stats) add(hdr []byte, n int) {
	s.Msgs++
	s.Bytes += int64(n)
	s.Sum = crc32.Update(s.Sum, castagnoli, hdr)
}

// connSummary is what one side counted on one connection.
type connSummary struct {
	Sent  stats `json:"sent"`
	Recvd stats `json:"recvd"`
}

func putHeader(b []byte, seq uint64, payload []byte) {
	binary.LittleEndian.PutUint64(b[0:], seq)
	binary.LittleEndian.PutUint32(b[8:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[12:], crc32.Checksum(payload, castagnoli))
}

// sender writes a stream on a connection.
type sender struct {
	c     *transport.Conn
	s     *stream
	st    stats
	buf   []byte
	count atomic.Int64 // messages written, for observers
}

func newSender(c *transport.Conn, s *stream) *sender {
	return &sender{c: c, s: s, buf: make([]byte, hdrLen+coalesceMax)}
}

// run writes n messages then closes the write half, or, with n < 0, writes
// until a Write fails.
func (w *sender) run(n int) error {
	for i := 0; n < 0 || i < n; i++ {
		seq, p := w.s.next()
		putHeader(w.buf, seq, p)
		var err error
		if len(p) <= coalesceMax {
			copy(w.buf[hdrLen:], p)
			_, err = w.c.Write(w.buf[:hdrLen+len(p)])
		} else if _, err = w.c.Write(w.buf[:hdrLen]); err == nil {
			_, err = w.c.Write(p)
		}
		if err != nil {
			return fmt.Errorf("write message %d: %w", seq, err)
		}
		w.st.add(w.buf[:hdrLen], len(p))
		w.count.Add(1)
	}
	if err := w.c.CloseWrite(); err != nil {
		return fmt.Errorf("close write after %d messages: %w", n, err)
	}
	return nil
}

// receiver reads a stream from a connection and checks every message: seq
// the next one, len the one the stream generates, CRC and payload intact.
// It stalls at random (a slow application) and now and then reads a message
// a few bytes at a time (partial reads).
type receiver struct {
	c     *transport.Conn
	s     *stream
	rng   *rand.Rand // stalls and tiny reads
	st    stats
	hdr   [hdrLen]byte
	buf   []byte
	count atomic.Int64 // messages verified, for observers

	stallEvery int           // 1 in stallEvery messages, sleep up to maxStall first
	maxStall   time.Duration //
	tinyEvery  int           // 1 in tinyEvery messages, read the first bytes in pieces of 1-7
}

func newReceiver(c *transport.Conn, s *stream, rng *rand.Rand) *receiver {
	return &receiver{c: c, s: s, rng: rng, buf: make([]byte, maxMsg),
		stallEvery: 500, maxStall: 3 * time.Millisecond, tinyEvery: 200}
}

// run reads and checks n messages and then requires io.EOF, or, with
// n < 0, reads until an error, which it returns.
func (r *receiver) run(n int) error {
	for i := 0; n < 0 || i < n; i++ {
		wantSeq, want := r.s.next()
		if r.stallEvery > 0 && r.rng.IntN(r.stallEvery) == 0 {
			// A stalling reader, the thing under test: the sender meets
			// a full window and must resume once it drains.
			time.Sleep(time.Duration(r.rng.Int64N(int64(r.maxStall) + 1)))
		}
		tiny := 0
		if r.tinyEvery > 0 && r.rng.IntN(r.tinyEvery) == 0 {
			tiny = 1 + r.rng.IntN(64)
		}
		if err := r.fill(r.hdr[:], &tiny); err != nil {
			if errors.Is(err, io.EOF) && n >= 0 {
				return fmt.Errorf("stream ended after %d of %d messages", i, n)
			}
			return fmt.Errorf("read header of message %d: %w", wantSeq, err)
		}
		seq := binary.LittleEndian.Uint64(r.hdr[0:])
		size := binary.LittleEndian.Uint32(r.hdr[8:])
		crc := binary.LittleEndian.Uint32(r.hdr[12:])
		if seq != wantSeq {
			return fmt.Errorf("message %d: header says seq %d (lost, duplicated or reordered)", wantSeq, seq)
		}
		if int(size) != len(want) {
			return fmt.Errorf("message %d: header says %d bytes, the stream's message has %d", seq, size, len(want))
		}
		p := r.buf[:size]
		if err := r.fill(p, &tiny); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("read %d-byte payload of message %d: %w", size, seq, err)
		}
		if got := crc32.Checksum(p, castagnoli); got != crc {
			return fmt.Errorf("message %d: payload CRC-32C %#08x, header says %#08x (%s)", seq, got, crc, diff(p, want))
		}
		if !bytes.Equal(p, want) {
			return fmt.Errorf("message %d: CRC matches but payload differs from the stream's (%s)", seq, diff(p, want))
		}
		r.st.add(r.hdr[:], len(p))
		r.count.Add(1)
	}
	switch m, err := r.c.Read(r.hdr[:1]); {
	case m > 0:
		return fmt.Errorf("%d bytes after the last of %d messages", m, n)
	case err != io.EOF:
		return fmt.Errorf("after the last of %d messages: got %v, want io.EOF", n, err)
	}
	return nil
}

// fill reads len(b) bytes; while *tiny > 0 it reads at most 1-7 bytes at
// a time, counting them off *tiny. Like io.ReadFull it returns io.EOF only
// when nothing was read.
func (r *receiver) fill(b []byte, tiny *int) error {
	for got := 0; got < len(b); {
		k := len(b) - got
		if *tiny > 0 {
			k = min(k, 1+r.rng.IntN(7), *tiny)
		}
		m, err := r.c.Read(b[got : got+k])
		got += m
		if *tiny > 0 {
			*tiny = max(*tiny-m, 0)
		}
		if err != nil {
			if errors.Is(err, io.EOF) && got > 0 {
				return io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// diff describes where got first differs from want.
func diff(got, want []byte) string {
	for i := range min(len(got), len(want)) {
		if got[i] != want[i] {
			return fmt.Sprintf("first difference at byte %d of %d: %#02x, want %#02x", i, len(want), got[i], want[i])
		}
	}
	if len(got) != len(want) {
		return fmt.Sprintf("%d bytes, want %d", len(got), len(want))
	}
	return "no difference"
}

// receiverRand is the random source of the receiver of (conn, dir).
func receiverRand(seed uint64, conn, dir int) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 2<<32|uint64(conn)<<8|uint64(dir)))
}

// exchange runs n messages each way on every connection, full duplex: a
// sender and a receiver per connection. self is fromParent or fromChild.
// Each connection is closed once both of its halves are done. The first
// error closes every connection, so that nothing waits for a peer that
// will never answer.
func exchange(conns []*transport.Conn, seed uint64, pool []byte, self, n int) ([]connSummary, error) {
	var (
		wg      sync.WaitGroup
		errMu   sync.Mutex
		errs    []error
		failing sync.Once
	)
	fail := func(err error) {
		errMu.Lock()
		errs = append(errs, err)
		errMu.Unlock()
		failing.Do(func() {
			for _, c := range conns {
				c.Close()
			}
		})
	}
	sums := make([]connSummary, len(conns))
	for i, c := range conns {
		w := newSender(c, newStream(seed, pool, i, self))
		r := newReceiver(c, newStream(seed, pool, i, 1-self), receiverRand(seed, i, 1-self))
		var halves sync.WaitGroup
		halves.Add(2)
		wg.Add(1)
		go func() {
			defer halves.Done()
			if err := w.run(n); err != nil {
				fail(fmt.Errorf("connection %d send: %w", i, err))
			}
		}()
		go func() {
			defer halves.Done()
			if err := r.run(n); err != nil {
				fail(fmt.Errorf("connection %d receive: %w", i, err))
			}
		}()
		go func() {
			defer wg.Done()
			halves.Wait()
			c.Close()
			sums[i] = connSummary{Sent: w.st, Recvd: r.st}
		}()
	}
	wg.Wait()
	return sums, errors.Join(errs...)
}
