package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"sync"
	"time"

	"github.com/ntstack/ntstack/qos"
)

// A mode is one traffic pattern: what each client connection does, and what
// the server does with each connection it accepts.
type mode struct {
	name   string
	serve  func(c net.Conn, o *options) error
	client func(c net.Conn, size int, o *options) client
	// dialer, set instead of client, is a client that dials connections
	// of its own (dial mode).
	dialer func(dial func() (net.Conn, error), size int, o *options) client
}

// modes lists the modes in the order -h names them.
var modes = []mode{
	{"pingpong", echo, newPingpong, nil},
	{"stream", sink, newStream, nil},
	{"rate", echo, newRate, nil},
	{"mixed", mixedServe, nil, nil}, // clients: see mixedClients
	{"dial", echo, nil, newDialing},
}

// Dial mode: each client dials a fresh connection, exchanges one
// size-byte message and its echo (untimed: the connection works and the
// server took it), and closes it, one after the other; the time of each
// dial, until it returned a connection, is the sample.

// dialWarmup bounds the warm-up dials: a dial may set up a link of its
// own (direct mode), and -warmup is meant for messages.
const dialWarmup = 10

type dialing struct {
	dial func() (net.Conn, error)
	o    *options
	msg  []byte
	buf  []byte
	n    int
}

func newDialing(dial func() (net.Conn, error), size int, o *options) client {
	return &dialing{dial: dial, o: o, msg: newPattern(size).at(0, size), buf: make([]byte, size)}
}

// once dials, exchanges one message and closes, and returns how long the
// dial took.
func (d *dialing) once() (time.Duration, error) {
	start := time.Now()
	c, err := d.dial()
	took := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("dial %d: %w", d.n, err)
	}
	defer c.Close()
	d.n++
	if _, err := c.Write(d.msg); err != nil {
		return 0, fmt.Errorf("dial %d: write: %w", d.n-1, err)
	}
	if _, err := io.ReadFull(c, d.buf); err != nil {
		return 0, fmt.Errorf("dial %d: read echo: %w", d.n-1, err)
	}
	if d.o.verify && !bytes.Equal(d.buf, d.msg) {
		return 0, fmt.Errorf("verify: echo on dial %d differs from the message sent", d.n-1)
	}
	return took, c.Close()
}

func (d *dialing) warmup() error {
	for range min(d.o.warmup, dialWarmup) {
		if _, err := d.once(); err != nil {
			return err
		}
	}
	return nil
}

func (d *dialing) measure(deadline time.Time) (sample, error) {
	rtts := newRTTs(d.o.count)
	for len(rtts) < d.o.count && time.Now().Before(deadline) {
		took, err := d.once()
		if err != nil {
			return sample{}, err
		}
		rtts = append(rtts, took)
		if d.o.gap > 0 {
			time.Sleep(d.o.gap) // untimed: what a dial leaves behind settles
		}
	}
	return sample{rtts: rtts, msgs: len(rtts)}, nil
}

// Mixed mode: the first byte of a connection says what it carries.
const (
	flowLatency = 'L'
	flowBulk    = 'B'
	mixedRRSize = 64
)

// mixedServe echoes a latency flow and sinks a bulk flow; with socklike it
// also sets the flow's class, as the client does on its side.
func mixedServe(c net.Conn, o *options) error {
	var kind [1]byte
	if _, err := io.ReadFull(c, kind[:]); errors.Is(err, io.EOF) {
		return nil // closed before it said (an -idle connection)
	} else if err != nil {
		return fmt.Errorf("mixed: read flow kind: %w", err)
	}
	class := 0
	if kind[0] == flowBulk {
		class = o.priority
	}
	if p, ok := c.(interface{ SetPriority(qos.Class) error }); ok {
		if err := p.SetPriority(qos.Class(class)); err != nil && !errors.Is(err, errors.ErrUnsupported) { // shared-pool mode: class fixed at the dial
			return err
		}
	}
	switch kind[0] {
	case flowLatency:
		return echo(c, o)
	case flowBulk:
		return sink(c, o)
	}
	return fmt.Errorf("mixed: unknown flow kind %q", kind[0])
}

