package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ntstack/ntstack/internal/tools/plot"
)

// plotResults is -plot: it reads the JSON lines ntbench -json wrote to
// o.plot ("-": stdin) and draws them into o.svg, without measuring; rows
// of several connection counts it compares, as the table does, on stdout.
func plotResults(o *options, stdin io.Reader, stdout io.Writer) error {
	in, fallback := stdin, ""
	if o.plot != "-" {
		f, err := os.Open(o.plot)
		if err != nil {
			return fmt.Errorf("plot: %w", err)
		}
		defer f.Close()
		in = f
		if fi, err := f.Stat(); err == nil {
			fallback = fi.ModTime().UTC().Format(time.DateOnly) + " (file date)"
		}
	}
	rows, err := readResults(in)
	if err != nil {
		return fmt.Errorf("plot %s: %w", o.plot, err)
	}
	if err := writeChart(o.svg, rows, fallback); err != nil {
		return err
	}
	if lines := byCount(medians(rows), rows); len(lines) > 0 {
		printByCount(stdout, lines)
	}
	return nil
}

// readResults parses JSON lines as ntbench -json writes them; blank lines
// are skipped.
func readResults(r io.Reader) ([]result, error) {
	var rows []result
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var res result
		if err := json.Unmarshal(line, &res); err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		rows = append(rows, res)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read: %w", err)
	}
	return rows, nil
}

// writeChart draws rows into the SVG file path. fallbackDate stands in for
// the date when no row carries its time (files from older ntbench builds).
func writeChart(path string, rows []result, fallbackDate string) error {
	c, err := chartOf(rows, fallbackDate)
	if err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	var b bytes.Buffer
	if err := c.WriteSVG(&b); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("chart: %w", err)
	}
	return nil
}

// chartOf lays out the chart of rows: round-trip latency (pingpong) and
// throughput (stream) by size, at the smallest connection count measured,
// and aggregate stream throughput by connection count when rows hold
// several counts (e.g. the JSON lines of runs with different -conns, put
// together). Rows repeated for one transport, mode, size and count (runs
// put together) are reduced to their median. Rows of a placement (-slice)
// are a line of their own ("ntb near"). Rate and mixed rows are not drawn.
func chartOf(rows []result, fallbackDate string) (*plot.Chart, error) {
	rows = medians(rows)
	for i := range rows {
		if rows[i].Placement != "" {
			rows[i].Transport += " " + rows[i].Placement
		}
	}
	var ping, stream []result
	for _, r := range rows {
		switch {
		case r.Mode == "pingpong" && r.P50 > 0:
			ping = append(ping, r)
		case r.Mode == "stream" && r.BytesPerS > 0:
			stream = append(stream, r)
		}
	}
	names := legendOrder(rows)
	c := &plot.Chart{
		Title:    "ntbench: byte streams between two processes on one host",
		Footnote: footnote(rows, fallbackDate),
		Legend:   names,
	}
	sizeAxis := func(rs []result) plot.Axis {
		return plot.Axis{Label: "message size", Scale: plot.Log, Unit: plot.Bytes, Ticks: distinct(rs, func(r result) float64 { return float64(r.Size) })}
	}
	if len(ping) > 0 {
		conns, ping := atFewestConns(ping)
		p := plot.Panel{
			Title: "round-trip latency (pingpong) by size" + connsNote(conns),
			Keys:  []plot.Key{{Style: plot.Solid, Label: "p50"}, {Style: plot.Dashed, Label: "p99"}},
			X:     sizeAxis(ping),
			Y:     plot.Axis{Label: "round-trip time", Scale: plot.Log, Unit: plot.Nanoseconds},
		}
		for _, n := range names {
			p.Series = append(p.Series,
				series(ping, n, plot.Solid, func(r result) (float64, float64) { return float64(r.Size), float64(r.P50) }),
				series(ping, n, plot.Dashed, func(r result) (float64, float64) { return float64(r.Size), float64(r.P99) }))
		}
		c.Panels = append(c.Panels, p)
	}
	if len(stream) > 0 {
		conns, atFewest := atFewestConns(stream)
		p := plot.Panel{
			Title: "throughput (stream) by size" + connsNote(conns),
			X:     sizeAxis(atFewest),
			Y:     plot.Axis{Label: "payload, one way", Scale: plot.Log, Unit: plot.BytesPerSecond},
		}
		for _, n := range names {
			p.Series = append(p.Series, series(atFewest, n, plot.Solid, func(r result) (float64, float64) { return float64(r.Size), r.BytesPerS }))
		}
		c.Panels = append(c.Panels, p)
	}
	if counts := distinct(stream, func(r result) float64 { return float64(r.Conns) }); len(counts) > 1 {
		size := commonSize(stream, counts)
		var rs []result
		for _, r := range stream {
			if r.Size == size {
				rs = append(rs, r)
			}
		}
		p := plot.Panel{
			Title: fmt.Sprintf("aggregate throughput by connection count (stream, %s)", plot.Bytes.Format(float64(size))),
			X:     plot.Axis{Label: "connections", Scale: plot.Log, Unit: plot.Number, Ticks: counts},
			Y:     plot.Axis{Label: "payload, one way, all connections", Scale: plot.Linear, Unit: plot.BytesPerSecond},
		}
		for _, n := range names {
			p.Series = append(p.Series, series(rs, n, plot.Solid, func(r result) (float64, float64) { return float64(r.Conns), r.BytesPerS }))
		}
		c.Panels = append(c.Panels, p)
	}
	if len(c.Panels) == 0 {
		return nil, errors.New("no pingpong or stream rows to draw")
	}
	return c, nil
}

