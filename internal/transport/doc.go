// Package transport is the engine under socklike: connections multiplexed
// over the rings of one NTB link (package partition), with credit flow
// control, a per-unit send scheduler, a poller and migration between
// partitions. socklike wraps it for applications; ntproxy and the tools
// use it directly, for the knobs and hooks applications do not see
// (Config's tuning fields, AddTap, Stats, Conn.Partition).
//
// Layout. An Endpoint (endpoint.go, config.go) is one end of a link; a
// session (state.go) is one life of the link between two resets, and owns
// the connection table, the units and the poller. A Conn (conn.go) is
// three parts, each with its own lock, around its lifecycle:
//
//   - the receive half (recv.go): delivery of the peer's frames in order,
//     the queue and the posted Read buffer;
//   - the grants (credit.go, turns.go): the credit handed back to the
//     peer's writer as the application reads;
//   - the send half (send.go): the posted write, the peer's credit and
//     the connection's place on a unit, served by whoever holds the unit
//     (unit.go).
//
// Polling the rings and dispatching frames is poll.go; the poller
// goroutine, which watches the doorbell while everybody sleeps, poller.go;
// spin-then-park spin.go; the classification of traffic into small
// messages and bulk flows traffic.go; frames and their encodings frame.go;
// taps (frame capture) tap.go; counters stats.go; the retention of sent
// bytes keep.go; the resumption of connections on a new session and the
// errors a lost peer gives resume.go.
//
// Sessions end; connections need not (DESIGN.md invariant 9). A sender
// keeps what it sent until the peer's CREDIT covers it; when a session
// ends for a reason that leaves hope (the link flapped, the peer started
// a new session), connections pause and resume on the next session,
// losing nothing. A peer that is only suspect keeps its session: its
// connections wait for it as for any slow peer. Only a peer gone or
// closed, unreachable past Config.UserTimeout or suspect past
// Config.SilentTimeout, fails them (resume.go).
//
// Data path (Config.CoreModel). The link's window holds Config.Partitions
// data ring pairs and a control ring for credits; partitions are grouped
// in units (one partition, or with Config.QoS one per priority class). A
// connection with something to send queues on its unit's scheduler
// (strict priority, round-robin within a class, Config.Batch bytes a
// round). In CoreInline, the default, whoever finds the unit free —
// usually the writer itself — sends for everybody queued, and a blocked
// Read posts its buffer so whoever polls the rings copies its data
// straight in; in CoreShared and CoreSplit worker threads drive the units
// instead. A waiting call spins (Config.SpinBudget, longer while the
// endpoint is busy; at most GOMAXPROCS goroutines of an endpoint at once,
// and GOMAXPROCS−1 of the whole process if it also waits on sockets,
// Config.Sockets), then parks. One
// poller goroutine per endpoint sleeps on the doorbell while something is
// parked and no other caller runs (a doorbell wait keeps the process's P,
// so it must not starve a runnable caller), or once no Read or Write has
// come for a couple of milliseconds (so frames nobody waits for, like an
// OPEN, are still answered); a new session's poller starts once the last
// session's has returned, so that only one takes the doorbells
// (state.awaitPrev). So a busy pair never takes a doorbell and an
// idle pair costs next to nothing.
//
// Flow control is by credit: a connection's sender never has more than
// the receiver's window unread, so the receiver can always take a record
// off the ring — one slow reader slows only its own writer, and memory
// stays bounded by connections × window.
//
// Concurrency: Endpoint, Conn and Listener methods are safe for concurrent
// use. Lifetime: closing the Endpoint ends every connection on it; the
// Endpoint owns the device only when it opened it (Open, TakeDevice).
package transport