// mixedClients makes connection 0 the 64 B pingpong flow at class 0 and the
// others size-byte streams. Every flow runs until the deadline, -count
// aside: the pingpong flow, stopped after its 100,000 round trips (a
// tenth of a second), left the bulk flows alone for the rest, and their
// row read as if beside it (14.1 GB/s beside a 64 B flow on the Intel VM,
// ~0.4 GB/s on the AMD VM while the flow ran).
func mixedClients(conns []net.Conn, size int, o *options) ([]client, error) {
	untilDeadline := new(options)
	*untilDeadline = *o
	untilDeadline.count = math.MaxInt
	o = untilDeadline
	clients := make([]client, len(conns))
	for i, c := range conns {
		kind := byte(flowBulk)
		if i == 0 {
			kind = flowLatency
			if p, ok := c.(interface{ SetPriority(qos.Class) error }); ok {
				if err := p.SetPriority(0); err != nil && !errors.Is(err, errors.ErrUnsupported) {
					return nil, err
				}
			}
		}
		if _, err := c.Write([]byte{kind}); err != nil {
			return nil, fmt.Errorf("write flow kind: %w", err)
		}
		if i == 0 {
			clients[i] = newPingpong(c, mixedRRSize, o)
		} else {
			clients[i] = newStream(c, size, o)
		}
	}
	return clients, nil
}

// modeNamed returns the mode called name.
func modeNamed(name string) (mode, bool) {
	for _, m := range modes {
		if m.name == name {
			return m, true
		}
	}
	return mode{}, false
}

// A client drives one connection. warmup runs -warmup unmeasured messages;
// measure then runs until -count messages or the deadline, whichever comes
// first. The two are called once each, in that order, from one goroutine.
type client interface {
	warmup() error
	measure(deadline time.Time) (sample, error)
}

// newRTTs returns an empty slice for count round-trip times, allocated up
// front (up to 8 MiB) so that measuring does not allocate.
func newRTTs(count int) []time.Duration {
	return make([]time.Duration, 0, min(count, 1<<20))
}

// sample is what one connection measured.
type sample struct {
	msgs int             // messages (round trips for pingpong and rate)
	rtts []time.Duration // round-trip times; nil for stream
}

// Payloads come from a fixed pseudo-random byte stream: byte i of a
// connection's stream is pattern[i % patternPeriod]. The period is prime,
// so no power-of-two message size lines up with it and a duplicated,
// dropped or reordered message shows up as a mismatch under -verify.
const (
	patternPeriod = 65521
	patternSeed   = 0x6e7462656e6368 // "ntbench"
)

// pattern holds one period of the payload stream plus enough of the next
// to hand out any message as one slice.
type pattern []byte

// patterns holds the patterns made so far, by maxMsg.
var patterns sync.Map

// newPattern returns a pattern able to hand out messages of up to maxMsg
// bytes. Connections share it: with a copy each, 64 connections' sources
// alone (64 × 128 KiB for 64 KiB messages) outgrew the CPU caches, and the
// stream figures measured memory rather than the transport.
func newPattern(maxMsg int) pattern {
	if p, ok := patterns.Load(maxMsg); ok {
		return p.(pattern)
	}
	p := make(pattern, patternPeriod+maxMsg)
	rng := rand.New(rand.NewPCG(patternSeed, patternSeed))
	for i := range patternPeriod {
		p[i] = byte(rng.Uint32())
	}
	for i := patternPeriod; i < len(p); i++ {
		p[i] = p[i-patternPeriod]
	}
	q, _ := patterns.LoadOrStore(maxMsg, p)
	return q.(pattern)
}

// at returns the n bytes of the stream starting at offset off. n must not
// exceed the pattern's maxMsg. The slice is shared and read-only.
func (p pattern) at(off int64, n int) []byte {
	i := int(off % patternPeriod)
	return p[i : i+n]
}

// matches reports whether b equals the stream starting at offset off.
func (p pattern) matches(off int64, b []byte) bool {
	for len(b) > 0 {
		i := int(off % patternPeriod)
		n := min(len(b), len(p)-i)
		if !bytes.Equal(b[:n], p[i:i+n]) {
			return false
		}
		b, off = b[n:], off+int64(n)
	}
	return true
}

// defaultReadBuf is the server's read buffer per connection (-readbuf):
// large enough that a 64 KiB message or several small ones move in one
// read.
const defaultReadBuf = 256 << 10

// echo writes back everything it reads, until end of stream.
func echo(c net.Conn, o *options) error {
	buf := make([]byte, o.readBuf)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			if _, err := c.Write(buf[:n]); err != nil {
				return fmt.Errorf("echo: %w", err)
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("echo: %w", err)
		}
	}
}

