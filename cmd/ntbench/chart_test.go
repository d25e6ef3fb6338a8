package main

import (
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// cannedRows returns JSON lines as ntbench -json writes them: pingpong and
// stream for three transports at three sizes, stream also at 4
// connections, and a rate row the chart leaves out.
func cannedRows(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	enc := json.NewEncoder(&b)
	add := func(r result) {
		r.Pin, r.GOMAXPROCS, r.Host, r.Time = "split", 1, testHost, "2025-03-04T10:00:00Z"
		if err := enc.Encode(r); err != nil {
			t.Fatal(err)
		}
	}
	for i, tr := range []string{"tcp", "ntb", "unix"} {
		for j, size := range []int{64, 4096, 65536} {
			f := float64((i + 1) * (j + 1))
			add(result{Transport: tr, Mode: "pingpong", Size: size, Conns: 1,
				P50: int64(2000 * f), P90: int64(3000 * f), P99: int64(9000 * f), P999: int64(20000 * f), Max: int64(1e6 * f)})
			for _, conns := range []int{1, 4} {
				add(result{Transport: tr, Mode: "stream", Size: size, Conns: conns, BytesPerS: 1e8 * f * float64(conns)})
			}
		}
		add(result{Transport: tr, Mode: "rate", Size: 64, Conns: 1, P50: 1, P99: 2, Max: 3, Window: 32})
	}
	return b.String()
}

func TestPlotFromJSON(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "bench.jsonl"), filepath.Join(dir, "bench.svg")
	if err := os.WriteFile(in, []byte(cannedRows(t)), 0o644); err != nil {
		t.Fatal(err)
	}
	// The rows hold two connection counts: -plot compares them.
	stdout := runBench(t, "-plot", in, "-svg", out)
	if want := "  ntb stream 65536: peak 2400.0 MB/s at 4; 1 25 %, 4 100 %; lowest 25 % at 1\n"; !strings.Contains(stdout, want) {
		t.Errorf("-plot printed %q, want a line %q", stdout, want)
	}
	svg, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if err := xml.Unmarshal(svg, new(struct{})); err != nil {
		t.Fatalf("not XML: %v", err)
	}
	texts := svgTexts(t, svg)
	for _, want := range []string{
		"ntb", "tcp", "unix", "p50", "p99",
		"round-trip latency (pingpong) by size",
		"throughput (stream) by size",
		"aggregate throughput by connection count (stream, 64 KiB)",
		"64 B", "4 KiB", "64 KiB", "1", "4",
	} {
		if !slices.Contains(texts, want) {
			t.Errorf("chart lacks the text %q; has %q", want, texts)
		}
	}
	foot := strings.Join(texts, " ")
	for _, want := range []string{"host vm: 2 CPUs, AMD EPYC, kernel 6.1.0", "pin=split", "GOMAXPROCS 1", "2025-03-04"} {
		if !strings.Contains(foot, want) {
			t.Errorf("footnote lacks %q", want)
		}
	}
	if n := strings.Count(string(svg), `class="line"`); n != 3*2+3+3 {
		t.Errorf("%d lines, want 12: p50 and p99 per transport, then one per transport in each throughput panel", n)
	}

	// From stdin, the same bytes.
	out2 := filepath.Join(dir, "stdin.svg")
	var stderr syncBuffer
	if code := run([]string{"-plot=-", "-svg=" + out2}, strings.NewReader(cannedRows(t)), io.Discard, &stderr); code != 0 {
		t.Fatalf("-plot -: exit %d: %s", code, stderr.String())
	}
	if svg2, err := os.ReadFile(out2); err != nil || string(svg2) != string(svg) {
		t.Errorf("chart from stdin differs from the chart from the file (%v)", err)
	}
}

// svgTexts returns the content of every text element in svg; the lines
// of a wrapped text (its tspans) are joined with spaces.
func svgTexts(t *testing.T, svg []byte) []string {
	t.Helper()
	var texts []string
	var cur []string
	d := xml.NewDecoder(strings.NewReader(string(svg)))
	in := false
	for {
		tok, err := d.Token()
		if err == io.EOF {
			return texts
		}
		if err != nil {
			t.Fatalf("not XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if tok.Name.Local == "text" {
				in, cur = true, nil
			}
		case xml.CharData:
			if in {
				cur = append(cur, string(tok))
			}
		case xml.EndElement:
			if tok.Name.Local == "text" {
				in = false
				texts = append(texts, strings.Join(cur, " "))
			}
		}
	}
}

