package transport

import (
	"errors"
	"fmt"
	"time"

	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/partition"
)

// Defaults for Config.
const (
	DefaultSpinBudget   = 50 * time.Microsecond
	DefaultWindow       = 4 << 20
	DefaultMTU          = 64 << 10
	DefaultSharedWindow = 64 << 10
	DefaultBacklog      = 128
	DefaultMaxConns     = 4096
	DefaultSpinYield    = 64

	minWindow = 4 << 10
	maxWindow = 64 << 20
)

// ErrLinkDown is wrapped by errors of connections whose link or session
// went down. It is ntb.ErrLinkDown, so either name matches.
var ErrLinkDown = ntb.ErrLinkDown

// Config configures an Endpoint. The zero value is usable.
type Config struct {
	// SpinBudget is how long a blocked call polls before it parks. Polling
	// keeps a round trip under a microsecond; parking costs a cross-process
	// wake-up but no CPU. Negative: never spin.
	SpinBudget time.Duration
	// SpinConns, if positive, is the most connections the endpoint may
	// have open for a blocked Read or Write to spin: with more, it parks
	// at once and the poller serves them. A spinner serves every
	// connection's records, so on a link that carries many (the TCP
	// gateway's trunk) the goroutine of a small request that spins copies
	// the others' bulk before its own reply, and a spin that ends with
	// no record for its own flow holds a P that their goroutines wait
	// for. 0: no bound.
	SpinConns int
	// Window is each connection's receive window in bytes (4 KiB..64 MiB;
	// default DefaultWindow, 4 MiB). A connection announces no more than
	// half a ring of the link, and is granted less while many share the
	// rings (see state.share). On the emulated fabric a stream runs
	// fastest with more than a CPU's L2 in flight: the reader then finds
	// the writer's lines gone to the shared cache rather than dirty in the
	// writer's, to be fetched from there; the default is sized for that.
	Window int
	// MTU is the largest DATA frame; larger writes are cut into MTU-sized
	// frames so small messages interleave with bulk ones. Up to
	// DefaultMTU, frames on a partition that carries small messages are
	// cut smaller still, to 16 KiB pieces (see smallPiece); an MTU above
	// DefaultMTU turns that off too.
	MTU int
	// SharedWindow bounds the bulk data a small message can find ahead of
	// it in a partition's ring. While a partition carries a small-message
	// connection (one that sent no record larger than 4 KiB lately, see
	// smallRecent), the receive windows of its connections shrink to
	// SharedWindow split among the bulk ones (those that did; at least
	// 16 KiB each) — by holding back credit, as for the ring shares —
	// instead of Window each: with the default Window one bulk flow can
	// queue hundreds of microseconds of copying ahead of a small message.
	// (A small flow never has that much in flight, so the limit costs it
	// nothing.) Partitions without small-message traffic keep the full
	// window. Default DefaultSharedWindow, the largest that kept a small
	// message's tail latency beside bulk flows at its latency alone, at
	// no cost to bulk throughput (docs/perf-log.md); negative: no limit.
	// Only the receiving side's setting matters.
	SharedWindow int
	// Backlog is the per-listener queue of accepted, unaccepted connections.
	Backlog int
	// MaxConns bounds connections per endpoint (ids are 20 bits).
	MaxConns int
	// Partitions is the number of data partitions (ring pairs) of the link,
	// 1..30; both ends must agree (default 1). With QoS, the partitions form
	// units of up to 8, one partition per class.
	Partitions int
	// QoS gives each priority class its own partition within a unit of 8,
	// so a class-0 message never queues behind class-7 records.
	QoS bool
	// CoreModel says who drives the partitions (default CoreInline).
	CoreModel CoreModel
	// WorkerCPUs, if set, pins worker threads to these CPUs, in turn.
	WorkerCPUs []int
	// Placement spreads new connections over the units.
	Placement Placement
	// Rebalance migrates connections between units under load skew.
	Rebalance bool
	// Batch bounds the bytes a connection sends per scheduling round
	// (default: the MTU), so connections sharing a partition interleave.
	Batch int
	// PartitionConns is the connection quota of each partition (0: none).
	PartitionConns int
	// PartitionRate limits each partition to this many bytes per second
	// (token bucket; 0: unlimited).
	PartitionRate int64
	// MemoryQuota bounds the receive-window memory of all this endpoint's
	// connections together: a connection reserves its window, Window or
	// half a ring if that is less, as it announces it (0: none).
	MemoryQuota int64
	// SpinYield is how many polling rounds a spinning call makes between
	// yields of the CPU, to this process's other goroutines and to other
	// processes (default DefaultSpinYield). Fewer rounds serve a process
	// whose goroutines pass each message on to each other, like ntproxy,
	// where the goroutine handed to runs sooner; more rounds serve one
	// whose latency-sensitive flow shares the process with bulk ones,
	// whose goroutines would otherwise take the P at every yield.
	SpinYield int
	// HandOff says the process's goroutines hand each message on to each
	// other, as ntproxy's do (a leg's receiver to the deliverer): a bulk
	// Read then yields the processor once per record whatever the link
	// carries, so that the goroutine it handed to runs. Otherwise a bulk
	// Read yields only while the link carries a small-message flow (see
	// yieldAbove). ntproxy sets it on its rack links, whose receivers hand
	// every record to a deliverer; its endpoints for applications leave it
	// off, where the yield only cost the bulk reader its runs of records.
	HandOff bool
	// UserTimeout is how long a connection waits for a peer it cannot
	// reach — link down, a new session whose peer does not resume it —
	// before it fails with ETIMEDOUT (a suspect peer: SilentTimeout; default
	// DefaultUserTimeout, 10 s, the order of TCP's). A peer that is gone
	// (exited, closed its endpoint) fails connections at once, with
	// ECONNRESET; any shorter outage costs a pause (resume.go).
	UserTimeout time.Duration
	// SilentTimeout is how long a session waits for a peer that is
	// attached but not heard from (its device finds it suspect, or takes
	// the link down as silent, ntb.CauseSilent) before its connections
	// fail with ETIMEDOUT (default UserTimeout). A live peer that is only
	// starved of CPU is such a peer: an endpoint whose UserTimeout is
	// short because something above it moves on by itself (ntproxy's rack
	// links, whose legs fail over) still waits seconds for it. Open gives
	// the device the same timeout unless Fabric says otherwise.
	SilentTimeout time.Duration
	// Sockets says the process also waits on sockets (its goroutines read
	// TCP or Unix sockets through the runtime's poller, as ntproxy's
	// gateway process and ntproxy's TCP fallback legs do). It applies process-wide from the first
	// Attach that sets it: from then on at most GOMAXPROCS−1 goroutines
	// spin, so a P stays free to see a socket become ready; with one P
	// nobody spins (DESIGN.md invariant 11). In a process that waits only
	// on the fabric each endpoint keeps GOMAXPROCS spinners.
	Sockets bool
	// Fabric configures the emulated fabric for Open.
	Fabric shm.Options
	// Logf, if set, receives link and session events.
	Logf func(format string, args ...any)
}

