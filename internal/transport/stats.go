package transport

import "sync/atomic"

// Stats are an endpoint's event counters since it was opened, for
// diagnosis and metrics. Every field only grows.
type Stats struct {
	Parks         int64 // Read, Write or Dial calls that gave up spinning and slept
	PollerSleeps  int64 // times the poller slept on the doorbell
	RingFull      int64 // sends that found a data ring full
	CreditWaits   int64 // sends that found the peer's window used up
	Credits       int64 // CREDIT frames sent
	Turns         int64 // turns of credit granted (see turns.go)
	TurnsExpired  int64 // turns written off unused
	Migrations    int64 // connections moved to another partition
	StaleFrames   int64 // frames for connections that had ended, dropped
	DataRecords   int64 // DATA records received
	QueuedRecords int64 // of those, queued (whole or in part) because no Read buffer took them: copied twice
	TakenAhead    int64 // of those, taken by a small message's reader from behind another connection's bulk record
	Resumptions   int64 // connections resumed on a new session (resume.go)
	Resets        int64 // RESUMEs for connections this end did not have, answered with RESET
}

// Conns is the number of connections the endpoint holds: those of its
// session, or of the last one while they wait to resume.
func (ep *Endpoint) Conns() int {
	ep.mu.Lock()
	st := ep.cur
	if st == nil {
		st = ep.orphan
	}
	ep.mu.Unlock()
	if st == nil {
		return 0
	}
	return int(st.live.Load())
}

// counters backs Stats.
type counters struct {
	// pollerRounds counts the CoreInline poller's rounds that go back to
	// serve at once, with writers queued on rings with room (not in
	// Stats): a test's view of whether it goes round without yielding.
	pollerRounds atomic.Int64

	parks, pollerSleeps, ringFull, creditWaits, credits, turns, turnsExpired, migrations, staleFrames, dataRecords, queuedRecords, takenAhead, resumptions, resets atomic.Int64
}

// Stats returns the endpoint's counters.
func (ep *Endpoint) Stats() Stats {
	c := &ep.counters
	return Stats{
		Parks:         c.parks.Load(),
		PollerSleeps:  c.pollerSleeps.Load(),
		RingFull:      c.ringFull.Load(),
		CreditWaits:   c.creditWaits.Load(),
		Credits:       c.credits.Load(),
		Turns:         c.turns.Load(),
		TurnsExpired:  c.turnsExpired.Load(),
		Migrations:    c.migrations.Load(),
		StaleFrames:   c.staleFrames.Load(),
		DataRecords:   c.dataRecords.Load(),
		QueuedRecords: c.queuedRecords.Load(),
		TakenAhead:    c.takenAhead.Load(),
		Resumptions:   c.resumptions.Load(),
		Resets:        c.resets.Load(),
	}
}
