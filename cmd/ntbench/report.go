package main

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/ntstack/ntstack/internal/prim/proc"
)

// result is one row of the report: one transport, mode and size. The JSON
// keys are documented in the package comment; latencies are zero for stream.
type result struct {
	Transport  string    `json:"transport"`
	Mode       string    `json:"mode"`
	Size       int       `json:"size"`
	Conns      int       `json:"conns"`
	Beside     int       `json:"beside,omitempty"` // mixed-rr: the bulk flows beside it
	Idle       int       `json:"idle,omitempty"`   // connections open beside them, idle
	Round      int       `json:"round,omitempty"`  // of -rounds, from 1; 0 with one round
	P50        int64     `json:"p50_ns"`
	P90        int64     `json:"p90_ns"`
	P99        int64     `json:"p99_ns"`
	P999       int64     `json:"p999_ns"`
	Max        int64     `json:"max_ns"`
	Stalls     int       `json:"stalls"`
	MsgsPerS   float64   `json:"msgs_per_s"`
	BytesPerS  float64   `json:"bytes_per_s"`
	CPUPct     float64   `json:"cpu_pct"`
	Pin        string    `json:"pin"`
	Count      int       `json:"count"`       // measured messages, all connections
	DurationNs int64     `json:"duration_ns"` // measured wall time
	GOMAXPROCS int       `json:"gomaxprocs"`
	Window     int       `json:"window,omitempty"` // rate only
	GapNs      int64     `json:"gap_ns,omitempty"` // pingpong, mixed-rr with -gap: the wait between round trips
	ReadBuf    int       `json:"read_buf"`         // the server's read buffer per connection
	Host       proc.Host `json:"host"`
	Time       string    `json:"time,omitempty"`        // start of the measurement, RFC 3339, UTC
	Placement  string    `json:"placement,omitempty"`   // -slice: sibling, near or far, the row's slices' placement
	CoreRTTNs  int64     `json:"core_rtt_ns,omitempty"` // -slice: the median round trip timed around them
	Slices     int       `json:"slices,omitempty"`      // -slice: how many
	Moved      int       `json:"moved,omitempty"`       // -slice: the measurement's slices whose placement changed midway, counted in no row
}

// report prints results as they arrive, as table rows or JSON lines, and
// the comparison with tcp at the end.
type report struct {
	o       *options
	w       io.Writer
	results []result
}

const rowFormat = "%-9s %-8s %7s %5s %8s %8s %8s %8s %8s %6s %8s %9s %6s%s\n"

// begin prints the banner and the column header.
func (r *report) begin(host proc.Host, procs, clientCPU, serverCPU int) {
	if r.o.json || r.o.quiet {
		return
	}
	var place string
	switch {
	case clientCPU < 0:
		place = "unpinned: the scheduler places client and server"
	case clientCPU == serverCPU:
		place = fmt.Sprintf("client and server on CPU %d", clientCPU)
	default:
		place = fmt.Sprintf("client on CPU %d, server on CPU %d", clientCPU, serverCPU)
	}
	fmt.Fprintf(r.w, "host %s: %d CPUs, %s, kernel %s\n", host.Hostname, host.CPUs, host.CPUModel, host.Kernel)
	fmt.Fprintf(r.w, "pin=%s (%s), GOMAXPROCS %d\n", r.o.pin, place, procs)
	conns := fmt.Sprintf("%d connection(s)", r.o.conns)
	if len(r.o.connCounts) > 1 {
		conns = (&intsFlag{l: &r.o.connCounts}).String() + " connections in turn"
	}
	fmt.Fprintf(r.w, "%s, each: %d warm-up msgs, then up to %d msgs or %v\n",
		conns, r.o.warmup, r.o.count, r.o.duration)
	if r.o.idle > 0 {
		fmt.Fprintf(r.w, "%d idle connection(s) open beside them\n", r.o.idle)
	}
	if r.o.slice > 0 {
		fmt.Fprintf(r.w, "in slices of %v, each placed by the round trip between the two CPUs around it (sibling: below %v, near: below %v)\n", r.o.slice, siblingRTT, farRTT)
	}
	fmt.Fprintln(r.w)
	r.header()
}

