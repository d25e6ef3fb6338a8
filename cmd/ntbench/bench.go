package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"runtime/trace"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ntstack/ntstack/internal/prim/proc"
)

// benchmark runs every transport×mode×size the options name and reports
// them to stdout. fwd holds the command-line flags, for the server
// processes.
func benchmark(o *options, fwd []string, stdout, stderr io.Writer) (err error) {
	r := &runner{o: o, fwd: fwd, host: proc.ReadHost(), stderr: stderr}
	stop, err := startCapture(o.cpuprofile, o.trace)
	if err != nil {
		return err
	}
	defer stop()

	// Fix GOMAXPROCS before pinning: left automatic, the runtime would
	// shrink it to the pinned CPU count within a second, in the middle of
	// a measurement. By default it is that count from the start (1 per
	// process when pinned): more Ps than CPUs means two runtime threads
	// time-sliced on one CPU, which stalls whichever holds a lock.
	r.procs = o.gomaxprocs
	if r.procs == 0 {
		r.procs = runtime.GOMAXPROCS(0)
		if o.pin != "none" {
			r.procs = 1
		}
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(r.procs))

	clientCPU, serverCPU, err := placement(o.pin)
	if err != nil {
		return err
	}
	r.clientCPU, r.serverCPU = clientCPU, serverCPU
	if clientCPU >= 0 {
		prev, err := proc.Affinity()
		if err != nil {
			return fmt.Errorf("pin client: %w", err)
		}
		if err := proc.SetAffinity([]int{clientCPU}); err != nil {
			return fmt.Errorf("pin client: %w", err)
		}
		defer func() {
			if rerr := proc.SetAffinity(prev); rerr != nil {
				err = errors.Join(err, fmt.Errorf("restore affinity: %w", rerr))
			}
		}()
	}

	rep := &report{o: o, w: stdout}
	rep.begin(r.host, r.procs, clientCPU, serverCPU)
	failed, unplaced := 0, 0
	for round := 1; round <= o.rounds; round++ {
		r.round = round
		add := rep.add
		if o.rounds > 1 {
			rep.round(round)
			add = func(res result) { res.Round = round; rep.add(res) }
		}
		// Each count in turn, and at each the transports one after the
		// other, so that a transport and its bound see the same moment.
		for _, n := range o.connCounts {
			at := *o
			at.conns = n
			r.o = &at
			for _, tn := range o.transports {
				for _, mn := range o.modes {
					m, _ := modeNamed(mn)
					if err := r.runMode(transports[tn], m, add); err != nil {
						what := tn + " " + mn
						if len(o.connCounts) > 1 {
							what += fmt.Sprintf(", %d connections", n)
						}
						fmt.Fprintf(stderr, "ntbench: %s: %v\n", what, err)
						if errors.Is(err, errAllMoved) {
							unplaced++
						} else {
							failed++
						}
					}
				}
			}
		}
	}
	rep.end()
	if o.svg != "" && len(rep.results) > 0 { // draw what was measured, even if some runs failed
		if err := writeChart(o.svg, rep.results, ""); err != nil {
			return err
		}
	}
	if unplaced > 0 && len(rep.results) == 0 {
		return fmt.Errorf("none of the %d measurements kept a slice", unplaced)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d transport×mode runs failed", failed, o.rounds*len(o.connCounts)*len(o.transports)*len(o.modes))
	}
	return nil
}

// placement returns the CPUs -pin puts the client and the server on, -1
// for not pinned: the first (and second) CPU this process may use.
func placement(pin string) (client, server int, err error) {
	if pin == "none" {
		return -1, -1, nil
	}
	cpus, err := proc.Affinity()
	if err != nil {
		return 0, 0, fmt.Errorf("-pin=%s: %w", pin, err)
	}
	if pin == "same" {
		return cpus[0], cpus[0], nil
	}
	if len(cpus) < 2 {
		return 0, 0, fmt.Errorf("-pin=split needs two CPUs, this process may use only %v (try -pin=same)", cpus)
	}
	return cpus[0], cpus[1], nil
}

// runner measures one transport×mode at a time.
type runner struct {
	o         *options
	fwd       []string // command-line flags, for the server processes
	host      proc.Host
	procs     int // GOMAXPROCS of client and server
	clientCPU int // -1: not pinned
	serverCPU int // -1: not pinned
	round     int // the round being measured, from 1
	stderr    io.Writer
}

