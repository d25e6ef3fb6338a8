// Package pool is the shared buffer pool of ntproxy's shared-pool mode:
// memory an application shares with its host's ntproxy (one memfd per
// attachment), cut into slots, one per connection. A slot holds two byte
// rings — out (application → ntproxy) and in (ntproxy → application) —
// and the words that say how far each side has got. The application
// writes a payload into the out ring once; ntproxy sends it onto the rack
// link straight from there and keeps it there until the far end has
// acknowledged it (so a leg moving between transports resends from the
// ring), and it reads what arrives straight into the in ring, from which
// the application reads. Against proxy mode — where each byte also crosses
// a memory link and the leg's own buffers — that is two copies fewer per
// direction and no thread hand-off inside either proxy.
//
// Slot layout (the header is a page; words little-endian, each on a cache
// line of its own; "app" and "proxy" say which side writes it):
//
//	off    size  writer  field
//	  64      8  app     out head: bytes written into out
//	 128      8  proxy   out tail: bytes of out the far end acknowledged (free again)
//	 192      8  proxy   in head: bytes written into in
//	 256      8  app     in tail: bytes of in the application has read
//	 320      4  app     application flags: FlagFin (no more writes), FlagClosed,
//	                     FlagAbort
//	 384      4  proxy   proxy flags: FlagFin (the far end finished), FlagReset
//	 448      4  both    application wake-up counter (futex word)
//	 452      4  both    application sleeping (1 while it may sleep on the counter)
//	 512      4  both    proxy wake-up counter (futex word)
//	 516      4  both    proxy sleeping
//	 576      8  proxy   in tail wanted: the application notifies the proxy of
//	                     an in tail only once it reaches this (0: always)
//	4096   ring  app     out ring: byte n of the stream at 4096 + n mod ring
//	4096+ring ring proxy in ring
//
// A ring of R bytes holds head−tail ≤ R bytes; a writer waits for the
// tail, a reader for the head. The proxy acts on the in tail only at
// points it names in advance (an acknowledgement due, a FIN to pass on):
// a read notifies it only once its tail reaches the in tail wanted, so a
// request/response connection wakes its proxy once a request, for the
// request's bytes, not a second time for the response's tail.
//
// Flags only gain bits, and each side ignores the bits it does not know,
// so a bit added later comes with those an older peer acts on instead:
// FlagAbort is set with FlagFin and FlagClosed, which an ntproxy that
// does not know it takes for a close (the far end reads io.EOF).
//
// Sleeping is Dekker-style: a side that runs out of work reads its
// counter, sets its sleeping word, checks once more and sleeps on the
// counter (futex); the other side, after every store that could matter,
// bumps the counter and wakes it if the sleeping word is set. Both sides'
// stores and loads are sequentially consistent atomics, so a wake-up is
// never lost.
//
// Ownership: ntproxy grants a zeroed slot; it takes the slot back (and
// zeroes it) only once its connection has ended on its side and the
// application has set FlagClosed — or has gone — so a slot is never reused
// under an application that still holds it.
//
// Trust: each side reads words the other writes. Every index read from
// the slot is checked (a head behind what was seen, or more than R ahead
// of the tail, is a protocol error), so a misbehaving application can
// corrupt only its own streams, never ntproxy.
//
// Concurrency: a Slot's methods are safe for concurrent use; each word has
// one writer per side as above, and its callers serialise their own side's
// reads and writes of a ring.
package pool

import (
	"fmt"
	"runtime"
	"time"

	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/prim/shmem"
	"github.com/ntstack/ntstack/internal/prim/spingate"
)

// Header words.
const (
	HeaderSize = 4096

	offOutHead    = 64
	offOutTail    = 128
	offInHead     = 192
	offInTail     = 256
	offAppFlags   = 320
	offProxyFlags = 384
	offAppEv      = 448
	offAppSleep   = 452
	offProxyEv    = 512
	offProxySleep = 516
	offInWant     = 576
)

// Flags, application's and proxy's.
const (
	FlagFin    uint32 = 1 // the writer of this side is done: EOF after the last byte
	FlagClosed uint32 = 2 // application: closed, nothing more will be read
	FlagReset  uint32 = 4 // proxy: the connection ended abnormally
	FlagAbort  uint32 = 8 // application: closed as a reset (with FlagFin and FlagClosed): a reset, not a FIN, after the last byte
)

