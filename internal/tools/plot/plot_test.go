package plot

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// sample is a two-panel chart in the shape ntbench draws.
func sample() *Chart {
	sizes := []float64{64, 1024, 16384, 65536, 1 << 20}
	line := func(name string, style Style, base float64) Series {
		s := Series{Name: name, Style: style}
		for i, x := range sizes {
			s.Points = append(s.Points, Point{x, base * float64(i+1)})
		}
		return s
	}
	return &Chart{
		Title:    "ntbench <test> & \"friends\"",
		Footnote: "host vm: 2 CPUs, AMD EPYC; pin=split; 2025-01-02",
		Legend:   []string{"ntb", "tcp"},
		Panels: []Panel{{
			Title:  "round-trip latency (pingpong) by size",
			Keys:   []Key{{Solid, "p50"}, {Dashed, "p99"}},
			X:      Axis{Label: "message size", Scale: Log, Unit: Bytes, Ticks: sizes},
			Y:      Axis{Label: "round trip", Scale: Log, Unit: Nanoseconds},
			Series: []Series{line("tcp", Solid, 20e3), line("tcp", Dashed, 60e3), line("ntb", Solid, 1.5e3), line("ntb", Dashed, 9e3)},
		}, {
			Title:  "throughput (stream) by size",
			X:      Axis{Label: "message size", Scale: Log, Unit: Bytes, Ticks: sizes},
			Y:      Axis{Label: "payload", Scale: Log, Unit: BytesPerSecond},
			Series: []Series{line("ntb", Solid, 50e6), line("tcp", Solid, 8e6)},
		}},
	}
}

