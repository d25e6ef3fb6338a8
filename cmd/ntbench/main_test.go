package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/tools/cli/clitest"
	"github.com/ntstack/ntstack/ntb/shm"
)

// TestMain lets the test binary serve as the server process: the client
// code re-executes os.Executable, which under go test is this binary.
func TestMain(m *testing.M) {
	clitest.MaybeMain(main)
	if cfg := os.Getenv(proxydEnv); cfg != "" {
		os.Exit(runProxyd(cfg)) // a proxy transport's ntproxy child
	}
	if len(os.Args) > 1 && os.Args[1] == serverRole {
		os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
	}
	// A binary built with -race sleeps a second at exit, waiting for late
	// reports; the servers these tests start need not.
	os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	os.Exit(m.Run())
}

// syncBuffer is a bytes.Buffer safe for the concurrent writes of the test
// and the goroutine copying a server's stderr.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// runBench runs ntbench in-process with args and returns its stdout,
// failing the test on a non-zero exit.
// jsonRows parses ntbench -json output, a result per line.
func jsonRows(t *testing.T, out string) []result {
	t.Helper()
	var rows []result
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var r result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		rows = append(rows, r)
	}
	return rows
}

func runBench(t *testing.T, args ...string) string {
	t.Helper()
	var stdout, stderr syncBuffer
	if code := run(args, strings.NewReader(""), &stdout, &stderr); code != 0 {
		t.Fatalf("ntbench %s: exit %d, stderr:\n%s", strings.Join(args, " "), code, stderr.String())
	}
	return stdout.String()
}

// multiProcess marks a test that starts ntbench server processes: it runs
// in the integration tier (go test -tags integration, which make test
// runs), not in go test ./...'s unit tier.
func multiProcess(t *testing.T) {
	t.Helper()
	if !integrationTier {
		t.Skip("starts server processes: integration tier (go test -tags integration; make test runs it)")
	}
}

// testPin is the placement the integration tests use: the default where the
// machine allows it.
func testPin(t *testing.T) string {
	cpus, err := proc.Affinity()
	if err != nil {
		t.Fatal(err)
	}
	if len(cpus) < 2 {
		return "same"
	}
	return "split"
}

