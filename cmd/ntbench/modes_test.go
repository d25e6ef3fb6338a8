package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestPattern(t *testing.T) {
	p := newPattern(100)
	if len(p) != patternPeriod+100 {
		t.Fatalf("len = %d, want %d", len(p), patternPeriod+100)
	}
	// The stream repeats with the period, and at and matches agree across
	// the wrap.
	for _, off := range []int64{0, 5, patternPeriod - 50, patternPeriod, 7*patternPeriod - 1} {
		msg := p.at(off, 100)
		if !p.matches(off, msg) || !p.matches(off+patternPeriod, msg) {
			t.Errorf("matches(%d, at(%d)) = false", off, off)
		}
		if p.matches(off+1, msg) {
			t.Errorf("matches(%d, at(%d)) = true", off+1, off)
		}
	}
	long := make([]byte, 3*patternPeriod)
	for i := range long {
		long[i] = p[(i+9)%patternPeriod]
	}
	if !p.matches(9, long) {
		t.Error("matches rejects a stream three periods long")
	}
	long[2*patternPeriod] ^= 1
	if p.matches(9, long) {
		t.Error("matches accepts a corrupted byte")
	}
}

// TestModes runs every mode's client against its server over net.Pipe,
// with verification on.
func TestModes(t *testing.T) {
	o := &options{count: 50, warmup: 7, window: 4, verify: true, readBuf: defaultReadBuf}
	for _, m := range modes {
		if m.client == nil {
			continue // mixed: TestMixed
		}
		for _, size := range []int{1, 64, 5000} {
			t.Run(fmt.Sprintf("%s/%d", m.name, size), func(t *testing.T) {
				cc, sc := net.Pipe()
				served := make(chan error, 1)
				go func() { served <- m.serve(sc, o) }()
				c := m.client(cc, size, o)
				if err := c.warmup(); err != nil {
					t.Fatalf("warmup: %v", err)
				}
				s, err := c.measure(time.Now().Add(time.Minute))
				if err != nil {
					t.Fatalf("measure: %v", err)
				}
				if s.msgs != o.count {
					t.Errorf("measured %d messages, want %d", s.msgs, o.count)
				}
				wantRTTs := o.count
				if m.name == "stream" {
					wantRTTs = 0
				}
				if len(s.rtts) != wantRTTs {
					t.Errorf("got %d round-trip times, want %d", len(s.rtts), wantRTTs)
				}
				cc.Close()
				if err := <-served; err != nil {
					t.Errorf("server: %v", err)
				}
			})
		}
	}
}

// TestMeasureStopsAtDeadline checks that a passed deadline ends every mode
// with no or few messages and no error.
func TestMeasureStopsAtDeadline(t *testing.T) {
	o := &options{count: 1_000_000, window: 4, readBuf: defaultReadBuf}
	for _, m := range modes {
		if m.client == nil {
			continue // mixed: TestMixed
		}
		t.Run(m.name, func(t *testing.T) {
			cc, sc := net.Pipe()
			defer cc.Close()
			go m.serve(sc, o)
			s, err := m.client(cc, 64, o).measure(time.Now().Add(-time.Second))
			if err != nil || s.msgs != 0 {
				t.Errorf("measure past the deadline = %d messages, %v; want 0, nil", s.msgs, err)
			}
		})
	}
}

