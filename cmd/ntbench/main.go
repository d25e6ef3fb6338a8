// Command ntbench measures ntstack's transports side by side with the
// kernel's loopback sockets, in one run, in the spirit of sockperf and
// qperf.
//
// Usage:
//
//	ntbench                                  # every transport, pingpong and stream, 64 B … 64 KiB
//	ntbench -transports tcp,unix -modes pingpong,stream,rate -size 64
//	ntbench -json -q > results.jsonl         # one JSON object per line
//	ntbench -h                               # every flag
//
// # How it runs
//
// The client is the ntbench process itself. For every transport×mode it
// starts a fresh server process by re-executing its own binary with hidden
// flags; the server listens, prints "READY <addr>" and serves until the
// client closes its standard input. The kernel kills a server whose client
// dies (parent-death signal), so an interrupted run leaves nothing behind.
// Every size of that transport×mode then runs on -conns fresh connections,
// with -idle more open beside them that carry nothing: what idle
// connections (a client's pool, say) cost the busy ones.
// Each connection first exchanges -warmup unmeasured messages; then all
// connections start together and run until each has done -count messages
// or -duration has passed, whichever comes first.
//
// -conns takes a list, e.g. -conns 1,2,4,8,16,32,64: each count is
// measured in turn, every transport×mode with a fresh server, the
// transports one after the other at each count (so that a transport and
// its bound see the same moment of the machine). The table then ends with
// each throughput row at every count as a share of its peak — whether a
// transport keeps its throughput as connections are added — then, with
// several rounds, every count against the peak's count of the same round
// (the median of the rounds' ratios), and, with the copy bound among the
// transports, each transport's throughput over the bound's at every
// count, the median of the rounds' ratios (on a machine whose speed
// changes from second to second the ratio of two adjacent measurements
// moves less than either):
//
//	ntbench -transports ntb,copy -modes stream -size 65536 -readbuf 32768 -conns 1,2,4,8,16,32,64 -rounds 3
//
// Modes:
//
//	pingpong  write size bytes, read the size-byte echo, one at a time;
//	          every round trip is timed; with -gap D the client waits D
//	          between round trips (sporadic traffic: -gap 1ms is about a
//	          request a millisecond; time.Sleep below 1 ms sleeps ~1.1 ms
//	          on these VMs), untimed; mixed mode's pingpong flow too
//	stream    write size-byte messages back to back; the server discards
//	          them and acknowledges the byte count at the end; the time runs
//	          from the first write to the acknowledgement
//	rate      keep -window messages in flight (a writer and a reader
//	          goroutine per connection); the server echoes; every echo is
//	          timed from just before its message was written, queueing
//	          included
//	mixed     one 64 B pingpong flow (class 0) beside -conns-1 stream flows
//	          of size-byte writes (class -priority), on one link; reported
//	          as two rows, mixed-rr (the pingpong flow alone) and mixed-bulk
//	          (the stream flows together); every flow runs for -duration,
//	          whatever -count says, so that each row is beside the other
//	dial      dial a fresh connection, exchange one size-byte message,
//	          close, again and again (-conns dialers side by side); the
//	          latency columns are the dials' times, until the dial returned
//	          a connection: TCP's connect beside the time ntstack takes to
//	          open a connection (for direct, a link of its own); -warmup
//	          counts at most 10 dials; with -gap D the client waits D
//	          between dials, untimed
//
// # Reading the figures
//
// One row per transport×mode×size (JSON field names in brackets):
//
//	p50 … max  [p50_ns … max_ns]  round-trip time, exact nearest-rank
//	           percentiles over every measured round trip of every
//	           connection (pingpong, rate; "-" for stream)
//	stalls     [stalls]       round trips over 1 ms. A busy poller that
//	           loses its CPU to another process waits a scheduler tick or
//	           more; on small shared VMs that happens, and percentiles hide
//	           it, so it is counted
//	msgs/s     [msgs_per_s]   round trips (pingpong, rate) or messages
//	           written (stream) per second, all connections together
//	MB/s       [bytes_per_s]  msgs/s × size: payload in one direction,
//	           MB = 10^6 bytes
//	cpu%       [cpu_pct]      user+system CPU time of client and server over
//	           the measured interval, divided by wall time, × 100: 200 means
//	           two cores busy
//
// JSON rows also carry pin, count (measured messages, all connections),
// duration_ns (measured wall time), gomaxprocs, window (rate), gap_ns
// (pingpong and mixed-rr with -gap), read_buf,
// idle (-idle, when set), round (-rounds, when more than one), beside
// (mixed-rr: the bulk flows beside it) and host.
//
// On a shared machine one run says little. -rounds N runs everything N
// times, the transports taking turns, so that each sees the machine's
// good and bad moments alike: the table shows every round's rows as they
// come, then the median of each figure over the rounds, and compares
// those medians with tcp's; -q prints only the medians; -json prints
// every round's rows, numbered (-plot reduces them to medians).
//
// The server reads each connection into a buffer of its own, -readbuf
// bytes (256 KiB by default). With many connections these buffers
// together outgrow the CPU caches — 16 × 256 KiB is twice a 2 MiB L2 —
// and every byte is copied into them, so the aggregate stream figure then
// measures the buffers as much as the transport; -readbuf 32768 reads as
// io.Copy does. -transports copy measures the bound in the same run: a
// ring transport's two copies and nothing else, the writers' source into
// an ntb-sized ring on the server's CPU and the ring into -conns buffers of
// -readbuf bytes on the client's (stream only; see transport_copy.go).
// After the table ntbench compares every transport with tcp of the same run,
// when tcp is among the transports.
//
// Placement decides socket figures on small VMs, so ntbench pins by
// default: -pin=split puts the client on the first CPU it may use and the
// server on the second, -pin=same puts both on the first, -pin=none leaves
// placement to the scheduler (which lands on either and varies from run to
// run). On a 2-vCPU VM a TCP loopback 64 B round trip takes ≈17 µs when
// both processes share a vCPU (a cheap same-CPU switch) and ≈60 µs when
// split (waking a process on the other, idle vCPU costs ≈30 µs each way);
// Unix sockets ≈13 and ≈54 µs. Quote the placement with every figure, and
// compare transports only within one run: absolute times drift between runs
// and machines; the ratios hold.
//
// -pin fixes the vCPU each process runs on, not where the host runs the
// vCPUs: it moves them from core to core every 0.1-1 s, and whether the
// two then share a cache decides what a ring between them moves (on the
// 2-vCPU AMD VM a bare ring copy moved 32 GB/s between cores 80-160 ns
// apart, a cache line's round trip, and 6.4 GB/s between cores 300-700
// ns apart, and ~20 GB/s between hyperthreads of one core, ~70 ns apart;
// see placement.go). A second's figure is a mixture of them, whatever the
// transport. -slice D cuts every measurement into slices of D, times the
// round trip between the client's and the server's CPU before and after
// each, and reports a row per placement, sibling, near or far, from the
// slices whose two round trips agree (with -pin split only);
// -json rows carry placement, core_rtt_ns (the median round trip), slices
// and moved (the measurement's slices that counted nowhere). Compare rows
// of one placement only. -await P waits before each measurement, up to
// 20 s, until the round trip shows placement P, so that every count and
// transport of a sweep gets slices of it (a real host's fixed placement
// is there at once). Each slice ends as a measurement does (stream: the
// acknowledgement), so slices much shorter than 200 ms cost many
// connections their throughput:
//
//	ntbench -transports ntb,copy -modes stream -size 65536 -readbuf 32768 -conns 1,2,4,8,16,32,64 -rounds 4 -duration 1s -slice 200ms -await near
//
// -gomaxprocs is fixed in both processes for the whole run. The default (0)
// is the number of CPUs each process is pinned to — 1 with -pin split or
// same, as the runtime itself would choose for a process started with that
// affinity — and the start-up value with -pin none. More Ps than CPUs puts
// two runtime threads on one CPU, time-sliced by the kernel: whichever
// holds a lock can be descheduled for milliseconds while the other spins.
//
// -verify sends a seeded pseudo-random pattern and checks every echo
// (client) and every streamed byte (server). It costs throughput: compare
// verified runs only with verified runs. Stream byte counts are checked
// always.
//
// # Charts
//
// -svg FILE draws, after the run, what was measured as an SVG chart: round-trip
// latency by size (pingpong; p50 solid, p99 dashed, one colour per
// transport), throughput by size (stream) and, when the rows hold several
// connection counts, aggregate stream throughput by connection count. The
// by-size panels show the smallest connection count measured. -plot FILE
// draws the chart from saved JSON lines instead of measuring (FILE "-" is
// stdin); JSON lines of several runs may be concatenated, e.g. runs with
// different -conns, and repeated rows are reduced to their median:
//
//	ntbench -json -q > out/bench.jsonl
//	ntbench -plot out/bench.jsonl -svg out/bench.svg
//
// # Adding a transport
//
// A transport is one file with an init function calling register; see
// transport.go. New flags added to newFlagSet reach the server process
// without further code, unless listed in clientOnly.
package main