// header prints the column header.
func (r *report) header() {
	place := ""
	if r.o.slice > 0 {
		place = "  placement"
	}
	fmt.Fprintf(r.w, rowFormat, "transport", "mode", "size", "conns", "p50", "p90", "p99", "p99.9", "max", "stalls", "msgs/s", "MB/s", "cpu%", place)
}

// round announces round k of -rounds.
func (r *report) round(k int) {
	if !r.o.json && !r.o.quiet {
		fmt.Fprintf(r.w, "round %d of %d\n", k, r.o.rounds)
	}
}

// add prints one result and keeps it for the comparison (with -rounds
// and -q, only for the medians).
func (r *report) add(res result) {
	r.results = append(r.results, res)
	if r.o.json {
		b, err := json.Marshal(res)
		if err != nil {
			panic(fmt.Sprintf("ntbench: encode result: %v", err)) // only plain fields: cannot happen
		}
		fmt.Fprintf(r.w, "%s\n", b)
		return
	}
	if r.o.rounds > 1 && r.o.quiet {
		return
	}
	r.row(res)
}

// row prints one result as a table row.
func (r *report) row(res result) {
	lat := []string{"-", "-", "-", "-", "-", "-"}
	if res.Max > 0 { // round trips were timed
		lat = []string{formatNs(res.P50), formatNs(res.P90), formatNs(res.P99), formatNs(res.P999), formatNs(res.Max), fmt.Sprint(res.Stalls)}
	}
	place := ""
	if res.Placement != "" {
		place = fmt.Sprintf("  %s, %s round trip", res.Placement, formatNs(res.CoreRTTNs))
		if res.Slices > 0 {
			place += fmt.Sprintf(", %d slices", res.Slices)
		}
		if res.Moved > 0 {
			place += fmt.Sprintf(" (%d moved)", res.Moved)
		}
	}
	fmt.Fprintf(r.w, rowFormat, res.Transport, res.Mode, fmt.Sprint(res.Size), fmt.Sprint(res.Conns),
		lat[0], lat[1], lat[2], lat[3], lat[4], lat[5],
		formatRate(res.MsgsPerS), fmt.Sprintf("%.1f", res.BytesPerS/1e6), fmt.Sprintf("%.1f", res.CPUPct), place)
}

// end prints, after several rounds, the medians of their rows, and how
// every transport fared against tcp of the same run (its medians).
func (r *report) end() {
	if r.o.json {
		return
	}
	results := r.results
	if r.o.rounds > 1 {
		results = medians(results)
		if !r.o.quiet {
			fmt.Fprintf(r.w, "\nmedians of %d rounds:\n", r.o.rounds)
			r.header()
		}
		for _, res := range results {
			r.row(res)
		}
	}
	if r.o.quiet {
		return
	}
	var lines []string
	for _, res := range results {
		if res.Transport == "tcp" {
			continue
		}
		for _, tcp := range results {
			if tcp.Transport == "tcp" && tcp.Mode == res.Mode && tcp.Size == res.Size && tcp.Conns == res.Conns && tcp.Beside == res.Beside && tcp.Placement == res.Placement {
				row := fmt.Sprintf("%s %s %d", res.Transport, res.Mode, res.Size)
				if res.Placement != "" {
					row += " " + res.Placement
				}
				if len(r.o.connCounts) > 1 {
					row += fmt.Sprintf(", conns %d", res.Conns)
					if res.Beside > 0 {
						row += fmt.Sprintf(" beside %d", res.Beside)
					}
				}
				lines = append(lines, fmt.Sprintf("  %s: %s", row, compare(res, tcp)))
			}
		}
	}
	if len(lines) > 0 {
		what := "in this run"
		if r.o.rounds > 1 {
			what = fmt.Sprintf("in this run, medians of %d rounds", r.o.rounds)
		}
		fmt.Fprintf(r.w, "\nagainst tcp %s (pin=%s):\n%s\n", what, r.o.pin, strings.Join(lines, "\n"))
	}
	if lines := byCount(results, r.results); len(lines) > 0 {
		fmt.Fprintln(r.w)
		printByCount(r.w, lines)
	}
}