// TestMixed runs mixed mode over pipes: one pingpong flow beside two
// streams, each served by the kind its first byte announces, every one
// until the deadline, past -count.
func TestMixed(t *testing.T) {
	o := &options{count: 40, warmup: 5, verify: true, readBuf: defaultReadBuf}
	var conns []net.Conn
	served := make(chan error, 3)
	for range 3 {
		cc, sc := net.Pipe()
		defer cc.Close()
		go func() { served <- mixedServe(sc, o) }()
		conns = append(conns, cc)
	}
	clients, err := mixedClients(conns, 5000, o)
	if err != nil {
		t.Fatal(err)
	}
	samples := make([]sample, len(clients))
	deadline := time.Now().Add(300 * time.Millisecond)
	err = parallel(len(clients), func(i int) (err error) {
		if err := clients[i].warmup(); err != nil {
			return err
		}
		samples[i], err = clients[i].measure(deadline)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if time.Now().Before(deadline) {
		t.Error("the flows stopped before the deadline")
	}
	if len(samples[0].rtts) <= o.count || samples[1].rtts != nil || samples[1].msgs <= o.count || samples[2].msgs <= o.count {
		t.Errorf("pingpong flow %d rtts, stream flows %d rtts and %d, %d msgs; want more than %d, 0, more than %d",
			len(samples[0].rtts), len(samples[1].rtts), samples[1].msgs, samples[2].msgs, o.count, o.count)
	}
	for _, c := range conns {
		c.Close()
	}
	for range conns {
		if err := <-served; err != nil {
			t.Errorf("server: %v", err)
		}
	}
}

// corruptEcho echoes like echo but flips one bit of the byte at offset n
// of the stream.
func corruptEcho(n int64) func(net.Conn, *options) error {
	return func(c net.Conn, _ *options) error {
		buf := make([]byte, defaultReadBuf)
		for off := int64(0); ; {
			k, err := c.Read(buf)
			if err != nil {
				return nil
			}
			if off <= n && n < off+int64(k) {
				buf[n-off] ^= 1
			}
			off += int64(k)
			if _, err := c.Write(buf[:k]); err != nil {
				return nil
			}
		}
	}
}

func TestVerifyDetectsCorruption(t *testing.T) {
	o := &options{count: 20, window: 4, verify: true, readBuf: defaultReadBuf}
	for _, name := range []string{"pingpong", "rate"} {
		t.Run(name, func(t *testing.T) {
			m, _ := modeNamed(name)
			cc, sc := net.Pipe()
			defer cc.Close()
			go corruptEcho(10*64+3)(sc, o)
			_, err := m.client(cc, 64, o).measure(time.Now().Add(time.Minute))
			if err == nil || !strings.Contains(err.Error(), "verify: echo 10 differs") {
				t.Errorf("measure = %v, want a verify error for echo 10", err)
			}
		})
	}

	t.Run("stream", func(t *testing.T) {
		cc, sc := net.Pipe()
		defer cc.Close()
		served := make(chan error, 1)
		go func() { served <- sink(sc, o) }()
		var hdr [streamHeader]byte
		binary.LittleEndian.PutUint64(hdr[:], 64)
		msg := append([]byte(nil), newPattern(64).at(0, 64)...)
		msg[5] ^= 1
		cc.Write(hdr[:])
		cc.Write(msg)
		if err := <-served; err == nil || !strings.Contains(err.Error(), "verify: bytes 0..64 differ") {
			t.Errorf("sink = %v, want a verify error", err)
		}
	})
}

func TestStreamChecksAck(t *testing.T) {
	cc, sc := net.Pipe()
	defer cc.Close()
	go func() { // acknowledges one byte too few
		var hdr [streamHeader]byte
		var total uint64
		for {
			if _, err := io.ReadFull(sc, hdr[:]); err != nil {
				return
			}
			n := binary.LittleEndian.Uint64(hdr[:])
			if n == 0 {
				binary.LittleEndian.PutUint64(hdr[:], total-1)
				sc.Write(hdr[:])
				continue
			}
			io.CopyN(io.Discard, sc, int64(n))
			total += n
		}
	}()
	o := &options{count: 3, warmup: 2, readBuf: defaultReadBuf}
	err := newStream(cc, 100, o).warmup()
	if err == nil || !strings.Contains(err.Error(), "server acknowledged 199 bytes, 200 were sent") {
		t.Errorf("warmup = %v, want an ack mismatch", err)
	}
}

// Dial mode dials a fresh connection per sample, exchanges one message on
// it and closes it; a dial error ends the measurement with it.
func TestDialMode(t *testing.T) {
	m, ok := modeNamed("dial")
	if !ok {
		t.Fatal("no dial mode")
	}
	o := &options{count: 20, warmup: 1000, verify: true, readBuf: defaultReadBuf}
	var served sync.WaitGroup
	dials := 0
	dial := func() (net.Conn, error) {
		dials++
		cc, sc := net.Pipe()
		served.Go(func() {
			if err := m.serve(sc, o); err != nil {
				t.Errorf("server: %v", err)
			}
		})
		return cc, nil
	}
	c := m.dialer(dial, 64, o)
	if err := c.warmup(); err != nil {
		t.Fatalf("warmup: %v", err)
	}
	if dials != dialWarmup {
		t.Errorf("warm-up dialled %d times, want %d", dials, dialWarmup)
	}
	s, err := c.measure(time.Now().Add(time.Minute))
	if err != nil {
		t.Fatalf("measure: %v", err)
	}
	if s.msgs != o.count || len(s.rtts) != o.count || dials != dialWarmup+o.count {
		t.Errorf("measured %d dials (%d times), dialled %d; want %d", s.msgs, len(s.rtts), dials, o.count)
	}
	served.Wait()

	refused := errors.New("refused")
	_, err = m.dialer(func() (net.Conn, error) { return nil, refused }, 64, o).measure(time.Now().Add(time.Minute))
	if !errors.Is(err, refused) {
		t.Errorf("measure with a failing dial = %v, want it", err)
	}
}