import (
	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/tools/cli"
	engine "github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/socklike"

	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

func main() {
	if cfg := os.Getenv(proxydEnv); cfg != "" {
		os.Exit(runProxyd(cfg))
	}
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// options are the parsed flags, shared read-only by client and server code.
type options struct {
	transports []string
	modes      []string
	sizes      []int
	count      int
	duration   time.Duration
	slice      time.Duration // cut each measurement into slices this long, each placed (0: one piece)
	await      string        // with -slice: wait for this placement before each measurement ("": do not)
	warmup     int
	connCounts []int // -conns: the connection counts to measure, in turn
	conns      int   // connections of the measurement under way (the server's: its -conns)
	idle       int   // connections opened beside the measured ones, never used
	rounds     int   // times the whole run is repeated, its rows reduced to medians
	window     int
	gap        time.Duration // pingpong: wait between round trips; dial: between dials
	pin        string
	gomaxprocs int
	verify     bool
	json       bool
	quiet      bool
	spin       time.Duration // ntb: socklike's spin budget
	partitions int           // ntb: data partitions
	qos        bool          // ntb: one partition per class
	core       string        // ntb: core model
	mtu        int           // ntb: segment size
	recvWindow int           // ntb: per-connection receive window
	directIdle time.Duration // direct: how long the dialer keeps a link with no connection
	readBuf    int           // the server's read buffer per connection
	sharedWin  int           // ntb: receive window of bulk connections beside small-message ones
	priority   int           // ntb: class of the bulk flows (mixed) or of every connection
	cpuprofile string        // CPU profile of the client; each server's gets ".server.<transport>.<mode>.<n>c.r<round>", proxy daemons the server's and ".proxy-a"/".proxy-b"
	trace      string        // execution trace of the client; each server's and ntproxy's named as its CPU profile
	stats      bool          // ntb: print the engine's event counters
	svg        string        // draw the results as an SVG chart into this file
	plot       string        // draw the chart from these JSON lines instead of measuring

	// Server process only, from hidden flags.
	transport string // transport to listen on
	mode      string // mode to serve
	cpu       int    // CPU to pin to; -1: do not pin
}

// maxSize bounds -size so that per-connection buffers stay modest.
const maxSize = 16 << 20

// serverRole, as the first argument, makes ntbench the server process.
const serverRole = "-role=server"

// run is the whole program: it returns the exit status (0 ok, 1 failure,
// 2 bad usage).
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	var o options
	fs := newFlagSet(&o, stderr)
	server := len(args) > 0 && args[0] == serverRole
	if server {
		args = args[1:]
		fs.StringVar(&o.transport, "transport", "", "")
		fs.StringVar(&o.mode, "mode", "", "")
		fs.IntVar(&o.cpu, "cpu", -1, "")
	}
	if code, ok := cli.Parse(fs, args, stdout); !ok {
		return code
	}
	if err := o.check(fs.Args()); err != nil {
		fmt.Fprintf(stderr, "ntbench: %v\n", err)
		return 2
	}
	if server {
		if f, ok := stdin.(*os.File); ok {
			stdin = proc.Pollable(f) // see there: the control pipe must not hold the P
		}
		if err := serve(&o, stdin, stdout); err != nil {
			fmt.Fprintf(stderr, "ntbench server %s %s: %v\n", o.transport, o.mode, err)
			return 1
		}
		return 0
	}
	if o.plot != "" {
		if err := plotResults(&o, stdin, stdout); err != nil {
			fmt.Fprintf(stderr, "ntbench: %v\n", err)
			return 1
		}
		return 0
	}
	if err := benchmark(&o, setFlags(fs), stdout, stderr); err != nil {
		fmt.Fprintf(stderr, "ntbench: %v\n", err)
		return 1
	}
	return 0
}

// newFlagSet returns the public flags, bound to o and set to their defaults.
func newFlagSet(o *options, out io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("ntbench", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), `usage: ntbench [flags]

ntbench compares byte-stream transports between two processes, side by side
in one run: round-trip percentiles, stalls, throughput and the CPU both
processes spend. "go doc ./cmd/ntbench" explains how to read the figures.

Flags:
`)
		fs.PrintDefaults()
	}
	o.transports = transportNames(false)
	fs.Var((*listFlag)(&o.transports), "transports", "comma-separated `list` of transports to compare: "+strings.Join(transportNames(true), ", ")+" (copy, stream only: a ring transport's two copies and nothing else)")
	o.modes = []string{"pingpong", "stream"}
	fs.Var((*listFlag)(&o.modes), "modes", "comma-separated `list` of modes: pingpong, stream, rate, mixed, dial")
	o.sizes = []int{64, 4096, 65536}
	fs.Var(&intsFlag{&o.sizes, "size"}, "size", "comma-separated `list` of message sizes in bytes")
	fs.IntVar(&o.count, "count", 100_000, "measured messages per connection, at most")
	fs.DurationVar(&o.duration, "duration", 500*time.Millisecond, "measured time per transport×mode×size, at most")
	fs.StringVar(&o.await, "await", "", "with -slice: before each measurement, wait up to "+awaitMax.String()+" for this `placement` of the two CPUs (sibling, near or far), so that every count and transport gets slices of it")
	fs.DurationVar(&o.slice, "slice", 0, "cut each measurement into slices this long and time a cache line's round trip between the client's and the server's CPU around each: rows are then per placement of the two, sibling (hyperthreads of one core), near (sharing a cache) or far, which on a VM decides throughput (-pin split; 0: one piece, no placement)")
	fs.IntVar(&o.warmup, "warmup", 1000, "unmeasured messages per connection before measuring")
	o.connCounts = []int{1}
	fs.Var(&intsFlag{&o.connCounts, "connection count"}, "conns", "parallel connections, each in its own goroutine; figures are aggregates. A comma-separated `list` measures each count in turn and compares each with the peak")
	fs.IntVar(&o.idle, "idle", 0, "connections opened beside the measured ones and left idle (not the copy bound's)")
	fs.IntVar(&o.rounds, "rounds", 1, "run every transport×mode×size this many times, the transports taking turns, and report the median of each figure")
	fs.IntVar(&o.window, "window", 32, "messages in flight per connection (rate mode)")
	fs.DurationVar(&o.gap, "gap", 0, "pingpong, and mixed mode's pingpong flow: wait this long between round trips, untimed (sporadic traffic; 1ms: about a request a millisecond); dial: between dials")
	fs.IntVar(&o.readBuf, "readbuf", defaultReadBuf, "the server's read buffer per connection, in bytes (pingpong, stream, rate); many connections' buffers together can outgrow the CPU caches")
	fs.StringVar(&o.pin, "pin", "split", "`placement`: split (client and server on different CPUs), same (both on one CPU) or none")
	fs.IntVar(&o.gomaxprocs, "gomaxprocs", 0, "GOMAXPROCS of client and server (0: the CPUs each is pinned to, or the start-up value with -pin none)")
	fs.DurationVar(&o.spin, "spin", socklike.DefaultSpinBudget, "ntb: how long a blocked call polls before it parks (socklike Config.SpinBudget; negative: never spin)")
	fs.IntVar(&o.partitions, "partitions", 1, "ntb: data partitions of the link (socklike Config.Partitions)")
	fs.BoolVar(&o.qos, "qos", false, "ntb: one partition per priority class (socklike Config.QoS)")
	fs.StringVar(&o.core, "core", "inline", "ntb: core model: inline (callers drive the rings), shared (a worker per partition) or split (TX and RX workers)")
	fs.DurationVar(&o.directIdle, "directidle", 0, "direct: how long the client keeps a direct link that carries no connection for a later dial to take (socklike Config.DirectIdle; 0: its default; negative: not at all, so that every dial opens a link)")
	fs.IntVar(&o.recvWindow, "recvwindow", socklike.DefaultWindow, "ntb: each connection's receive window in bytes (socklike Config.Window)")
	fs.IntVar(&o.sharedWin, "sharedwindow", engine.DefaultSharedWindow, "ntb: receive window of a bulk connection while a small-message connection shares its partition (the engine's Config.SharedWindow; negative: none)")
	fs.IntVar(&o.mtu, "mtu", socklike.DefaultMTU, "ntb: largest record; larger writes are segmented (a write-sized MTU switches segmentation off)")
	fs.IntVar(&o.priority, "priority", 0, "ntb: priority class 0-7 of the bulk flows in mixed mode, of every connection otherwise")
	fs.BoolVar(&o.stats, "stats", false, "ntb: print both endpoints' event counters (parks, poller sleeps, ring full, credit waits) to stderr")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write the client's CPU profile to `file`, each server's (one a transport, mode, connection count and round) to file.server.<transport>.<mode>.<n>c.r<round> (proxy transports: each ntproxy's to the server's name .proxy-a, .proxy-b)")
	fs.StringVar(&o.trace, "trace", "", "write the client's execution trace to `file`, each server's and each ntproxy's to a name as -cpuprofile's, for go tool trace: which goroutine ran when, and why it stopped")
	fs.BoolVar(&o.verify, "verify", false, "send a seeded pattern and check every echo and streamed byte (slower)")
	fs.BoolVar(&o.json, "json", false, "print one JSON object per line instead of a table")
	fs.BoolVar(&o.quiet, "q", false, "print only result rows: no banner, column header or comparison")
	fs.StringVar(&o.svg, "svg", "", "after the run, draw the results as an SVG chart into `file`")
	fs.StringVar(&o.plot, "plot", "", "measure nothing: draw the chart of the JSON lines in `file` (from -json; - for stdin) into the -svg file")
	return fs
}