// series is transport name's line through rows, sorted by x; xy picks the
// coordinates of a row.
func series(rows []result, name string, style plot.Style, xy func(result) (float64, float64)) plot.Series {
	s := plot.Series{Name: name, Style: style}
	for _, r := range rows {
		if r.Transport == name {
			x, y := xy(r)
			s.Points = append(s.Points, plot.Point{X: x, Y: y})
		}
	}
	slices.SortStableFunc(s.Points, func(a, b plot.Point) int { return cmpFloat(a.X, b.X) })
	return s
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// atFewestConns returns the smallest connection count among rows and the
// rows measured with it: the by-size panels show one count.
func atFewestConns(rows []result) (int, []result) {
	fewest := rows[0].Conns
	for _, r := range rows {
		fewest = min(fewest, r.Conns)
	}
	var out []result
	for _, r := range rows {
		if r.Conns == fewest {
			out = append(out, r)
		}
	}
	return fewest, out
}

func connsNote(conns int) string {
	if conns == 1 {
		return ""
	}
	return fmt.Sprintf(", %d connections", conns)
}

// commonSize is the largest size measured at every connection count in
// counts, or the largest size when none is.
func commonSize(rows []result, counts []float64) int {
	largest, common := 0, 0
	for _, size := range distinct(rows, func(r result) float64 { return float64(r.Size) }) {
		largest = int(size)
		all := true
		for _, n := range counts {
			all = all && slices.ContainsFunc(rows, func(r result) bool { return r.Size == int(size) && r.Conns == int(n) })
		}
		if all {
			common = int(size)
		}
	}
	if common == 0 {
		return largest
	}
	return common
}

// distinct returns the sorted distinct values of f over rows.
func distinct(rows []result, f func(result) float64) []float64 {
	var vs []float64
	for _, r := range rows {
		vs = append(vs, f(r))
	}
	slices.Sort(vs)
	return slices.Compact(vs)
}

// legendOrder lists the transports in rows: registered ones in their
// (sorted) order, then unknown ones (from other builds) sorted.
func legendOrder(rows []result) []string {
	var known, other []string
	for _, r := range rows {
		if _, ok := transports[r.Transport]; ok {
			known = append(known, r.Transport)
		} else {
			other = append(other, r.Transport)
		}
	}
	slices.Sort(known)
	slices.Sort(other)
	return append(slices.Compact(known), slices.Compact(other)...)
}

// medians reduces rows repeated for one transport, mode, size, connection
// count, placement (-slice) and, for mixed-rr, bulk flows beside (rounds
// of one run, or runs put together) to one row holding the median of each
// figure, keeping the order of first appearance. Rows of a placement are
// slices of one condition, however many of a round fell in it, so their
// rates pool instead: messages, bytes and CPU time over the time of all
// their slices (a round's single slice, the one most likely to have
// straddled a move of the host's, would otherwise weigh as much as
// another round's ten).
func medians(rows []result) []result {
	type key struct {
		transport, mode string
		size, conns     int
		beside          int
		placement       string
	}
	var order []key
	groups := map[key][]result{}
	for _, r := range rows {
		k := key{r.Transport, r.Mode, r.Size, r.Conns, r.Beside, r.Placement}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	out := make([]result, 0, len(order))
	for _, k := range order {
		g := groups[k]
		m := g[0]
		m.P50 = median[int64](g, func(r result) float64 { return float64(r.P50) })
		m.P90 = median[int64](g, func(r result) float64 { return float64(r.P90) })
		m.P99 = median[int64](g, func(r result) float64 { return float64(r.P99) })
		m.P999 = median[int64](g, func(r result) float64 { return float64(r.P999) })
		m.Max = median[int64](g, func(r result) float64 { return float64(r.Max) })
		m.Stalls = int(median[int64](g, func(r result) float64 { return float64(r.Stalls) }))
		m.MsgsPerS = median[float64](g, func(r result) float64 { return r.MsgsPerS })
		m.BytesPerS = median[float64](g, func(r result) float64 { return r.BytesPerS })
		m.CPUPct = median[float64](g, func(r result) float64 { return r.CPUPct })
		if m.Placement != "" {
			if msgs, bytes, cpu, ok := pooled(g); ok {
				m.MsgsPerS, m.BytesPerS, m.CPUPct = msgs, bytes, cpu
			}
		}
		m.CoreRTTNs = median[int64](g, func(r result) float64 { return float64(r.CoreRTTNs) })
		m.Slices, m.Moved = 0, 0
		for _, r := range g {
			m.Slices += r.Slices
			m.Moved += r.Moved
		}
		m.Round = 0
		out = append(out, m)
	}
	return out
}

// pooled returns the rates of rows g over their time together; not ok if
// the rows carry no time.
func pooled(g []result) (msgsPerS, bytesPerS, cpuPct float64, ok bool) {
	var secs float64
	for _, r := range g {
		d := float64(r.DurationNs) / 1e9
		secs += d
		msgsPerS += r.MsgsPerS * d
		bytesPerS += r.BytesPerS * d
		cpuPct += r.CPUPct * d
	}
	if secs == 0 {
		return 0, 0, 0, false
	}
	return msgsPerS / secs, bytesPerS / secs, cpuPct / secs, true
}

// median returns the median of f over g, as the type of the figure.
func median[T int64 | float64](g []result, f func(result) float64) T {
	vs := make([]float64, len(g))
	for i, r := range g {
		vs[i] = f(r)
	}
	slices.Sort(vs)
	n := len(vs)
	if n%2 == 1 {
		return T(vs[n/2])
	}
	return T((vs[n/2-1] + vs[n/2]) / 2)
}

// footnote describes where and how rows were measured: host, placement,
// GOMAXPROCS, date, and what the figures mean.
func footnote(rows []result, fallbackDate string) string {
	var hosts, pins, procs, dates []string
	for _, r := range rows {
		h := r.Host
		hosts = append(hosts, fmt.Sprintf("host %s: %d CPUs, %s, kernel %s", h.Hostname, h.CPUs, h.CPUModel, h.Kernel))
		pins = append(pins, r.Pin)
		procs = append(procs, fmt.Sprint(r.GOMAXPROCS))
		if t, err := time.Parse(time.RFC3339, r.Time); err == nil {
			dates = append(dates, t.UTC().Format(time.DateOnly))
		}
	}
	set := func(vs []string) string {
		slices.Sort(vs)
		return strings.Join(slices.Compact(vs), ", ")
	}
	date := fallbackDate
	if len(dates) > 0 {
		slices.Sort(dates)
		date = dates[0]
		if last := dates[len(dates)-1]; last != date {
			date += " to " + last
		}
	}
	if date == "" {
		date = "date not recorded"
	}
	return fmt.Sprintf("%s; pin=%s, GOMAXPROCS %s; %s. Latency: nearest-rank percentiles of every round trip. "+
		"Throughput: payload bytes in one direction per second (MB = 10^6 B). Compare transports within one run only.",
		set(hosts), set(pins), set(procs), date)
}