func (c *Config) setDefaults() error {
	if c.SpinBudget == 0 {
		c.SpinBudget = DefaultSpinBudget
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
	if c.Backlog == 0 {
		c.Backlog = DefaultBacklog
	}
	if c.MaxConns == 0 {
		c.MaxConns = DefaultMaxConns
	}
	if c.Partitions == 0 {
		c.Partitions = 1
	}
	if c.SpinYield == 0 {
		c.SpinYield = DefaultSpinYield
	}
	if c.Batch == 0 {
		c.Batch = c.MTU
	}
	if c.SharedWindow == 0 {
		c.SharedWindow = DefaultSharedWindow
	}
	if c.UserTimeout == 0 {
		c.UserTimeout = DefaultUserTimeout
	}
	if c.SilentTimeout == 0 {
		c.SilentTimeout = c.UserTimeout
	}
	switch {
	case c.Window < minWindow || c.Window > maxWindow:
		return fmt.Errorf("window %d outside [%d, %d]", c.Window, minWindow, maxWindow)
	case c.UserTimeout < 0:
		return fmt.Errorf("user timeout %v", c.UserTimeout)
	case c.SilentTimeout < 0:
		return fmt.Errorf("silent timeout %v", c.SilentTimeout)
	case c.MTU < 1:
		return fmt.Errorf("mtu %d", c.MTU)
	case c.SharedWindow > 0 && c.SharedWindow < minWindow:
		return fmt.Errorf("shared window %d below %d", c.SharedWindow, minWindow)
	case c.SpinYield < 1:
		return fmt.Errorf("spin yield %d", c.SpinYield)
	case c.Batch < 1:
		return fmt.Errorf("batch %d", c.Batch)
	case c.Partitions < 1 || c.Partitions > partition.MaxPartitions:
		return fmt.Errorf("partitions %d outside [1, %d]", c.Partitions, partition.MaxPartitions)
	case c.CoreModel < CoreInline || c.CoreModel > CoreSplit:
		return fmt.Errorf("core model %d", c.CoreModel)
	case c.MaxConns < 1 || c.MaxConns > maxID:
		return fmt.Errorf("max conns %d outside [1, %d]", c.MaxConns, maxID)
	}
	return nil
}

// CoreModel says who drives the partitions.
type CoreModel int

const (
	// CoreInline: no worker threads. The application's own Read and Write
	// calls send and receive, combining: whoever finds a unit's sender free
	// serves every connection queued on it, round-robin. Best when cores
	// are scarce (two processes on two cores cannot also feed spinning
	// workers).
	CoreInline CoreModel = iota
	// CoreShared: one worker per unit, locked to an OS thread, does its TX
	// and RX (the paper's SPSC model).
	CoreShared
	// CoreSplit: a TX worker and an RX worker per unit (SP2C).
	CoreSplit
)

func (m CoreModel) String() string {
	switch m {
	case CoreInline:
		return "inline"
	case CoreShared:
		return "shared"
	case CoreSplit:
		return "split"
	}
	return fmt.Sprintf("CoreModel(%d)", int(m))
}

// ParseCoreModel parses "inline", "shared" or "split".
func ParseCoreModel(s string) (CoreModel, error) {
	for _, m := range []CoreModel{CoreInline, CoreShared, CoreSplit} {
		if m.String() == s {
			return m, nil
		}
	}
	return 0, fmt.Errorf("core model %q: want inline, shared or split", s)
}

// Placement picks the unit of a new connection.
type Placement int

const (
	RoundRobin  Placement = iota // the next unit in turn
	LeastLoaded                  // the unit with the fewest connections
)

// ErrPartitionFull is wrapped by dial (and refusal) errors when every
// partition that could take a connection holds Config.PartitionConns.
var ErrPartitionFull = errors.New("partition connection quota reached")