// printByCount prints byCount's lines under their heading.
func printByCount(w io.Writer, lines []string) {
	fmt.Fprintf(w, "throughput by connection count, against the peak of each row:\n%s\n", strings.Join(lines, "\n"))
}

// byCount describes, for every transport×mode×size measured at several
// connection counts, the aggregate throughput at each count (medians:
// results) as a share of the highest: how evenly a transport scales
// (stream, rate and mixed-bulk rows; one line each, in the order first
// measured). With several rounds (all), a second line pairs each count
// with the peak's count of the same round: the median over the rounds of
// the one's throughput over the other's, which the machine's drift from
// round to round moves less than the medians' share (counts are measured
// one after the other, seconds apart, and on a shared VM the same run
// moves by a fifth from one minute to the next). Where the copy bound ran
// beside a transport, a last line gives the transport's throughput over
// the bound's at each count: the median over the rounds of the two
// measured moments apart, which a machine whose speed changes from second
// to second moves less than either figure.
func byCount(results, all []result) []string {
	type key struct {
		transport, mode string
		size            int
		placement       string
	}
	var order []key
	rows := map[key][]result{}
	for _, res := range results {
		if res.Mode == "pingpong" || res.Mode == "mixed-rr" {
			continue
		}
		k := key{res.Transport, res.Mode, res.Size, res.Placement}
		if rows[k] == nil {
			order = append(order, k)
		}
		rows[k] = append(rows[k], res)
	}
	var lines []string
	for _, k := range order {
		rs := rows[k]
		if len(rs) < 2 {
			continue
		}
		// By count: a placement's first rows need not be the lowest
		// counts' (a count's first slices may all have been elsewhere).
		slices.SortStableFunc(rs, func(a, b result) int { return a.Conns - b.Conns })
		peak, low := rs[0], rs[0]
		for _, res := range rs {
			if res.BytesPerS > peak.BytesPerS {
				peak = res
			}
			if res.BytesPerS < low.BytesPerS {
				low = res
			}
		}
		if peak.BytesPerS <= 0 {
			continue
		}
		var at []string
		for _, res := range rs {
			at = append(at, fmt.Sprintf("%d %.0f %%", res.Conns, 100*res.BytesPerS/peak.BytesPerS))
		}
		what := fmt.Sprintf("%s %s %d", k.transport, k.mode, k.size)
		if k.placement != "" {
			what += " " + k.placement
		}
		lines = append(lines, fmt.Sprintf("  %s: peak %.1f MB/s at %d; %s; lowest %.0f %% at %d",
			what, peak.BytesPerS/1e6, peak.Conns, strings.Join(at, ", "),
			100*low.BytesPerS/peak.BytesPerS, low.Conns))
		if line := sameRound(all, rs, peak); line != "" {
			lines = append(lines, line)
		}
		if k.transport == "copy" || rows[key{"copy", k.mode, k.size, k.placement}] == nil {
			continue
		}
		var ratios []string
		for _, res := range rs {
			if f, ok := boundRatio(all, res); ok {
				ratios = append(ratios, fmt.Sprintf("%d %.2f", res.Conns, f))
			}
		}
		if len(ratios) > 0 {
			lines = append(lines, fmt.Sprintf("    over the copy bound (median of the rounds): %s", strings.Join(ratios, ", ")))
		}
	}
	return lines
}