// The stream framing: the client sends chunks, each an 8-byte
// little-endian payload length followed by that many payload bytes. A
// zero-length chunk asks the server to reply with the 8-byte total of
// payload bytes it has received so far; the client uses it to end warm-up
// and measurement. A chunk carries up to streamChunk bytes of messages so
// the client can check the clock between chunks without a header per
// message.
const (
	streamHeader = 8
	streamChunk  = 1 << 20
)

// sink reads stream chunks, discarding their payload (or checking it under
// -verify), and acknowledges byte counts, until end of stream.
func sink(c net.Conn, o *options) error {
	var pat pattern
	if o.verify {
		pat = newPattern(0)
	}
	buf := make([]byte, o.readBuf)
	var hdr [streamHeader]byte
	var total int64
	for {
		if _, err := io.ReadFull(c, hdr[:]); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return fmt.Errorf("sink: read chunk header: %w", err)
		}
		n := int64(binary.LittleEndian.Uint64(hdr[:]))
		if n == 0 {
			binary.LittleEndian.PutUint64(hdr[:], uint64(total))
			if _, err := c.Write(hdr[:]); err != nil {
				return fmt.Errorf("sink: write ack: %w", err)
			}
			continue
		}
		for n > 0 {
			b := buf[:min(n, int64(len(buf)))]
			if _, err := io.ReadFull(c, b); err != nil {
				return fmt.Errorf("sink: read payload: %w", err)
			}
			if o.verify && !pat.matches(total, b) {
				return fmt.Errorf("sink: verify: bytes %d..%d differ from what the client sends", total, total+int64(len(b)))
			}
			total += int64(len(b))
			n -= int64(len(b))
		}
	}
}

// pingpong writes a message, reads its echo, and times the pair.
type pingpong struct {
	c    net.Conn
	o    *options
	size int
	pat  pattern
	buf  []byte
	seq  int64 // messages sent so far
}

func newPingpong(c net.Conn, size int, o *options) client {
	return &pingpong{c: c, o: o, size: size, pat: newPattern(size), buf: make([]byte, size)}
}

// concurrentAbove: a message larger than this is written while its echo is
// read. Written whole first, it would deadlock on transports whose buffers
// hold less than two messages (Unix sockets at 1 MiB): the server's echo
// blocks on a full socket while the client still writes.
const concurrentAbove = 64 << 10

func (p *pingpong) roundTrip() error {
	msg := p.pat.at(p.seq*int64(p.size), p.size)
	p.seq++
	if len(msg) > concurrentAbove {
		werr := make(chan error, 1)
		go func() { _, err := p.c.Write(msg); werr <- err }()
		_, err := io.ReadFull(p.c, p.buf)
		if e := <-werr; e != nil {
			return fmt.Errorf("write message %d: %w", p.seq-1, e)
		}
		if err != nil {
			return fmt.Errorf("read echo %d: %w", p.seq-1, err)
		}
	} else {
		if _, err := p.c.Write(msg); err != nil {
			return fmt.Errorf("write message %d: %w", p.seq-1, err)
		}
		if _, err := io.ReadFull(p.c, p.buf); err != nil {
			return fmt.Errorf("read echo %d: %w", p.seq-1, err)
		}
	}
	if p.o.verify && !bytes.Equal(p.buf, msg) {
		return fmt.Errorf("verify: echo %d differs from the message sent", p.seq-1)
	}
	return nil
}

func (p *pingpong) warmup() error {
	for range p.o.warmup {
		if err := p.roundTrip(); err != nil {
			return err
		}
	}
	return nil
}

func (p *pingpong) measure(deadline time.Time) (sample, error) {
	rtts := newRTTs(p.o.count)
	for len(rtts) < p.o.count {
		start := time.Now()
		if start.After(deadline) {
			break
		}
		if err := p.roundTrip(); err != nil {
			return sample{}, err
		}
		rtts = append(rtts, time.Since(start))
		if p.o.gap > 0 {
			time.Sleep(p.o.gap)
		}
	}
	return sample{msgs: len(rtts), rtts: rtts}, nil
}

// stream writes messages back to back in chunks (see sink).
type stream struct {
	c    net.Conn
	o    *options
	size int
	pat  pattern
	sent int64 // payload bytes written so far
}

func newStream(c net.Conn, size int, o *options) client {
	return &stream{c: c, o: o, size: size, pat: newPattern(size)}
}