// TestJSONRun runs tcp and unix through all three modes with tiny counts
// and checks that every row is complete and sane. It asserts no timing.
func TestJSONRun(t *testing.T) {
	multiProcess(t)
	pin := testPin(t)
	out := runBench(t, "-json", "-transports=tcp,unix", "-modes=pingpong,stream,rate", "-size=64,4096",
		"-count=200", "-warmup=20", "-conns=2", "-window=4", "-verify", "-pin="+pin)

	var want []string
	for _, tr := range []string{"tcp", "unix"} {
		for _, m := range []string{"pingpong", "stream", "rate"} {
			for _, size := range []int{64, 4096} {
				want = append(want, fmt.Sprintf("%s %s %d", tr, m, size))
			}
		}
	}
	var got []string
	for _, r := range jsonRows(t, out) {
		got = append(got, fmt.Sprintf("%s %s %d", r.Transport, r.Mode, r.Size))
		if r.Conns != 2 || r.Pin != pin || r.GOMAXPROCS < 1 || r.Host.CPUs < 1 || r.Host.Kernel == "" {
			t.Errorf("%s: bad run description %+v", got[len(got)-1], r)
		}
		if r.Count < 1 || r.Count > 2*200 || r.DurationNs <= 0 {
			t.Errorf("%s: count %d, duration %d ns", got[len(got)-1], r.Count, r.DurationNs)
		}
		if r.MsgsPerS <= 0 || r.BytesPerS <= 0 || r.CPUPct < 0 {
			t.Errorf("%s: msgs/s %v, bytes/s %v, cpu%% %v", got[len(got)-1], r.MsgsPerS, r.BytesPerS, r.CPUPct)
		}
		timed := r.Mode != "stream"
		ordered := r.P50 <= r.P90 && r.P90 <= r.P99 && r.P99 <= r.P999 && r.P999 <= r.Max
		if timed && (r.P50 <= 0 || !ordered || r.Stalls > r.Count) || !timed && r.Max != 0 {
			t.Errorf("%s: latencies %d %d %d %d %d, %d stalls", got[len(got)-1], r.P50, r.P90, r.P99, r.P999, r.Max, r.Stalls)
		}
		if (r.Mode == "rate") != (r.Window == 4) {
			t.Errorf("%s: window %d", got[len(got)-1], r.Window)
		}
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("rows:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestRingManyConns runs the bare-ring baseline with more connections
// than CPUs and a read buffer smaller than a message: every byte checked,
// and the rows say how they were measured. (Its pollers once held their P
// until preemption; runs then took seconds and the links' heartbeats
// lapsed.)
func TestRingManyConns(t *testing.T) {
	multiProcess(t)
	out := runBench(t, "-json", "-transports=ring", "-modes=pingpong,stream", "-size=65536",
		"-count=200", "-warmup=10", "-conns=16", "-readbuf=4096", "-verify", "-pin="+testPin(t))
	rows := jsonRows(t, out)
	for _, r := range rows {
		if r.Transport != "ring" || r.Conns != 16 || r.ReadBuf != 4096 || r.Count < 1 || r.BytesPerS <= 0 {
			t.Errorf("row %+v", r)
		}
	}
	if len(rows) != 2 {
		t.Errorf("%d rows, want 2:\n%s", len(rows), out)
	}
}

// TestCopyBound runs the copy bound: one stream row per size and
// connection count (64 connections copy in turns, as ntb's credit goes)
// with the connections and read buffer it copied into, none for other
// modes, and it is not among the transports a plain run compares.
func TestCopyBound(t *testing.T) {
	multiProcess(t)
	out := runBench(t, "-json", "-transports=copy", "-modes=pingpong,stream", "-size=4096,65536",
		"-duration=50ms", "-conns=3,64", "-readbuf=32768", "-pin="+testPin(t))
	var got []string
	for _, r := range jsonRows(t, out) {
		if r.Transport != "copy" || r.Mode != "stream" || r.ReadBuf != 32768 || r.Count < 1 || r.BytesPerS <= 0 {
			t.Errorf("row %+v", r)
		}
		got = append(got, fmt.Sprintf("%d/%d", r.Size, r.Conns))
	}
	slices.Sort(got)
	if fmt.Sprint(got) != "[4096/3 4096/64 65536/3 65536/64]" {
		t.Errorf("rows for sizes/connections %v, want each of 4096 and 65536 at 3 and 64:\n%s", got, out)
	}
	if slices.Contains(transportNames(false), "copy") {
		t.Errorf("default transports %v include the copy bound", transportNames(false))
	}
}

// TestIdleConns measures beside idle connections (-idle): every mode's
// server ends them cleanly (mixed's reads their first byte first), the
// ring baseline opens links for them too, and the rows say how many. The
// links' files under /dev/shm go with their rounds.
func TestIdleConns(t *testing.T) {
	multiProcess(t)
	links := func() []string {
		m, _ := filepath.Glob(filepath.Join(shm.DefaultDir, "ntbench-*"))
		return m
	}
	before := links()
	out := runBench(t, "-json", "-transports=ntb,ring", "-modes=stream,mixed", "-size=65536",
		"-duration=50ms", "-warmup=10", "-conns=2", "-idle=3", "-verify", "-pin="+testPin(t))
	rows := jsonRows(t, out)
	for _, r := range rows {
		if r.Idle != 3 || r.Count < 1 {
			t.Errorf("row %+v", r)
		}
	}
	if len(rows) != 6 { // stream, mixed-rr and mixed-bulk of each
		t.Errorf("%d rows, want 6:\n%s", len(rows), out)
	}
	for _, f := range links() {
		if !slices.Contains(before, f) {
			t.Errorf("%s left behind", f)
		}
	}
}

// TestRounds repeats a run: JSON rows come round by round, the
// transports taking turns, each numbered; -q prints one median row per
// transport; the table prints every round and then the medians.
func TestRounds(t *testing.T) {
	multiProcess(t)
	args := []string{"-transports=tcp,unix", "-modes=stream", "-size=4096", "-duration=30ms", "-warmup=10", "-rounds=3", "-pin=" + testPin(t)}
	out := runBench(t, append(args, "-json")...)
	var got []string
	for _, r := range jsonRows(t, out) {
		got = append(got, fmt.Sprintf("%s %d", r.Transport, r.Round))
	}
	if want := "[tcp 1 unix 1 tcp 2 unix 2 tcp 3 unix 3]"; fmt.Sprint(got) != want {
		t.Errorf("rows %v, want %s", got, want)
	}

	quiet := strings.Split(strings.TrimSpace(runBench(t, append(args, "-q")...)), "\n")
	if len(quiet) != 2 || !strings.HasPrefix(quiet[0], "tcp ") || !strings.HasPrefix(quiet[1], "unix ") {
		t.Errorf("-q: want one median row per transport, got:\n%s", strings.Join(quiet, "\n"))
	}

	table := runBench(t, args...)
	for _, want := range []string{"round 1 of 3", "round 3 of 3", "medians of 3 rounds:", "against tcp in this run, medians of 3 rounds"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
}

// TestBoundRatio checks the by-count comparison with the copy bound: the
// median of each round's ratio, not the ratio of the medians.
func TestBoundRatio(t *testing.T) {
	row := func(tr string, conns, round int, gbps float64) result {
		return result{Transport: tr, Mode: "stream", Size: 65536, Conns: conns, Round: round, BytesPerS: gbps * 1e9}
	}
	all := []result{
		row("ntb", 1, 1, 20), row("copy", 1, 1, 25), // 0.8
		row("ntb", 1, 2, 6), row("copy", 1, 2, 6), // 1.0 (a slow moment for both)
		row("ntb", 1, 3, 27), row("copy", 1, 3, 30), // 0.9
		row("ntb", 4, 1, 10), row("copy", 4, 1, 20),
	}
	if f, ok := boundRatio(all, all[0]); !ok || math.Abs(f-0.9) > 1e-9 {
		t.Errorf("1 connection: %v %v, want 0.9", f, ok)
	}
	if f, ok := boundRatio(all, all[6]); !ok || f != 0.5 {
		t.Errorf("4 connections: %v %v, want 0.5", f, ok)
	}
	if _, ok := boundRatio(all, row("ntb", 8, 1, 10)); ok {
		t.Error("8 connections: a ratio without a bound")
	}
	lines := byCount(medians(all), all)
	if len(lines) != 5 || !strings.Contains(lines[2], "over the copy bound (median of the rounds): 1 0.90, 4 0.50") {
		t.Errorf("by count:\n%s", strings.Join(lines, "\n"))
	}
}

// TestSameRound checks byCount's pairing of each count with the peak's
// count of the same round: a machine that slows from round to round moves
// both, and the median of the rounds' ratios keeps the count's real share
// where the medians' share does not; counts missing from a round pair
// only where they ran; one round gives no such line.
func TestSameRound(t *testing.T) {
	row := func(conns, round int, gbps float64) result {
		return result{Transport: "ntb", Mode: "stream", Size: 65536, Conns: conns, Round: round, BytesPerS: gbps * 1e9}
	}
	all := []result{
		row(1, 1, 30), row(8, 1, 27), row(64, 1, 24), // 0.90, 0.80
		row(1, 2, 20), row(8, 2, 18), // 0.90; 64 did not run
		row(1, 3, 25), row(8, 3, 23.75), row(64, 3, 25), // 0.95, 1.00
	}
	lines := strings.Join(byCount(medians(all), all), "\n")
	for _, want := range []string{
		"ntb stream 65536: peak 25000.0 MB/s at 1; 1 100 %, 8 95 %, 64 98 %",
		"against 1 connection(s) of the same round (median of the rounds' ratios; rounds paired): 1 1.00 (3), 8 0.90 (3), 64 0.90 (2); lowest 0.90 at 8",
	} {
		if !strings.Contains(lines, want) {
			t.Errorf("by count lacks %q:\n%s", want, lines)
		}
	}
	if lines := byCount(medians(all[:3]), all[:3]); len(lines) != 1 {
		t.Errorf("one round: %q, want the share line alone", lines)
	}
}

// TestSlices cuts measurements into placed slices (-slice): every row
// is a placement's, sibling, near or far, with the median round trip that placed
// it; a transport's rows together hold the slices -duration makes, less
// those whose two round trips disagreed, which every row counts; the table
// names the placement; tcp's server outlives the round trips' threads.
func TestSlices(t *testing.T) {
	multiProcess(t)
	if testPin(t) != "split" {
		t.Skip("-slice times a round trip between two CPUs; this machine gives the test one")
	}
	args := []string{"-transports=copy,tcp", "-modes=stream", "-size=65536", "-duration=100ms", "-slice=20ms", "-warmup=10"}
	rows := jsonRows(t, runBench(t, append(args, "-json")...))
	slices, moved := map[string]int{}, map[string]int{}
	for _, r := range rows {
		if r.Placement != placementOf(time.Duration(r.CoreRTTNs)) || r.CoreRTTNs <= 0 || r.Slices < 1 || r.BytesPerS <= 0 {
			t.Errorf("row %+v", r)
		}
		slices[r.Transport] += r.Slices
		moved[r.Transport] = r.Moved
	}
	for _, tr := range []string{"copy", "tcp"} {
		if n := slices[tr] + moved[tr]; slices[tr] < 1 || n != 5 {
			t.Errorf("%s: %d slices placed and %d moved, want 5 in all", tr, slices[tr], moved[tr])
		}
	}
	table := runBench(t, args...)
	if !strings.Contains(table, "placement") || !regexp.MustCompile(`(near|far), [0-9.]+(ns|µs|ms) round trip, \d slices`).MatchString(table) {
		t.Errorf("table names no placement:\n%s", table)
	}
}

// TestPlacementOf names placements by round trip: hyperthreads of one
// core, cores sharing a cache, cores sharing none.
func TestPlacementOf(t *testing.T) {
	for rtt, want := range map[time.Duration]string{
		70 * time.Nanosecond: "sibling", siblingRTT - 1: "sibling", siblingRTT: "near",
		120 * time.Nanosecond: "near", farRTT - 1: "near", farRTT: "far", 450 * time.Nanosecond: "far",
	} {
		if got := placementOf(rtt); got != want {
			t.Errorf("placementOf(%v) = %s, want %s", rtt, got, want)
		}
	}
}

// TestAwaitPlacement waits for a placement (-await): it looks until the
// round trip shows it, and gives up after the limit, a probe's error
// ending the wait.
func TestAwaitPlacement(t *testing.T) {
	rtts := []time.Duration{450, 430, 120, 70} // ns: far, far, near, sibling
	probes, slept := 0, time.Duration(0)
	probe := func() (time.Duration, error) {
		rtt := rtts[min(probes, len(rtts)-1)] * time.Nanosecond
		probes++
		return rtt, nil
	}
	sleep := func(d time.Duration) { slept += d }
	if met, err := awaitPlacement("near", probe, sleep, time.Second); !met || err != nil || probes != 3 || slept != 2*awaitEvery {
		t.Errorf("near: met %v, err %v after %d probes and %v asleep; want met after 3 and %v", met, err, probes, slept, 2*awaitEvery)
	}
	probes, slept = 0, 0
	if met, err := awaitPlacement("far", func() (time.Duration, error) { return 100 * time.Nanosecond, nil }, sleep, 4*awaitEvery); met || err != nil || slept != 4*awaitEvery {
		t.Errorf("far never comes: met %v, err %v, %v asleep; want the limit, %v", met, err, slept, 4*awaitEvery)
	}
	boom := errors.New("no CPU")
	if _, err := awaitPlacement("near", func() (time.Duration, error) { return 0, boom }, sleep, time.Second); !errors.Is(err, boom) {
		t.Errorf("probe error: %v", err)
	}
}

// TestByPlacement checks that the by-count comparison keeps placements
// apart, a line per placement, each against its own peak and its own
// bound, and that the rounds of a placement pool their slices.
func TestByPlacement(t *testing.T) {
	row := func(tr, place string, conns int, gbps float64) result {
		return result{Transport: tr, Mode: "stream", Size: 65536, Conns: conns, Placement: place, BytesPerS: gbps * 1e9, DurationNs: 1e9}
	}
	all := []result{
		row("ntb", "near", 1, 28), row("copy", "near", 1, 32), row("ntb", "far", 1, 7), row("copy", "far", 1, 7),
		row("ntb", "near", 8, 21), row("copy", "near", 8, 30), row("ntb", "far", 8, 7), row("copy", "far", 8, 7),
	}
	lines := strings.Join(byCount(medians(all), all), "\n")
	// Rounds of a placement pool their slices: a round of one 0.2 s slice
	// at 10 GB/s beside one of nine at 20 makes 19, not the median's 15.
	one := row("ntb", "near", 2, 10)
	one.DurationNs, one.Round = 2e8, 1
	nine := row("ntb", "near", 2, 20)
	nine.DurationNs, nine.Round = 18e8, 2
	if got := medians([]result{one, nine})[0].BytesPerS; math.Abs(got-19e9) > 1 {
		t.Errorf("pooled rounds: %.0f B/s, want 19e9", got)
	}
	for _, want := range []string{
		"ntb stream 65536 near: peak 28000.0 MB/s at 1; 1 100 %, 8 75 %",
		"over the copy bound (median of the rounds): 1 0.88, 8 0.70",
		"ntb stream 65536 far: peak 7000.0 MB/s at 1; 1 100 %, 8 100 %",
		"over the copy bound (median of the rounds): 1 1.00, 8 1.00",
	} {
		if !strings.Contains(lines, want) {
			t.Errorf("by count lacks %q:\n%s", want, lines)
		}
	}
}

// TestGap checks that -gap spaces pingpong's round trips and is reported.
func TestGap(t *testing.T) {
	multiProcess(t)
	rows := jsonRows(t, runBench(t, "-transports=unix", "-modes=pingpong", "-size=64", "-gap=5ms", "-duration=100ms", "-warmup=5", "-json", "-pin="+testPin(t)))
	if len(rows) != 1 {
		t.Fatalf("%d rows, want 1", len(rows))
	}
	r := rows[0]
	if r.GapNs != 5e6 {
		t.Errorf("gap_ns %d, want 5e6", r.GapNs)
	}
	if r.Count < 1 || r.Count > 21 {
		t.Errorf("%d round trips 5 ms apart in 100 ms", r.Count)
	}
	if r.P50 >= 5e6 {
		t.Errorf("p50 %d ns: the gap was timed", r.P50)
	}
}

// TestConnCounts checks that a list of connection counts measures each
// count in turn, the transports taking turns at each, and that the table
// compares every count with the row's peak.
func TestConnCounts(t *testing.T) {
	multiProcess(t)
	args := []string{"-transports=tcp,unix", "-modes=stream", "-size=4096", "-duration=30ms", "-warmup=10", "-conns=1,3", "-pin=" + testPin(t)}
	var got []string
	for _, r := range jsonRows(t, runBench(t, append(args, "-json")...)) {
		got = append(got, fmt.Sprintf("%s %d", r.Transport, r.Conns))
	}
	if want := "[tcp 1 unix 1 tcp 3 unix 3]"; fmt.Sprint(got) != want {
		t.Errorf("rows %v, want %s", got, want)
	}

	table := runBench(t, args...)
	for _, want := range []string{
		"1,3 connections in turn",
		"unix stream 4096, conns 3: throughput",
		"throughput by connection count, against the peak of each row:",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	// One line per transport, every count as a share of the peak, which
	// is one of them at 100 %.
	for _, tn := range []string{"tcp", "unix"} {
		re := regexp.MustCompile(`(?m)^  ` + tn + ` stream 4096: peak [0-9.]+ MB/s at ([13]); 1 ([0-9]+) %, 3 ([0-9]+) %; lowest ([0-9]+) % at [13]$`)
		m := re.FindStringSubmatch(table)
		if m == nil {
			t.Errorf("no by-count line for %s:\n%s", tn, table)
			continue
		}
		if !(m[1] == "1" && m[2] == "100" || m[1] == "3" && m[3] == "100") {
			t.Errorf("%s: peak at %s connections, yet the shares are %s %% and %s %%", tn, m[1], m[2], m[3])
		}
	}
}

func TestTableRun(t *testing.T) {
	multiProcess(t)
	out := runBench(t, "-transports=tcp,unix", "-modes=pingpong", "-size=64", "-count=50", "-warmup=5", "-pin="+testPin(t))
	for _, want := range []string{"GOMAXPROCS", "transport mode", "\ntcp       pingpong      64", "\nunix      pingpong      64", "against tcp in this run", "unix pingpong 64: p50 "} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// TestTraceFiles checks that -trace leaves an execution trace of each
// process: the client's at the path, each server's beside it under a name
// of its own (one server no longer overwriting another's), and each
// ntproxy's beside its server's.
func TestTraceFiles(t *testing.T) {
	multiProcess(t)
	path := filepath.Join(t.TempDir(), "run.trace")
	runBench(t, "-json", "-transports=tcp,unix,proxy", "-modes=pingpong", "-size=64", "-count=50", "-warmup=5", "-rounds=2", "-pin="+testPin(t), "-trace="+path)
	want := []string{path}
	for _, server := range []string{"tcp.pingpong.1c.r1", "unix.pingpong.1c.r1", "tcp.pingpong.1c.r2", "unix.pingpong.1c.r2", "proxy.pingpong.1c.r1"} {
		want = append(want, path+".server."+server)
	}
	for _, host := range []string{"a", "b"} {
		want = append(want, path+".server.proxy.pingpong.1c.r1.proxy-"+host)
	}
	for _, p := range want {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(b, []byte("go 1.")) || len(b) < 1024 {
			t.Errorf("%s: %d bytes, starting %q: not an execution trace", p, len(b), b[:min(len(b), 16)])
		}
	}
}

func TestUsage(t *testing.T) {
	var stdout, stderr syncBuffer
	if code := run([]string{"-h"}, nil, &stdout, &stderr); code != 0 {
		t.Errorf("-h: exit %d", code)
	}
	help := stdout.String() // help asked for goes to stdout
	if stderr.String() != "" {
		t.Errorf("-h wrote to stderr: %q", stderr.String())
	}
	for _, want := range []string{"-transports", "tcp, unix", "-modes", "-size", "-count", "-duration", "-warmup", "-conns", "-window", "-json", "-pin", "-gomaxprocs", "-verify", "-q"} {
		if !strings.Contains(help, want) {
			t.Errorf("-h lacks %q", want)
		}
	}
	for _, hidden := range []string{"-role", "-transport ", "-mode ", "-cpu int"} {
		if strings.Contains(help, hidden) {
			t.Errorf("-h shows hidden flag %q", hidden)
		}
	}

	for _, args := range [][]string{
		{"-modes=pingpong,bogus"},
		{"-transports=carrier-pigeon"},
		{"-pin=left"},
		{"-size=64,0"},
		{"-size=64k"},
		{"-count=0"},
		{"-conns=1,0"},
		{"-gap=-1ms"},
		{"-conns=2,x"},
		{"-modes=mixed", "-conns=1,2"},
		{"-duration=0s"},
		{"-await=near"},                 // without -slice
		{"-await=close", "-slice=20ms"}, // no such placement
		{"extra"},
	} {
		var stderr syncBuffer
		if code := run(args, nil, io.Discard, &stderr); code != 2 || stderr.String() == "" {
			t.Errorf("%v: exit %d, stderr %q; want 2 and a message", args, code, stderr.String())
		}
	}
}

// TestServerExitsWhenStdinCloses checks that a server with a connection
// still open exits, and closes that connection, once its stdin closes.
func TestServerExitsWhenStdinCloses(t *testing.T) {
	multiProcess(t)
	var stderr syncBuffer
	srv, err := startServer([]string{serverRole, "-transport=tcp", "-mode=pingpong"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", srv.addr)
	if err != nil {
		srv.stop()
		t.Fatal(err)
	}
	defer c.Close()
	o := &options{warmup: 3}
	if err := newPingpong(c, 64, o).warmup(); err != nil {
		t.Errorf("round trips: %v", err)
	}
	if cpu, err := srv.cpuTime(); err != nil || cpu <= 0 {
		t.Errorf("server cpu time = %v, %v", cpu, err)
	}
	if err := srv.stop(); err != nil {
		t.Errorf("stop: %v, stderr:\n%s", err, stderr.String())
	}
	if n, err := c.Read(make([]byte, 1)); err == nil {
		t.Errorf("read after server exit = %d, nil; want an error", n)
	}
}

// TestServerReportsFailure checks that a connection's error makes the
// server exit non-zero and say why.
func TestServerReportsFailure(t *testing.T) {
	multiProcess(t)
	var stderr syncBuffer
	srv, err := startServer([]string{serverRole, "-transport=unix", "-mode=stream", "-verify"}, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("unix", srv.addr)
	if err != nil {
		srv.stop()
		t.Fatal(err)
	}
	defer c.Close()
	// A chunk of 8 zero bytes: not the pattern.
	c.Write([]byte{8, 0, 0, 0, 0, 0, 0, 0})
	c.Write(make([]byte, 8))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("server kept the connection open after bad data")
	}
	if err := srv.stop(); err == nil {
		t.Error("stop: server exited 0 after a verify failure")
	}
	if !strings.Contains(stderr.String(), "verify: bytes 0..8 differ") {
		t.Errorf("server stderr %q lacks the verify failure", stderr.String())
	}
}

// blackhole is what a broken transport looks like: its server side
// swallows everything the server writes.
func init() {
	register(transport{
		name: "blackhole",
		listen: func(*options) (net.Listener, string, error) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return nil, "", err
			}
			return muteListener{ln}, ln.Addr().String(), nil
		},
		dial: func(_ *options, addr string) (net.Conn, error) {
			return net.Dial("tcp", addr)
		},
	})
}

type muteListener struct{ net.Listener }

func (l muteListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return muteConn{c}, nil
}

type muteConn struct{ net.Conn }

func (muteConn) Write(b []byte) (int, error) { return len(b), nil }

// TestHungTransportTimesOut checks that a transport that stops moving data
// ends in an error naming the hang, not in a benchmark that never returns,
// and that the other transports of the run still report.
func TestHungTransportTimesOut(t *testing.T) {
	multiProcess(t)
	defer func(d time.Duration) { hangTimeout = d }(hangTimeout)
	hangTimeout = time.Second

	var stdout, stderr syncBuffer
	code := run([]string{"-json", "-transports=blackhole,tcp", "-modes=pingpong", "-size=64", "-count=10", "-warmup=1", "-pin=none"},
		strings.NewReader(""), &stdout, &stderr)
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if !strings.Contains(stderr.String(), "blackhole pingpong: size 64: hung, killed the server after 1s") {
		t.Errorf("stderr lacks the hang:\n%s", stderr.String())
	}
	if !strings.Contains(stdout.String(), `"transport":"tcp"`) {
		t.Errorf("stdout lacks the tcp row:\n%s", stdout.String())
	}
}

// TestHelp: -h and --help print ntbench's usage and exit 0; a bad flag
// exits 2.
func TestHelp(t *testing.T) {
	for _, a := range []string{"-h", "--help"} {
		clitest.CheckHelp(t, "ntbench", a)
	}
	clitest.CheckBadUsage(t, []string{"-nosuchflag"})
}
