package transport

import (
	"runtime"

	"github.com/ntstack/ntstack/internal/prim/deadline"
	"github.com/ntstack/ntstack/internal/prim/pool"
	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/prim/spingate"
)

// spinner runs the spin half of spin-then-park and keeps the endpoint's
// count of spinning goroutines, which tells the poller whether anyone is
// watching the ring.
//
// At most GOMAXPROCS goroutines of an endpoint spin, and in a process that
// also waits on sockets no more than GOMAXPROCS−1 of the whole process
// (spingate, Config.Sockets), so a P stays free for the runtime's poller;
// the others park at once. A spinner polls the rings and serves the units for everybody, and
// wakes parked goroutines through their channels, which costs the runtime
// little: many spinners would only fight for the CPUs and the locks. A
// spinner keeps spinning while the endpoint makes progress, and parks once
// neither it nor the endpoint has moved anything for the spin budget.
type spinner struct {
	ep       *Endpoint
	c        *Conn // the connection whose call spins (nil: an Accept)
	short    bool  // keep SpinBudget: the caller's last wait outlasted busySpin (Conn.sporadic)
	spinning bool
	start    int64 // ep.now() when spinning began
	budget   int64
	iter     int
	handoffs uint64 // ep.handoffs last seen
}

// Under load a gap between records is short and a parked side costs a
// cross-process wake-up (tens of microseconds, more when both CPUs are
// busy) at both ends of the gap: an endpoint that moved records within the
// last busyWindow spins for up to busySpin instead of SpinBudget. An idle
// endpoint keeps the short budget, and so does a connection whose last
// park outlasted busySpin (Conn.sporadic): a request every millisecond
// parks whether its server spins briefly or long, and the longer spin
// costs its CPU for nothing. (Shared-pool connections, socklike's
// poolConn, and ntproxy's side of them wait the same way, pool.Spin.)
const (
	busyWindow = pool.BusyWindow
	busySpin   = pool.BusySpin
)

// spin reports whether to keep polling (true) or park (false).
func (s *spinner) spin() bool {
	ep := s.ep
	if !s.spinning {
		if ep.cfg.SpinBudget <= 0 || int(ep.active.Load()) >= ep.maxSpinners {
			return false
		}
		if n := ep.cfg.SpinConns; n > 0 && s.c != nil && int(s.c.st().live.Load()) > n {
			return false
		}
		start := ep.now()
		want := ep.cfg.SpinBudget
		if !s.short && start-ep.lastProgress(start) < int64(busyWindow) {
			want = max(want, busySpin)
		}
		grant := spingate.Enter(want)
		if grant == 0 {
			return false
		}
		s.spinning = true
		ep.active.Add(1)
		s.start = start
		s.budget = int64(grant)
		s.iter = 0
		s.handoffs = ep.handoffs.Load()
		return true
	}
	s.iter++
	// A goroutine this spinner just handed data or completion to runs only
	// when the spinner yields, on a P they share: yield at once then, not
	// only every Config.SpinYield rounds, or a request/response flow beside a bulk one
	// waits tens of microseconds for each response.
	if h := ep.handoffs.Load(); h != s.handoffs {
		s.handoffs = h
		runtime.Gosched()
	}
	if s.iter%ep.cfg.SpinYield == 0 {
		if now := ep.now(); now-max(s.start, ep.lastProgress(now)) > s.budget {
			return false
		}
		// Sweep wakes this process's waiters whose wake-up the runtime's
		// poller holds (spingate.OnSweep). Gosched lets this process's
		// goroutines in; Yield lets in another process waiting for this
		// CPU — typically the one we wait for.
		// Without it a spinner sharing its CPU with its peer (an application
		// and its ntproxy, four processes on two cores) holds the CPU until
		// the scheduler tick, and every proxied round trip waits for it.
		spingate.Sweep()
		runtime.Gosched()
		proc.Yield()
	}
	return true
}

// stop leaves the spinning state; if that leaves parked goroutines or a
// pending Accept with nobody polling, the poller takes over (an OPEN
// would otherwise wait for the poller's idle grace to end).
func (s *spinner) stop() {
	if !s.spinning {
		return
	}
	s.spinning = false
	spingate.Leave()
	if s.ep.active.Add(-1) == 0 && (s.ep.parked.Load() > 0 || s.ep.accepting.Load() > 0) {
		s.ep.kickPoller()
	}
}

// park gives up the CPU until notify, the deadline, Close, the end of the
// session or extra; the poller watches the ring meanwhile.
func (c *Conn) park(sp *spinner, notify chan struct{}, dl *deadline.Deadline, extra <-chan struct{}) {
	sp.stop()
	c.ep.parked.Add(1)
	c.sleepers.Add(1)
	c.ep.counters.parks.Add(1)
	if c.ep.active.Load() == 0 {
		// Nobody polls: the poller must. (A spinner kicks it when it
		// stops; kicking it on every park would make it runnable beside
		// the goroutines that do the work, and the scheduler then lets a
		// goroutine that yielded wait for dozens of rounds.)
		c.ep.kickPoller()
	}
	if extra == nil && !dl.Armed() {
		// Close, setting a deadline and the end of the session signal
		// notify too; a lone channel receive costs a fraction of the
		// select below, and a busy reader parks once per record.
		<-notify
	} else {
		c.parkSelect(notify, dl, extra)
	}
	c.sleepers.Add(-1)
	c.ep.parked.Add(-1)
	if sp.start != 0 {
		// Would spinning busySpin have bridged this wait? If not, the
		// next waits keep the short budget (see spinner).
		c.sporadic.Store(c.ep.now()-sp.start > int64(busySpin))
		sp.short = c.sporadic.Load()
	}
}

// parkSelect waits for notify, the deadline, Close, the end of the session
// or extra.
func (c *Conn) parkSelect(notify chan struct{}, dl *deadline.Deadline, extra <-chan struct{}) {
	select {
	case <-notify:
	case <-dl.Wait():
	case <-c.closedCh:
	case <-c.sessionDone():
	case <-extra:
	}
}