// Spin budgets: a waiter spins BusySpin instead of its usual budget when
// its connection moved within BusyWindow (a parked side costs a
// cross-process wake-up at both ends of a gap between records; an idle
// connection keeps the short budget) — unless its last wait outlasted
// BusySpin (Wait's report): a request a millisecond sleeps however long
// its waiter spins, and the longer spin only burns the CPU. socklike's
// spinners use the same two and the same rule (Conn.sporadic).
const (
	BusySpin   = 500 * time.Microsecond
	BusyWindow = time.Millisecond
)

// Spin is the budget of a waiter with usual budget spin whose connection
// last moved at last (Unix nanoseconds) and whose last wait outlasted
// BusySpin if sporadic.
func Spin(spin time.Duration, last int64, sporadic bool) time.Duration {
	if !sporadic && time.Now().UnixNano()-last < int64(BusyWindow) {
		return max(spin, BusySpin)
	}
	return spin
}

// Ring sizes: a power of two from MinRing to MaxRing.
const (
	MinRing = 4 << 10
	MaxRing = 64 << 20
	// MaxSlots bounds a pool.
	MaxSlots = 4096
)

// Side names the application's or the proxy's end of a slot.
type Side int

const (
	App Side = iota
	Proxy
)

// SlotSize is the bytes of one slot with rings of ring bytes.
func SlotSize(ring int) int { return HeaderSize + 2*ring }

// CheckGeometry validates a pool's shape as announced by the other side.
func CheckGeometry(slots, ring int) error {
	if ring < MinRing || ring > MaxRing || ring&(ring-1) != 0 {
		return fmt.Errorf("pool ring of %d bytes: want a power of two in %d..%d", ring, MinRing, MaxRing)
	}
	if slots < 1 || slots > MaxSlots {
		return fmt.Errorf("pool of %d slots: want 1..%d", slots, MaxSlots)
	}
	return nil
}

// Slot is one connection's part of a pool. Out and In are the rings'
// memory; the slot's indices say which bytes of them are whose.
type Slot struct {
	hdr     shmem.Mem
	Out, In []byte
	poller  *Poller // spins for this side's waits, with other slots' (nil: each wait spins itself)
}

// NewSlot returns the slot of rings of ring bytes (a power of two from
// MinRing to MaxRing, so that SlotSize cannot overflow) at the start of
// mem (at least SlotSize(ring) bytes, 8-byte aligned).
func NewSlot(mem []byte, ring int) (*Slot, error) {
	if ring < MinRing || ring > MaxRing || ring&(ring-1) != 0 || len(mem) < SlotSize(ring) || !shmem.Aligned8(mem) {
		return nil, fmt.Errorf("pool slot: %d bytes for rings of %d", len(mem), ring)
	}
	return &Slot{
		hdr: shmem.Mem(mem[:HeaderSize]),
		Out: mem[HeaderSize : HeaderSize+ring : HeaderSize+ring],
		In:  mem[HeaderSize+ring : HeaderSize+2*ring : HeaderSize+2*ring],
	}, nil
}

// Ring is the size of each of the slot's rings.
func (s *Slot) Ring() int { return len(s.Out) }

func (s *Slot) OutHead() uint64        { return s.hdr.Load64(offOutHead) }
func (s *Slot) SetOutHead(v uint64)    { s.hdr.Store64(offOutHead, v) }
func (s *Slot) OutTail() uint64        { return s.hdr.Load64(offOutTail) }
func (s *Slot) SetOutTail(v uint64)    { s.hdr.Store64(offOutTail, v) }
func (s *Slot) InHead() uint64         { return s.hdr.Load64(offInHead) }
func (s *Slot) SetInHead(v uint64)     { s.hdr.Store64(offInHead, v) }
func (s *Slot) InTail() uint64         { return s.hdr.Load64(offInTail) }
func (s *Slot) SetInTail(v uint64)     { s.hdr.Store64(offInTail, v) }
func (s *Slot) InWant() uint64         { return s.hdr.Load64(offInWant) }
func (s *Slot) SetInWant(v uint64)     { s.hdr.Store64(offInWant, v) }
func (s *Slot) AppFlags() uint32       { return s.hdr.Load32(offAppFlags) }
func (s *Slot) ProxyFlags() uint32     { return s.hdr.Load32(offProxyFlags) }
func (s *Slot) flagsOff(side Side) int { return [2]int{offAppFlags, offProxyFlags}[side] }

