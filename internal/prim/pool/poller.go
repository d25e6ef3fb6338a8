package pool

import (
	"runtime"
	"sync"
	"time"

	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/prim/spingate"
)

// Poller spins for the waits of many slots at once: one goroutine polls
// every wait registered with it and hands each back as it is served, as a
// transport endpoint's spinner serves all its units, while the other
// waiting goroutines stay parked and hold no P. The polling goroutine is
// a waiter itself — the first to come while nobody polls — so a lone wait
// spins as it would on its own; served, it hands the polling on to a wait
// still registered. ntproxy's shared-pool legs each wait on their own
// slot; spinning each on its own they took turns on ntproxy's P, one poll
// round apiece, and each round gave the CPU away (proc.Yield) once per
// waiter, so a leg whose bytes had come waited for every other leg's
// turn. A wait whose spin runs out unserved sleeps on its slot's futex as
// before; with no wait left nobody polls, so an idle process spins no
// longer than its waits' budgets (invariant 6).
//
// The polling counts as one spinner of the process (spingate), asked
// again every few rounds: refused, it ends every wait's spin.
type Poller struct {
	mu sync.Mutex
	// mu protects the following fields.
	waits   []*pollWait
	polling bool // a waiter runs poll
}

// pollWait is one Wait's spin through a Poller.
type pollWait struct {
	s     *Slot
	ev    int
	seen  uint32
	ready func() bool
	until time.Time
	done  chan pollEnd // receives once: how the wait ended, or that it polls now
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

// pollYield is how many rounds the poller polls between yields: the
// spin of a lone Wait polls 16 times between them.
const pollYield = 16

// wait registers w and reports whether it was served before its spin ran
// out.
func (p *Poller) wait(w *pollWait) bool {
	p.mu.Lock()
	p.waits = append(p.waits, w)
	end := ranOut
	if !p.polling {
		p.polling = true
		end = takeOver
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

// poll polls the registered waits, among them self's, until self's ends;
// it then hands the polling on to a wait left, if any, and reports
// whether self was served.
func (p *Poller) poll(self *pollWait) bool {
	granted := spingate.Enter(time.Nanosecond) > 0 // any grant: poll asks again every pollYield rounds
	for round := 1; ; round++ {
		check := round%pollYield == 0
		var now time.Time
		if check {
			now = time.Now()
		}
		p.mu.Lock()
		mine, others := ranOut, false
		for i := 0; i < len(p.waits); {
			w := p.waits[i]
			ok := granted && (w.ready() || w.s.hdr.Load32(w.ev) != w.seen)
			if !ok && granted && (!check || !now.After(w.until)) {
				i++
				continue
			}
			end := ranOut
			if ok {
				end = served
			}
			if w == self {
				mine = end
			} else {
				w.done <- end
				others = others || ok
			}
			last := len(p.waits) - 1
			p.waits[i], p.waits[last] = p.waits[last], nil
			p.waits = p.waits[:last]
			if w == self {
				self = nil // ended: not in the list any more
			}
		}
		if self == nil {
			if len(p.waits) > 0 {
				p.waits[0].done <- takeOver
			} else {
				p.polling = false
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