// send writes up to n messages, stopping early once the deadline has
// passed (checked between chunks; zero means none), and returns how many
// it wrote.
func (s *stream) send(n int, deadline time.Time) (int, error) {
	var hdr [streamHeader]byte
	perChunk := max(1, streamChunk/s.size)
	sent := 0
	for sent < n && (deadline.IsZero() || time.Now().Before(deadline)) {
		k := min(perChunk, n-sent)
		binary.LittleEndian.PutUint64(hdr[:], uint64(k*s.size))
		if _, err := s.c.Write(hdr[:]); err != nil {
			return sent, fmt.Errorf("write chunk header: %w", err)
		}
		for range k {
			if _, err := s.c.Write(s.pat.at(s.sent, s.size)); err != nil {
				return sent, fmt.Errorf("write message: %w", err)
			}
			s.sent += int64(s.size)
		}
		sent += k
	}
	return sent, nil
}

// sync waits until the server has received everything sent so far.
func (s *stream) sync() error {
	var hdr [streamHeader]byte
	if _, err := s.c.Write(hdr[:]); err != nil {
		return fmt.Errorf("write sync: %w", err)
	}
	if _, err := io.ReadFull(s.c, hdr[:]); err != nil {
		return fmt.Errorf("read ack: %w", err)
	}
	if got := int64(binary.LittleEndian.Uint64(hdr[:])); got != s.sent {
		return fmt.Errorf("server acknowledged %d bytes, %d were sent", got, s.sent)
	}
	return nil
}

func (s *stream) warmup() error {
	if _, err := s.send(s.o.warmup, time.Time{}); err != nil {
		return err
	}
	return s.sync()
}

func (s *stream) measure(deadline time.Time) (sample, error) {
	n, err := s.send(s.o.count, deadline)
	if err != nil {
		return sample{}, err
	}
	return sample{msgs: n}, s.sync()
}

// rate keeps -window messages in flight: a writer goroutine sends while the
// caller's goroutine reads echoes, and each echo's time counts from just
// before its message was written, queueing included.
type rate struct {
	c    net.Conn
	o    *options
	size int
	pat  pattern
	seq  int64 // messages echoed so far
}

func newRate(c net.Conn, size int, o *options) client {
	return &rate{c: c, o: o, size: size, pat: newPattern(size)}
}

// run sends up to n messages, stopping early once the deadline has passed
// (zero means none), and reads all their echoes. It appends each echo's
// round-trip time to rtts if rtts is not nil. On failure it closes the
// connection, the only way to wake the goroutine blocked on the other
// direction.
func (r *rate) run(n int, deadline time.Time, rtts []time.Duration) (int, []time.Duration, error) {
	var (
		tokens   = make(chan struct{}, r.o.window)  // one per message in flight
		inflight = make(chan time.Time, r.o.window) // send times, in order
		done     = make(chan struct{})
		werr     error // written by runWriter before done closes
		first    = r.seq
	)
	go func() { // runWriter
		defer close(done)
		defer close(inflight)
		for i := range int64(n) {
			tokens <- struct{}{}
			now := time.Now()
			if !deadline.IsZero() && now.After(deadline) {
				return
			}
			inflight <- now
			if _, err := r.c.Write(r.pat.at((first+i)*int64(r.size), r.size)); err != nil {
				werr = fmt.Errorf("write message %d: %w", first+i, err)
				r.c.Close()
				return
			}
		}
	}()

	buf := make([]byte, r.size)
	var rerr error
	for sent := range inflight {
		if rerr == nil {
			if rerr = r.readEcho(buf, sent, &rtts); rerr != nil {
				r.c.Close()
			}
		}
		<-tokens
	}
	<-done
	if err := errors.Join(werr, rerr); err != nil {
		return 0, nil, err
	}
	return int(r.seq - first), rtts, nil
}

// readEcho reads the echo of message r.seq, sent at the given time, and
// appends its round-trip time to *rtts if that is not nil.
func (r *rate) readEcho(buf []byte, sent time.Time, rtts *[]time.Duration) error {
	if _, err := io.ReadFull(r.c, buf); err != nil {
		return fmt.Errorf("read echo %d: %w", r.seq, err)
	}
	if *rtts != nil {
		*rtts = append(*rtts, time.Since(sent))
	}
	if r.o.verify && !r.pat.matches(r.seq*int64(r.size), buf) {
		return fmt.Errorf("verify: echo %d differs from the message sent", r.seq)
	}
	r.seq++
	return nil
}

func (r *rate) warmup() error {
	_, _, err := r.run(r.o.warmup, time.Time{}, nil)
	return err
}

func (r *rate) measure(deadline time.Time) (sample, error) {
	n, rtts, err := r.run(r.o.count, deadline, newRTTs(r.o.count))
	return sample{msgs: n, rtts: rtts}, err
}