// runMode starts a server for t and m and measures every size against it,
// handing each result to emit as soon as it is ready.
func (r *runner) runMode(t transport, m mode, emit func(result)) error {
	if t.local != nil {
		return r.runLocal(t, m, emit)
	}
	args := []string{serverRole, "-transport=" + t.name, "-mode=" + m.name, "-cpu=" + strconv.Itoa(r.serverCPU)}
	args = append(args, r.fwd...)
	args = append(args, "-conns="+strconv.Itoa(r.o.conns))
	args = append(args, "-gomaxprocs="+strconv.Itoa(r.procs))
	// A server a transport×mode×count×round, each with capture files of
	// its own; the flags given last override those forwarded.
	suffix := fmt.Sprintf(".server.%s.%s.%dc.r%d", t.name, m.name, r.o.conns, r.round)
	if r.o.cpuprofile != "" {
		args = append(args, "-cpuprofile="+r.o.cpuprofile+suffix)
	}
	if r.o.trace != "" {
		args = append(args, "-trace="+r.o.trace+suffix)
	}
	srv, err := startServer(args, r.stderr)
	if err != nil {
		return err
	}
	defer closeClients() // after srv.stop: see closeClients
	for _, size := range r.o.sizes {
		res, err := r.measure(t, m, srv, size)
		if err != nil {
			return errors.Join(fmt.Errorf("size %d: %w", size, err), srv.stop())
		}
		for _, res := range res {
			emit(res)
		}
	}
	clientMu.Lock()
	for _, f := range statsHooks {
		f()
	}
	statsHooks = nil
	clientMu.Unlock()
	return srv.stop()
}

// runLocal measures a bound, which needs no server, for every size.
func (r *runner) runLocal(t transport, m mode, emit func(result)) error {
	if m.name != "stream" {
		fmt.Fprintf(r.stderr, "ntbench: %s measures stream only; no %s row\n", t.name, m.name)
		return nil
	}
	for _, size := range r.o.sizes {
		measured, err := r.sliced(func(d time.Duration) (slice, error) {
			cpu0, err := proc.CPUTime()
			if err != nil {
				return slice{}, err
			}
			at := *r.o
			at.duration = d
			start := time.Now()
			samples, err := t.local(&at, size, [2]int{r.clientCPU, r.serverCPU})
			if err != nil {
				return slice{}, fmt.Errorf("size %d: %w", size, err)
			}
			wall := time.Since(start)
			cpu1, err := proc.CPUTime()
			return slice{samples, wall, cpu1 - cpu0}, err
		})
		if err != nil {
			return err
		}
		for _, p := range measured {
			emit(r.result(t, m.name, size, p.samples, p))
		}
	}
	return nil
}

// measure runs one size over fresh connections to srv.
func (r *runner) measure(t transport, m mode, srv *serverProc, size int) (res []result, err error) {
	conns := make([]net.Conn, 0, r.o.conns)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	dials := r.o.conns + r.o.idle
	if m.dialer != nil {
		dials = r.o.idle // each client dials its own
	}
	for range dials { // the measured ones first
		c, err := t.dial(r.o, srv.addr)
		if err != nil {
			return nil, fmt.Errorf("dial %s: %w", srv.addr, err)
		}
		conns = append(conns, c)
	}

	// A transport that stops moving data would block this run forever. The
	// watchdog kills the server and closes the connections, which fails
	// every blocked call, and the error says why.
	var hung atomic.Bool
	watchdog := time.AfterFunc(hangTimeout, func() {
		hung.Store(true)
		srv.kill()
		for _, c := range conns {
			c.Close()
		}
	})
	defer func() {
		watchdog.Stop()
		if err != nil && hung.Load() {
			err = fmt.Errorf("hung, killed the server after %v: %w", hangTimeout, err)
		}
	}()

	var clients []client
	if m.dialer != nil {
		for range r.o.conns {
			clients = append(clients, m.dialer(func() (net.Conn, error) { return t.dial(r.o, srv.addr) }, size, r.o))
		}
	} else if m.client == nil { // mixed (o.check: two connections or more)
		if clients, err = mixedClients(conns[:r.o.conns], size, r.o); err != nil {
			return nil, err
		}
	} else {
		for _, c := range conns[:r.o.conns] {
			clients = append(clients, m.client(c, size, r.o))
		}
	}
	if err := parallel(len(clients), func(i int) error { return clients[i].warmup() }); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}
	if r.o.await != "" {
		watchdog.Reset(awaitMax + hangTimeout) // sliced waits for the placement first: no hang
	}

	measured, err := r.sliced(func(d time.Duration) (slice, error) {
		cpu0, err := r.cpuTime(srv)
		if err != nil {
			return slice{}, err
		}
		start := time.Now()
		deadline := start.Add(d)
		watchdog.Reset(d + hangTimeout)
		samples := make([]sample, len(clients))
		err = parallel(len(clients), func(i int) (err error) {
			samples[i], err = clients[i].measure(deadline)
			return err
		})
		wall := time.Since(start)
		if err != nil {
			return slice{}, err
		}
		cpu1, err := r.cpuTime(srv)
		return slice{samples, wall, cpu1 - cpu0}, err
	})
	if err != nil {
		return nil, err
	}
	for _, p := range measured {
		if m.client == nil && m.dialer == nil {
			rr := r.result(t, "mixed-rr", mixedRRSize, p.samples[:1], p)
			rr.Beside = len(p.samples) - 1
			res = append(res, rr, r.result(t, "mixed-bulk", size, p.samples[1:], p))
		} else {
			res = append(res, r.result(t, m.name, size, p.samples, p))
		}
	}
	return res, nil
}