func TestChartMedians(t *testing.T) {
	row := func(p50 int64, bps float64) result {
		return result{Transport: "tcp", Mode: "pingpong", Size: 64, Conns: 1, P50: p50, P99: 2 * p50, Max: 3 * p50, BytesPerS: bps}
	}
	got := medians([]result{row(10, 1), row(30, 5), row(20, 2)})
	if len(got) != 1 || got[0].P50 != 20 || got[0].P99 != 40 || got[0].BytesPerS != 2 {
		t.Errorf("medians = %+v, want one row with p50 20, p99 40, bytes/s 2", got)
	}
	c, err := chartOf([]result{row(10, 1)}, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Panels) != 1 || !strings.Contains(c.Footnote, "date not recorded") {
		t.Errorf("one pingpong row, no time: %d panels, footnote %q", len(c.Panels), c.Footnote)
	}
	if _, err := chartOf([]result{{Transport: "tcp", Mode: "rate", Size: 64, Conns: 1, P50: 1, Max: 1}}, ""); err == nil {
		t.Error("a chart of rate rows alone: want an error, nothing to draw")
	}
}

func TestPlotUsage(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"-plot", filepath.Join(dir, "x.jsonl")}, 2, "-plot needs -svg"},
		{[]string{"-plot", filepath.Join(dir, "missing.jsonl"), "-svg", filepath.Join(dir, "x.svg")}, 1, "no such file"},
	} {
		var stderr syncBuffer
		if code := run(tc.args, strings.NewReader(""), io.Discard, &stderr); code != tc.code || !strings.Contains(stderr.String(), tc.msg) {
			t.Errorf("ntbench %s: exit %d, stderr %q; want exit %d and %q", strings.Join(tc.args, " "), code, stderr.String(), tc.code, tc.msg)
		}
	}
	bad := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(bad, []byte("{\"transport\":\"tcp\"}\n\nnot json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer
	if code := run([]string{"-plot", bad, "-svg", filepath.Join(dir, "x.svg")}, strings.NewReader(""), io.Discard, &stderr); code != 1 || !strings.Contains(stderr.String(), "line 3") {
		t.Errorf("bad JSON: exit %d, stderr %q; want exit 1 naming line 3", code, stderr.String())
	}
}

// TestSVGFlagsStayWithClient checks that -svg and -plot are not passed to
// the server process, which has nothing to draw.
func TestSVGFlagsStayWithClient(t *testing.T) {
	var o options
	fs := newFlagSet(&o, io.Discard)
	if err := fs.Parse([]string{"-svg=a.svg", "-plot=b.jsonl", "-size=64", "-q"}); err != nil {
		t.Fatal(err)
	}
	got := setFlags(fs)
	if want := []string{"-q=true", "-size=64"}; !slices.Equal(got, want) {
		t.Errorf("server flags %q, want %q", got, want)
	}
}

// TestSVGAfterRun measures tcp briefly with -svg and checks the chart has
// both panels and the measurement's date. It asserts no timing.
func TestSVGAfterRun(t *testing.T) {
	multiProcess(t)
	out := filepath.Join(t.TempDir(), "run.svg")
	runBench(t, "-q", "-transports=tcp", "-modes=pingpong,stream", "-size=64,4096", "-count=50", "-warmup=5", "-pin="+testPin(t), "-svg="+out)
	svg, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	texts := svgTexts(t, svg)
	for _, want := range []string{"tcp", "round-trip latency (pingpong) by size", "throughput (stream) by size"} {
		if !slices.Contains(texts, want) {
			t.Errorf("chart lacks the text %q; has %q", want, texts)
		}
	}
	if slices.Contains(texts, "date not recorded") || strings.Contains(strings.Join(texts, " "), "date not recorded") {
		t.Error("the chart of a run lacks the run's date")
	}
}
