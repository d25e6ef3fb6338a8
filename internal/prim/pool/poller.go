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
// transport endpoint's spinner serves all its units, while the waiting
// goroutines stay parked and hold no P. ntproxy's shared-pool legs each
// wait on their own slot; spinning each on its own they took turns on
// ntproxy's P, one poll round apiece, and each round gave the CPU away
// (proc.Yield) once per waiter, so a leg whose bytes had come waited for
// every other leg's turn. A wait whose spin runs out unserved sleeps on
// its slot's futex as before; the poller stops once no wait is left, so
// an idle process spins no longer than its waits' budgets (invariant 6).
//
// The poller counts as one spinner of the process (spingate), asked again
// every few rounds: refused, it ends every wait's spin and stops.
type Poller struct {
	mu sync.Mutex
	// mu protects the following fields.
	waits   []*pollWait
	running bool // run is polling
}

// pollWait is one Wait's spin through a Poller.
type pollWait struct {
	s     *Slot
	ev    int
	seen  uint32
	ready func() bool
	until time.Time
	done  chan bool // receives once: served (true) or the spin ran out
}

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
	start := !p.running
	p.running = true
	p.mu.Unlock()
	if start {
		go p.run()
	}
	return <-w.done
}

// run polls the registered waits until none is left.
func (p *Poller) run() {
	granted := spingate.Enter(time.Nanosecond) > 0 // any grant: run asks again every pollYield rounds
	for round := 1; ; round++ {
		check := round%pollYield == 0
		var now time.Time
		if check {
			now = time.Now()
		}
		p.mu.Lock()
		served := false
		for i := 0; i < len(p.waits); {
			w := p.waits[i]
			ok := granted && (w.ready() || w.s.hdr.Load32(w.ev) != w.seen)
			if ok || !granted || check && now.After(w.until) {
				w.done <- ok
				last := len(p.waits) - 1
				p.waits[i], p.waits[last] = p.waits[last], nil
				p.waits = p.waits[:last]
				served = served || ok
				continue
			}
			i++
		}
		if len(p.waits) == 0 {
			p.running = false
			p.mu.Unlock()
			if granted {
				spingate.Leave()
			}
			return
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
		case served:
			runtime.Gosched() // a served wait runs at once, on this P if need be
		}
	}
}