// check validates the options; extra holds the non-flag arguments.
func (o *options) check(extra []string) error {
	switch {
	case len(extra) > 0:
		return fmt.Errorf("unexpected argument %q (flags only; see -h)", extra[0])
	case o.plot != "" && o.svg == "":
		return errors.New("-plot needs -svg FILE to draw into")
	case o.count < 1:
		return fmt.Errorf("-count %d: need at least 1", o.count)
	case o.duration <= 0:
		return fmt.Errorf("-duration %v: need a positive duration", o.duration)
	case o.slice < 0:
		return fmt.Errorf("-slice %v: need 0 or more", o.slice)
	case o.slice > 0 && o.pin != "split":
		return fmt.Errorf("-slice needs -pin split (the round trip between client's and server's CPU places its slices), not -pin %s", o.pin)
	case o.await != "" && o.slice == 0:
		return fmt.Errorf("-await %s needs -slice (it waits for a placement of the slices)", o.await)
	case o.await != "" && !slices.Contains([]string{"sibling", "near", "far"}, o.await):
		return fmt.Errorf("-await %q: want sibling, near or far", o.await)
	case o.warmup < 0:
		return fmt.Errorf("-warmup %d: need 0 or more", o.warmup)
	case o.rounds < 1:
		return fmt.Errorf("-rounds %d: need at least 1", o.rounds)
	case o.idle < 0:
		return fmt.Errorf("-idle %d: need 0 or more", o.idle)
	case o.window < 1:
		return fmt.Errorf("-window %d: need at least 1", o.window)
	case o.gap < 0:
		return fmt.Errorf("-gap %v: need 0 or more", o.gap)
	case o.readBuf < 1 || o.readBuf > maxSize:
		return fmt.Errorf("-readbuf %d: want 1 to %d bytes", o.readBuf, maxSize)
	case o.gomaxprocs < 0:
		return fmt.Errorf("-gomaxprocs %d: need 0 or more", o.gomaxprocs)
	case o.priority < 0 || o.priority > 7:
		return fmt.Errorf("-priority %d: want 0 to 7", o.priority)
	case o.partitions < 1:
		return fmt.Errorf("-partitions %d: need at least 1", o.partitions)
	case !slices.Contains([]string{"inline", "shared", "split"}, o.core):
		return fmt.Errorf("-core %q: want inline, shared or split", o.core)
	case !slices.Contains([]string{"split", "same", "none"}, o.pin):
		return fmt.Errorf("-pin %q: want split, same or none", o.pin)
	case len(o.transports) == 0 || len(o.modes) == 0 || len(o.sizes) == 0:
		return errors.New("-transports, -modes and -size each need at least one value")
	}
	for _, t := range o.transports {
		if _, ok := transports[t]; !ok {
			return fmt.Errorf("unknown transport %q (have %s)", t, strings.Join(transportNames(true), ", "))
		}
	}
	for _, m := range o.modes {
		if _, ok := modeNamed(m); !ok {
			return fmt.Errorf("unknown mode %q (have pingpong, stream, rate, mixed)", m)
		}
	}
	for _, s := range o.sizes {
		if s < 1 || s > maxSize {
			return fmt.Errorf("-size %d: want 1 to %d bytes", s, maxSize)
		}
	}
	for _, n := range o.connCounts {
		switch {
		case n < 1:
			return fmt.Errorf("-conns %d: need at least 1", n)
		case n < 2 && slices.Contains(o.modes, "mixed"):
			return errors.New("mixed mode needs -conns 2 or more: one pingpong flow beside the bulk flows")
		}
	}
	o.conns = o.connCounts[0]
	return nil
}

// clientOnly names the flags that concern the client process alone and are
// not passed to the server.
var clientOnly = []string{"svg", "plot", "rounds", "conns", "slice", "await"} // the server gets the count of each measurement

// setFlags returns the flags set on the command line as arguments, for the
// server process, less the client-only ones.
func setFlags(fs *flag.FlagSet) []string {
	var args []string
	fs.Visit(func(f *flag.Flag) {
		if !slices.Contains(clientOnly, f.Name) {
			args = append(args, "-"+f.Name+"="+f.Value.String())
		}
	})
	return args
}

// listFlag is a comma-separated list of names.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	*l = nil
	for v := range strings.SplitSeq(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*l = append(*l, v)
		}
	}
	return nil
}

// intsFlag is a comma-separated list of integers (what names one in
// errors).
type intsFlag struct {
	l    *[]int
	what string
}

func (f *intsFlag) String() string {
	if f.l == nil {
		return ""
	}
	s := make([]string, len(*f.l))
	for i, v := range *f.l {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, ",")
}

func (f *intsFlag) Set(s string) error {
	*f.l = nil
	for v := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return fmt.Errorf("%s %q: %w", f.what, v, err)
		}
		*f.l = append(*f.l, n)
	}
	return nil
}