// SetFlags adds f to side's flags; only side calls it, one goroutine at a
// time.
func (s *Slot) SetFlags(side Side, f uint32) {
	off := s.flagsOff(side)
	s.hdr.Store32(off, s.hdr.Load32(off)|f)
}

func evOffs(side Side) (ev, sleep int) {
	if side == App {
		return offAppEv, offAppSleep
	}
	return offProxyEv, offProxySleep
}

// Notify wakes side if it sleeps (or is about to): call it after every
// store side may be waiting for.
func (s *Slot) Notify(side Side) {
	_, sleep := evOffs(side)
	if s.hdr.Load32(sleep) != 0 {
		s.hdr.Store32(sleep, 0)
		s.Kick(side)
	}
}

// Kick wakes side whether or not it sleeps: for a change it does not see
// in the slot (its own connection closed, a deadline moved).
func (s *Slot) Kick(side Side) {
	ev, _ := evOffs(side)
	s.hdr.Store32(ev, s.hdr.Load32(ev)+1)
	s.hdr.Wake32(ev)
}

// spinFor polls ready and the event word ev (seen: its value before) for
// up to spin from start, giving up the CPU between checks; it reports
// whether the wait is over.
func (s *Slot) spinFor(ready func() bool, ev int, seen uint32, start time.Time, spin time.Duration) bool {
	for i := 0; ; i++ {
		if ready() || s.hdr.Load32(ev) != seen {
			return true
		}
		if i&15 == 15 {
			if time.Since(start) > spin {
				return false
			}
			// Sweep wakes the waiters the runtime's poller would
			// (spingate.OnSweep); Gosched lets in this process's
			// goroutines (ntproxy's sender, to which the caller may just
			// have handed bytes); Yield another process waiting for the
			// CPU.
			spingate.Sweep()
			runtime.Gosched()
			proc.Yield()
		}
	}
}

// spin spins for up to spin as one of the process's spinners (spingate:
// in a process that also waits on sockets it may be cut short or
// refused) and reports whether the wait is over.
func (s *Slot) spin(ready func() bool, ev int, seen uint32, start time.Time, spin time.Duration) bool {
	if spin = spingate.Enter(spin); spin <= 0 {
		return false
	}
	defer spingate.Leave()
	return s.spinFor(ready, ev, seen, start, spin)
}

// Wait waits, as side, until ready reports true, side is kicked or
// notified, or deadline passes (the zero time: no deadline); the caller
// then checks its state again. It spins for up to spin first, giving up
// the CPU between checks (a peer sharing it runs at once), then sleeps.
// On a slot that polls with a Poller the poller spins for it meanwhile,
// and the caller stays parked.
//
// The sleep is a futex wait in the calling goroutine that gives up its
// thread's P first (proc.BlockingSyscall6), and waking from it costs a
// system call on each side. Callers therefore spin longer while their
// connection is busy (BusySpin). Waking
// through an eventfd read by the runtime's poller instead was tried: it
// holds no P, but the poller is consulted only when no goroutine is
// runnable, and ntproxy's spinners always are — 64 B round trips took
// ~490 µs instead of ~13.
//
// It reports whether it slept and the whole wait outlasted BusySpin: a
// spin of BusySpin would not have bridged it (see Spin).
func (s *Slot) Wait(side Side, ready func() bool, spin time.Duration, deadline time.Time) (long bool) {
	ev, sleep := evOffs(side)
	seen := s.hdr.Load32(ev)
	start := time.Now()
	switch {
	case spin <= 0:
	case s.poller != nil && s.poller.trySolo():
		done := s.spin(ready, ev, seen, start, spin)
		s.poller.endSolo()
		if done {
			return false
		}
	case s.poller != nil:
		// The poller spins for this wait beside its others.
		if s.poller.wait(&pollWait{s: s, ev: ev, seen: seen, ready: ready, until: start.Add(spin), done: make(chan pollEnd, 1)}) {
			return false
		}
	case s.spin(ready, ev, seen, start, spin):
		return false
	}
	// The sleep gives up this thread's P, waking another thread for the
	// process's runnable goroutines: let them run here first.
	runtime.Gosched()
	seen = s.hdr.Load32(ev)
	s.hdr.Store32(sleep, 1)
	if ready() {
		return false
	}
	var timeout time.Duration
	if !deadline.IsZero() {
		if timeout = time.Until(deadline); timeout <= 0 {
			return false
		}
	}
	s.hdr.Wait32(ev, seen, timeout)
	return time.Since(start) > BusySpin
}
