package pool

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/prim/spingate"
)

// Poller spins for the waits of many slots at once: up to GOMAXPROCS of
// the waits registered with it poll all of them, and hand each of the
// others back as it is served, as a transport endpoint's spinners serve
// all its units, while the rest stay parked and hold no P. A polling wait
// is one that came while fewer polled, so waits as few as the Ps spin as
// each would on its own; served, a polling wait hands the polling on to
// a parked one. ntproxy's shared-pool legs each wait on their own slot;
// spinning each on its own they would take turns on ntproxy's P, one poll
// round apiece, each round giving the CPU away (proc.Yield) once per
// waiter, so a leg whose bytes had come would wait for every other leg's
// turn. A wait whose spin runs out unserved sleeps on its slot's futex as
// before; with no wait left nobody polls, so an idle process spins no
// longer than its waits' budgets (invariant 6).
//
// Each polling wait counts as a spinner of the process (spingate), asked
// again every few rounds; refused, it stops polling, and the last to stop
// ends the parked waits' spins.
type Poller struct {
	// solo counts waits that spin on their own slot: a wait that comes
	// while no other wait of the poller spins or is registered spins
	// alone, as it would without a poller, so that a lone connection's
	// round trip pays no registration or hand-off.
	solo atomic.Int32

	mu sync.Mutex
	// mu protects the following fields, and pollWait.polling.
	waits   []*pollWait
	polling int // waits that run poll
}

// pollWait is one Wait's spin through a Poller.
type pollWait struct {
	s       *Slot
	ev      int
	seen    uint32
	ready   func() bool
	until   time.Time
	done    chan pollEnd // receives once: how the wait ended, or that it polls now
	polling bool         // it runs poll, and ends its wait itself
}

type pollEnd int8

const (
	ranOut pollEnd = iota // the spin ran out unserved
	served
	takeOver // the polling is this wait's now
)

// NewPoller returns a poller with no waits.
func NewPoller() *Poller { return &Poller{} }

// Poll has s's waits spin through p (before any wait).
func (s *Slot) Poll(p *Poller) { s.poller = p }

// trySolo reports whether the caller may spin alone (no other wait
// spins or is registered); if so it must call endSolo when it stops.
func (p *Poller) trySolo() bool {
	if !p.solo.CompareAndSwap(0, 1) {
		return false
	}
	p.mu.Lock()
	busy := len(p.waits) > 0
	p.mu.Unlock()
	if busy {
		p.solo.Store(0)
		return false
	}
	return true
}

func (p *Poller) endSolo() { p.solo.Store(0) }

// pollYield is how many rounds a polling wait polls between yields: the
// spin of a lone Wait polls 16 times between them.
const pollYield = 16

// wait registers w and reports whether it was served before its spin ran
// out.
func (p *Poller) wait(w *pollWait) bool {
	p.mu.Lock()
	p.waits = append(p.waits, w)
	end := takeOver
	if p.polling < spingate.Procs() { // GOMAXPROCS, cached
		p.polling++
		w.polling = true
	} else {
		end = ranOut // until told
	}
	p.mu.Unlock()
	if end != takeOver {
		end = <-w.done
	}
	if end == takeOver {
		return p.poll(w)
	}
	return end == served
}

// remove drops waits[i] (mu held).
func (p *Poller) remove(i int) {
	last := len(p.waits) - 1
	p.waits[i], p.waits[last] = p.waits[last], nil
	p.waits = p.waits[:last]
}

// poll polls the registered waits, self's and the parked ones, until
// self's ends; it then hands the polling on to a parked wait, if any, and
// reports whether self was served.
func (p *Poller) poll(self *pollWait) bool {
	granted := spingate.Enter(time.Nanosecond) > 0 // any grant: poll asks again every pollYield rounds
	for round := 1; ; round++ {
		check := round%pollYield == 0
		var now time.Time
		if check {
			now = time.Now()
		}
		p.mu.Lock()
		// Refused, the last polling wait ends every parked wait's spin.
		dropAll := !granted && p.polling == 1
		mine, ended, others := ranOut, false, false
		for i := 0; i < len(p.waits); {
			w := p.waits[i]
			if w.polling && w != self {
				i++ // its own poll ends it
				continue
			}
			ok := granted && (w.ready() || w.s.hdr.Load32(w.ev) != w.seen)
			expired := check && now.After(w.until) || !granted && (w == self || dropAll)
			if !ok && !expired {
				i++
				continue
			}
			end := ranOut
			if ok {
				end = served
			}
			p.remove(i)
			if w == self {
				mine, ended = end, true
			} else {
				w.done <- end
				others = others || ok
			}
		}
		if ended {
			p.polling--
			for _, w := range p.waits {
				if granted && !w.polling { // refused, it leaves the parked waits to the others
					w.polling = true
					p.polling++
					w.done <- takeOver
					break
				}
			}
			p.mu.Unlock()
			if granted {
				spingate.Leave()
			}
			return mine == served
		}
		p.mu.Unlock()
		switch {
		case check:
			// As in spinFor: Sweep wakes the waiters the runtime's
			// poller would; Gosched lets in this process's goroutines
			// (those just served, the sender they hand bytes to);
			// Yield another process waiting for the CPU.
			spingate.Sweep()
			runtime.Gosched()
			proc.Yield()
			spingate.Leave()
			granted = spingate.Enter(time.Nanosecond) > 0
		case others:
			runtime.Gosched() // a served wait runs at once, on this P if need be
		}
	}
}