// sameRound is byCount's line pairing each count of rs (one transport's
// medians) with peak's count in the same round of all; empty with fewer
// than two rounds.
func sameRound(all, rs []result, peak result) string {
	same := func(t result) bool {
		return t.Transport == peak.Transport && t.Mode == peak.Mode && t.Size == peak.Size && t.Placement == peak.Placement && t.BytesPerS > 0
	}
	ref := map[int]float64{} // the peak's count, by round
	for _, t := range all {
		if same(t) && t.Conns == peak.Conns {
			ref[t.Round] = t.BytesPerS
		}
	}
	if len(ref) < 2 {
		return ""
	}
	var parts []string
	lowest, lowAt := 0.0, 0
	for _, res := range rs {
		var paired []result
		for _, t := range all {
			if same(t) && t.Conns == res.Conns && ref[t.Round] > 0 {
				paired = append(paired, t)
			}
		}
		if len(paired) == 0 {
			continue
		}
		f := median[float64](paired, func(t result) float64 { return t.BytesPerS / ref[t.Round] })
		parts = append(parts, fmt.Sprintf("%d %.2f (%d)", res.Conns, f, len(paired)))
		if lowAt == 0 || f < lowest {
			lowest, lowAt = f, res.Conns
		}
	}
	if len(parts) < 2 {
		return ""
	}
	return fmt.Sprintf("    against %d connection(s) of the same round (median of the rounds' ratios; rounds paired): %s; lowest %.2f at %d",
		peak.Conns, strings.Join(parts, ", "), lowest, lowAt)
}

// boundRatio is the median, over the rounds, of res's transport's
// throughput over the copy bound's at res's mode, size, count and
// placement.
func boundRatio(all []result, res result) (float64, bool) {
	bound := map[int]float64{} // by round
	for _, b := range all {
		if b.Transport == "copy" && b.Mode == res.Mode && b.Size == res.Size && b.Conns == res.Conns && b.Placement == res.Placement && b.BytesPerS > 0 {
			bound[b.Round] = b.BytesPerS
		}
	}
	var paired []result
	for _, t := range all {
		if t.Transport == res.Transport && t.Mode == res.Mode && t.Size == res.Size && t.Conns == res.Conns && t.Placement == res.Placement && bound[t.Round] > 0 {
			paired = append(paired, t)
		}
	}
	if len(paired) == 0 {
		return 0, false
	}
	return median[float64](paired, func(t result) float64 { return t.BytesPerS / bound[t.Round] }), true
}

// compare describes res relative to tcp, a result of the same mode and
// size.
func compare(res, tcp result) string {
	var parts []string
	if res.Max > 0 && tcp.Max > 0 {
		parts = append(parts, "p50 "+lowerThan(res.P50, tcp.P50), "p99 "+lowerThan(res.P99, tcp.P99))
	}
	if res.Mode != "pingpong" && tcp.BytesPerS > 0 {
		parts = append(parts, fmt.Sprintf("throughput %.2fx tcp", res.BytesPerS/tcp.BytesPerS))
	}
	if res.MsgsPerS > 0 && tcp.MsgsPerS > 0 && tcp.CPUPct > 0 {
		perMsg := (res.CPUPct / res.MsgsPerS) / (tcp.CPUPct / tcp.MsgsPerS)
		parts = append(parts, fmt.Sprintf("cpu per msg %.2fx tcp", perMsg))
	}
	return strings.Join(parts, ", ")
}

// lowerThan says how a latency compares with tcp's.
func lowerThan(ns, tcp int64) string {
	switch {
	case ns <= 0 || tcp <= 0:
		return "not comparable with tcp"
	case ns <= tcp:
		return fmt.Sprintf("%.1fx lower than tcp", float64(tcp)/float64(ns))
	default:
		return fmt.Sprintf("%.1fx higher than tcp", float64(ns)/float64(tcp))
	}
}

// formatNs formats a duration in nanoseconds with three significant digits
// (whole nanoseconds below 1 µs).
func formatNs(ns int64) string {
	switch {
	case ns < 1e3:
		return fmt.Sprintf("%dns", ns)
	case ns < 1e6:
		return sig3(float64(ns)/1e3) + "µs"
	case ns < 1e9:
		return sig3(float64(ns)/1e6) + "ms"
	default:
		return sig3(float64(ns)/1e9) + "s"
	}
}

// formatRate formats a per-second rate with an SI suffix.
func formatRate(v float64) string {
	switch {
	case v < 1e3:
		return sig3(v)
	case v < 1e6:
		return sig3(v/1e3) + "k"
	case v < 1e9:
		return sig3(v/1e6) + "M"
	default:
		return sig3(v/1e9) + "G"
	}
}

// sig3 formats v, at least 1 and below 1000 after scaling, with three
// significant digits.
func sig3(v float64) string {
	switch {
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}