func render(t *testing.T, c *Chart) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := c.WriteSVG(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// element is a generic XML element, for walking the output.
type element struct {
	XMLName  xml.Name
	Attrs    []xml.Attr `xml:",any,attr"`
	Text     string     `xml:",chardata"`
	Children []element  `xml:",any"`
}

func (e *element) attr(name string) string {
	for _, a := range e.Attrs {
		if a.Name.Local == name {
			return a.Value
		}
	}
	return ""
}

// walk calls f for e and every element below it, depth first.
func (e *element) walk(f func(*element)) {
	f(e)
	for i := range e.Children {
		e.Children[i].walk(f)
	}
}

func parse(t *testing.T, svg []byte) *element {
	t.Helper()
	var root element
	if err := xml.Unmarshal(svg, &root); err != nil {
		t.Fatalf("output is not XML: %v\n%s", err, svg)
	}
	if root.XMLName.Local != "svg" || root.XMLName.Space != "http://www.w3.org/2000/svg" {
		t.Fatalf("root element %v, want svg in the SVG namespace", root.XMLName)
	}
	return &root
}

// byClass returns the elements with class c, in document order.
func byClass(root *element, c string) []*element {
	var out []*element
	root.walk(func(e *element) {
		if e.attr("class") == c {
			out = append(out, e)
		}
	})
	return out
}

func TestWriteSVGStructure(t *testing.T) {
	c := sample()
	root := parse(t, render(t, c))

	if w, _ := strconv.Atoi(root.attr("width")); w < 900 || w > 1200 {
		t.Errorf("width %q, want 900 to 1200 px", root.attr("width"))
	}
	if got := len(byClass(root, "panel")); got != 2 {
		t.Errorf("%d panels, want 2", got)
	}
	if got := len(byClass(root, "line")); got != 6 {
		t.Errorf("%d series paths, want 6", got)
	}
	if got := len(byClass(root, "point")); got != 6*5 {
		t.Errorf("%d points, want 30", got)
	}
	var legend []string
	for _, e := range byClass(root, "legend-entry") {
		e.walk(func(e *element) {
			if e.XMLName.Local == "text" {
				legend = append(legend, e.Text)
			}
		})
	}
	if !slices.Equal(legend, []string{"ntb", "tcp"}) {
		t.Errorf("legend %q, want [ntb tcp] (once each, in Legend order)", legend)
	}
	var titles []string
	for _, e := range byClass(root, "panel-title") {
		titles = append(titles, e.Text)
	}
	if !slices.Equal(titles, []string{c.Panels[0].Title, c.Panels[1].Title}) {
		t.Errorf("panel titles %q", titles)
	}
	if f := byClass(root, "footnote"); len(f) != 1 || f[0].Text != c.Footnote {
		t.Errorf("footnote elements %v, want one with %q", f, c.Footnote)
	}

	// Same name, same colour: tcp's p50 and p99 lines; dashed only on p99.
	lines := byClass(root, "line")
	if lines[0].attr("stroke") != lines[1].attr("stroke") || lines[0].attr("stroke") == lines[2].attr("stroke") {
		t.Errorf("strokes %s %s %s: want tcp's two lines alike and ntb's different",
			lines[0].attr("stroke"), lines[1].attr("stroke"), lines[2].attr("stroke"))
	}
	if lines[0].attr("stroke-dasharray") != "" || lines[1].attr("stroke-dasharray") == "" {
		t.Error("want the Solid series solid and the Dashed series dashed")
	}
	// Legend order fixes colours: ntb is first, so it gets palette[0].
	if lines[2].attr("stroke") != palette[0] {
		t.Errorf("ntb stroke %s, want %s", lines[2].attr("stroke"), palette[0])
	}
}

// text returns the character data of e and its descendants, each
// element's joined with spaces (the lines of a wrapped title).
func (e *element) text() string {
	parts := []string{}
	if strings.TrimSpace(e.Text) != "" {
		parts = append(parts, e.Text)
	}
	for i := range e.Children {
		if t := e.Children[i].text(); t != "" {
			parts = append(parts, t)
		}
	}
	return strings.Join(parts, " ")
}

func TestLongPanelTitleWraps(t *testing.T) {
	c := sample()
	c.Panels = append(c.Panels, Panel{
		Title:  "aggregate throughput by connection count (stream, 64 KiB) and a little more",
		X:      Axis{Scale: Log, Ticks: []float64{1, 2, 4}},
		Series: []Series{{Name: "ntb", Points: []Point{{1, 1}, {2, 2}, {4, 3}}}},
	})
	root := parse(t, render(t, c))
	titles := byClass(root, "panel-title")
	if len(titles[2].Children) < 2 {
		t.Fatalf("long title in %d lines, want it wrapped", len(titles[2].Children))
	}
	if got := titles[2].text(); got != c.Panels[2].Title {
		t.Errorf("wrapped title reads %q, want %q", got, c.Panels[2].Title)
	}
	frames := byClass(root, "frame")
	for _, f := range frames[1:] {
		if f.attr("y") != frames[0].attr("y") || f.attr("height") != frames[0].attr("height") {
			t.Errorf("plot frames at y %s+%s and %s+%s: want the panels aligned",
				frames[0].attr("y"), frames[0].attr("height"), f.attr("y"), f.attr("height"))
		}
	}
	// No text reaches past its panel into the next one.
	panels := byClass(root, "panel")
	for i, line := range titles[2].Children {
		x, _ := strconv.ParseFloat(line.attr("x"), 64)
		if w := textWidth(line.Text, headerSize) * boldWidth / charWidth; x+w > 1200 {
			t.Errorf("title line %d ends at %.0f px, beyond the chart", i, x+w)
		}
	}
	if len(panels) != 3 {
		t.Errorf("%d panels, want 3", len(panels))
	}
}

func TestEscaping(t *testing.T) {
	c := sample()
	c.Panels[0].Title = `a<b & "c" 'd' ]]> µs`
	c.Panels[0].Series[0].Name = "<script>alert(1)</script>"
	c.Footnote = "ctrl \x01 char"
	svg := render(t, c)
	if bytes.Contains(svg, []byte("<script>")) || bytes.Contains(svg, []byte("<b &")) {
		t.Fatalf("unescaped text in output:\n%s", svg)
	}
	root := parse(t, svg)
	title := byClass(root, "panel-title")[0].Text
	if title != c.Panels[0].Title {
		t.Errorf("title read back as %q, want %q", title, c.Panels[0].Title)
	}
	if root.Children[0].XMLName.Local != "title" || root.Children[0].Text != c.Title {
		t.Errorf("document title %q, want %q", root.Children[0].Text, c.Title)
	}
	if f := byClass(root, "footnote")[0].Text; f != "ctrl \uFFFD char" {
		t.Errorf("footnote %q: want the control character replaced", f)
	}
}

func TestDeterministic(t *testing.T) {
	first := render(t, sample())
	for range 5 {
		if again := render(t, sample()); !bytes.Equal(first, again) {
			t.Fatal("two renderings of one chart differ")
		}
	}
}

// tickPositions returns the labels and centre x (or y) of the tick labels
// under the panel's x-ticks (or y-ticks) group.
func tickPositions(t *testing.T, root *element, panel int, group, coord string) (labels []string, pos []float64) {
	t.Helper()
	g := byClass(byClass(root, "panel")[panel], group)
	if len(g) != 1 {
		t.Fatalf("panel %d: %d %s groups", panel, len(g), group)
	}
	for _, e := range g[0].Children {
		v, err := strconv.ParseFloat(e.attr(coord), 64)
		if err != nil {
			t.Fatal(err)
		}
		labels, pos = append(labels, e.Text), append(pos, v)
	}
	return labels, pos
}

func TestLogTicks(t *testing.T) {
	// A y axis over 1.5 µs … 17 ms grows to whole decades, 1 µs … 100 ms,
	// with a labelled tick per decade at equal spacing.
	c := &Chart{Panels: []Panel{{
		X: Axis{Scale: Log, Unit: Bytes},
		Y: Axis{Scale: Log, Unit: Nanoseconds},
		Series: []Series{{Name: "a", Points: []Point{
			{64, 1.5e3}, {1024, 9e3}, {1 << 20, 17e6}, {16 << 20, 0}, // the zero cannot be drawn
		}}},
	}}}
	root := parse(t, render(t, c))
	labels, ys := tickPositions(t, root, 0, "y-ticks", "y")
	want := []string{"1 µs", "10 µs", "100 µs", "1 ms", "10 ms", "100 ms"}
	if !slices.Equal(labels, want) {
		t.Fatalf("y ticks %q, want %q", labels, want)
	}
	for i := 2; i < len(ys); i++ {
		if d0, d := ys[1]-ys[0], ys[i]-ys[i-1]; math.Abs(d-d0) > 0.2 || d >= 0 {
			t.Errorf("y tick %d: decade spacing %.1f px, want %.1f (upwards)", i, d, d0)
		}
	}
	if got := len(byClass(root, "point")); got != 3 {
		t.Errorf("%d points, want 3 (the zero skipped on a log axis)", got)
	}

	// Bytes tick at powers of two, at most maxTicks of them, aligned so the
	// labels are round: 64 B … 1 MiB spans 15 powers, so every 4th.
	labels, xs := tickPositions(t, root, 0, "x-ticks", "x")
	want = []string{"256 B", "4 KiB", "64 KiB", "1 MiB"}
	if !slices.Equal(labels, want) {
		t.Errorf("x ticks %q, want %q", labels, want)
	}
	for i := 2; i < len(xs); i++ {
		if d0, d := xs[1]-xs[0], xs[i]-xs[i-1]; math.Abs(d-d0) > 0.2 {
			t.Errorf("x tick %d: spacing %.1f px, want %.1f", i, d, d0)
		}
	}
}

func TestLogTicksNarrowRange(t *testing.T) {
	ticks, minor := logTicks(1e6, 100e6, 10)
	if want := []float64{1e6, 2e6, 5e6, 10e6, 20e6, 50e6, 100e6}; !slices.Equal(ticks, want) {
		t.Errorf("ticks %v, want %v", ticks, want)
	}
	if len(minor) != 2*6 {
		t.Errorf("%d minor grid lines, want 12 (3, 4, 6, 7, 8, 9 per decade)", len(minor))
	}
}

func TestExplicitTicksAndLinear(t *testing.T) {
	c := &Chart{Panels: []Panel{{
		X: Axis{Scale: Log, Unit: Number, Ticks: []float64{1, 2, 4, 8, 16, 32, 64, 128}},
		Y: Axis{Scale: Linear, Unit: BytesPerSecond},
		Series: []Series{{Name: "a", Points: []Point{
			{1, 0.9e9}, {2, 1.7e9}, {4, 2.2e9}, {64, 2.3e9},
		}}},
	}}}
	root := parse(t, render(t, c))
	labels, _ := tickPositions(t, root, 0, "x-ticks", "x")
	if want := []string{"1", "2", "4", "8", "16", "32", "64"}; !slices.Equal(labels, want) {
		t.Errorf("x ticks %q, want %q (128 is out of range)", labels, want)
	}
	labels, _ = tickPositions(t, root, 0, "y-ticks", "y")
	if want := []string{"0 B/s", "500 MB/s", "1 GB/s", "1.5 GB/s", "2 GB/s", "2.5 GB/s"}; !slices.Equal(labels, want) {
		t.Errorf("y ticks %q, want %q", labels, want)
	}
}

func TestCrowdedLabelsThinned(t *testing.T) {
	var ticks []float64
	for k := 6; k <= 24; k++ {
		ticks = append(ticks, math.Ldexp(1, k))
	}
	c := &Chart{Width: 900, Panels: []Panel{{X: Axis{Scale: Log, Unit: Bytes, Ticks: ticks}, Y: Axis{Scale: Log},
		Series: []Series{{Name: "a", Points: []Point{{64, 1}, {16 << 20, 10}}}}},
		{}, {}}} // three panels: narrow
	root := parse(t, render(t, c))
	labels, xs := tickPositions(t, root, 0, "x-ticks", "x")
	if len(labels) >= len(ticks) || len(labels) < 3 {
		t.Fatalf("%d of %d x labels drawn, want some dropped for room", len(labels), len(ticks))
	}
	for i := 1; i < len(xs); i++ {
		half := (textWidth(labels[i], tickSize) + textWidth(labels[i-1], tickSize)) / 2
		if xs[i]-xs[i-1] < half {
			t.Errorf("labels %q and %q overlap", labels[i-1], labels[i])
		}
	}
	if got := len(byClass(root, "no-data")); got != 2 {
		t.Errorf("%d no-data notes, want 2 (the empty panels)", got)
	}
}

func TestUnitFormat(t *testing.T) {
	for _, tc := range []struct {
		u    Unit
		v    float64
		want string
	}{
		{Bytes, 64, "64 B"}, {Bytes, 1024, "1 KiB"}, {Bytes, 1536, "1.5 KiB"}, {Bytes, 16 << 20, "16 MiB"},
		{Nanoseconds, 800, "800 ns"}, {Nanoseconds, 1500, "1.5 µs"}, {Nanoseconds, 12.34e6, "12.3 ms"}, {Nanoseconds, 2e9, "2 s"},
		{BytesPerSecond, 950e3, "950 kB/s"}, {BytesPerSecond, 2.5e9, "2.5 GB/s"},
		{Number, 0, "0"}, {Number, 64, "64"}, {Number, 1500, "1.5k"}, {Number, 0.25, "0.25"},
	} {
		if got := tc.u.Format(tc.v); got != tc.want {
			t.Errorf("Format(%v, %v) = %q, want %q", tc.u, tc.v, got, tc.want)
		}
	}
}

func TestWrapFootnote(t *testing.T) {
	long := strings.Repeat("word ", 200)
	c := sample()
	c.Footnote = long
	root := parse(t, render(t, c))
	f := byClass(root, "footnote")
	if len(f) < 2 {
		t.Fatalf("%d footnote lines, want the long footnote wrapped", len(f))
	}
	var words int
	for _, e := range f {
		if w := textWidth(e.Text, footSize); w > 1200 {
			t.Errorf("footnote line %.0f px wide", w)
		}
		words += len(strings.Fields(e.Text))
	}
	if words != 200 {
		t.Errorf("%d words in the footnote, want 200", words)
	}
}

func TestNoPanels(t *testing.T) {
	if err := (&Chart{}).WriteSVG(io.Discard); err == nil {
		t.Error("a chart without panels rendered without error")
	}
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, io.ErrClosedPipe }

func TestWriteError(t *testing.T) {
	if err := sample().WriteSVG(failWriter{}); err == nil || !strings.Contains(err.Error(), "closed pipe") {
		t.Errorf("error %v, want the writer's error wrapped", err)
	}
}