// cpuTime returns the CPU time client and server have used so far.
func (r *runner) cpuTime(srv *serverProc) (time.Duration, error) {
	client, err := proc.CPUTime()
	if err != nil {
		return 0, fmt.Errorf("client cpu time: %w", err)
	}
	server, err := srv.cpuTime()
	if err != nil {
		return 0, err
	}
	return client + server, nil
}

// result aggregates the samples of all connections of one measurement (of
// its slices of one placement, p).
func (r *runner) result(t transport, mode string, size int, samples []sample, p placed) result {
	wall, cpu := p.wall, p.cpu
	var rtts []time.Duration
	msgs := 0
	for _, s := range samples {
		rtts = append(rtts, s.rtts...)
		msgs += s.msgs
	}
	lat := summarize(rtts)
	res := result{
		Transport:  t.name,
		Mode:       mode,
		Size:       size,
		Conns:      len(samples),
		Idle:       r.o.idle,
		P50:        lat.p50.Nanoseconds(),
		P90:        lat.p90.Nanoseconds(),
		P99:        lat.p99.Nanoseconds(),
		P999:       lat.p999.Nanoseconds(),
		Max:        lat.max.Nanoseconds(),
		Stalls:     lat.stalls,
		MsgsPerS:   float64(msgs) / wall.Seconds(),
		BytesPerS:  float64(msgs) * float64(size) / wall.Seconds(),
		CPUPct:     100 * cpu.Seconds() / wall.Seconds(),
		Pin:        r.o.pin,
		Count:      msgs,
		DurationNs: wall.Nanoseconds(),
		GOMAXPROCS: r.procs,
		ReadBuf:    r.o.readBuf,
		Host:       r.host,
		Time:       p.start.UTC().Format(time.RFC3339),
		Placement:  p.placement,
	}
	if len(p.rtts) > 0 {
		sorted := slices.Clone(p.rtts)
		slices.Sort(sorted)
		res.CoreRTTNs = sorted[len(sorted)/2].Nanoseconds()
		res.Slices = len(p.rtts) / 2
		res.Moved = p.moved
	}
	if mode == "rate" {
		res.Window = r.o.window
	}
	if mode == "pingpong" || mode == "mixed-rr" {
		res.GapNs = r.o.gap.Nanoseconds()
	}
	return res
}

// parallel runs f(0) … f(n-1) in goroutines of their own and joins their
// errors.
func parallel(n int, f func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			if err := f(i); err != nil {
				errs[i] = fmt.Errorf("conn %d: %w", i, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// startCapture starts a CPU profile into profile and an execution trace
// into exec, each if its path is set; stop ends and closes them.
func startCapture(profile, exec string) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, s := range stops {
			s()
		}
	}
	capture := func(path, what string, start func(io.Writer) error, end func()) error {
		if path == "" {
			return nil
		}
		f, err := os.Create(path)
		if err == nil {
			if err = start(f); err != nil {
				f.Close()
			}
		}
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		stops = append(stops, func() { end(); f.Close() })
		return nil
	}
	if err := capture(profile, "cpu profile", pprof.StartCPUProfile, pprof.StopCPUProfile); err != nil {
		return nil, err
	}
	if err := capture(exec, "execution trace", trace.Start, trace.Stop); err != nil {
		stop()
		return nil, err
	}
	return stop, nil
}
