// Package plot draws line charts as standalone SVG documents, for benchmark
// results in READMEs: one or more panels side by side, each with its own
// axes (linear or logarithmic), one line per series, a legend shared by the
// whole chart, a title and a footnote.
//
// It uses the standard library only and does no I/O beyond the writer it
// is given. The output is deterministic (the same Chart yields the same
// bytes: no maps are iterated, numbers are formatted with fixed precision)
// and is well-formed XML: every string from the caller is escaped.
//
// Colours follow the Okabe-Ito palette, chosen to stay distinguishable
// with the common forms of colour blindness; each legend entry also has
// its own marker shape, so the chart reads in greyscale too. Series that
// share a Name share a colour and a marker and appear once in the legend:
// that is how one transport's p50 (solid) and p99 (dashed) lines pair up.
//
// Concurrency: a Chart is plain data. WriteSVG only reads it, so several
// goroutines may render one Chart at once as long as none modifies it.
//
// Pitfalls: on a logarithmic axis points whose coordinate is zero,
// negative, NaN or infinite cannot be placed and are skipped (the line
// continues from the previous drawable point). Text widths are estimated
// from character counts, not measured, so very long titles or legend names
// may still crowd a narrow chart.
package plot

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"unicode/utf8"
)

// Point is one measurement, in data units.
type Point struct{ X, Y float64 }

// Style is how a series' line is stroked.
type Style int

const (
	Solid Style = iota
	Dashed
	Dotted
)

// dash returns the stroke-dasharray attribute for s, empty for Solid.
func (s Style) dash() string {
	switch s {
	case Dashed:
		return ` stroke-dasharray="7 4"`
	case Dotted:
		return ` stroke-dasharray="2 3"`
	}
	return ""
}

// Series is one line. Points are drawn in the order given; sort them by X.
type Series struct {
	Name   string // legend entry; series with equal names share colour and marker
	Style  Style
	Points []Point
}

// Key explains a line style in a panel's header, e.g. {Dashed, "p99"}.
type Key struct {
	Style Style
	Label string
}

// Panel is one set of axes.
type Panel struct {
	Title  string
	Keys   []Key // line styles explained under the title; may be empty
	X, Y   Axis
	Series []Series
}

// Chart is a whole SVG document: title, legend, panels in one row, and a
// footnote.
type Chart struct {
	Title    string
	Footnote string // machine, placement, date…; wrapped to the chart width
	// Legend fixes the order (and so the colours) of series names; names
	// not listed follow in order of first appearance. Empty: first
	// appearance only.
	Legend []string
	Panels []Panel
	Width  int // pixels; 0: 900 (one panel), 1000 (two), 1200 (three or more)
	Height int // pixels of each panel; 0: 360
}

// palette is Okabe & Ito's colour-blind-safe set, ordered so that the first
// five differ most (orange comes after vermillion's neighbours, sky blue
// after blue's); yellow, the faintest on white, comes last.
var palette = []string{"#0072B2", "#D55E00", "#009E73", "#CC79A7", "#000000", "#E69F00", "#56B4E9", "#F0E442"}

// Layout constants, in pixels. Text widths are estimated as charWidth×size
// per character, about right for a sans-serif face.
const (
	margin      = 20
	panelGap    = 28
	titleSize   = 18
	legendSize  = 13
	headerSize  = 13
	tickSize    = 11
	footSize    = 11
	charWidth   = 0.58
	lineHeight  = 1.35
	markerR     = 3.6
	swatchWidth = 26
)

// WriteSVG renders c to w.
func (c *Chart) WriteSVG(w io.Writer) error {
	if len(c.Panels) == 0 {
		return errors.New("write chart: no panels")
	}
	width := c.Width
	if width <= 0 {
		width = min(max(100+450*len(c.Panels), 900), 1200)
	}
	panelHeight := c.Height
	if panelHeight <= 0 {
		panelHeight = 360
	}
	names := c.names()

	var b bytes.Buffer
	y := float64(margin)
	// Title.
	titleY := y + titleSize
	y = titleY + 8
	// Legend, wrapped into rows.
	legend, legendBottom := layoutLegend(names, float64(margin), y+4, float64(width-2*margin))
	y = legendBottom + 10
	// Panels.
	panelW := (float64(width-2*margin) - float64(len(c.Panels)-1)*panelGap) / float64(len(c.Panels))
	panelTop := y
	y += float64(panelHeight)
	// Footnote.
	foot := wrap(c.Footnote, float64(width-2*margin), footSize)
	footTop := y + 14
	height := int(math.Ceil(footTop + float64(len(foot))*footSize*lineHeight + margin - 6))

	fmt.Fprintf(&b, `<?xml version="1.0" encoding="UTF-8"?>`+"\n")
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="Helvetica, Arial, sans-serif" font-size="%d">`+"\n",
		width, height, width, height, tickSize)
	fmt.Fprintf(&b, "<title>%s</title>\n", esc(c.Title))
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="#ffffff"/>`+"\n")
	fmt.Fprintf(&b, `<text class="title" x="%s" y="%s" font-size="%d" font-weight="bold" fill="#222222">%s</text>`+"\n",
		num(margin), num(titleY), titleSize, esc(c.Title))

	b.WriteString(`<g class="legend">` + "\n")
	for i, e := range legend {
		col, shape := palette[i%len(palette)], i%numShapes
		fmt.Fprintf(&b, `<g class="legend-entry"><line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2.5"/>`,
			num(e.x), num(e.y), num(e.x+swatchWidth), num(e.y), col)
		marker(&b, "legend-marker", shape, e.x+swatchWidth/2, e.y, col, true)
		fmt.Fprintf(&b, `<text x="%s" y="%s" font-size="%d" fill="#222222">%s</text></g>`+"\n",
			num(e.x+swatchWidth+6), num(e.y+legendSize*0.35), legendSize, esc(e.name))
	}
	b.WriteString("</g>\n")

	// Panel titles wrap to the panel width; every plot area starts below
	// the tallest header, so the panels line up.
	header := 0.0
	for i := range c.Panels {
		header = max(header, c.Panels[i].headerHeight(panelW))
	}
	for i := range c.Panels {
		x := float64(margin) + float64(i)*(panelW+panelGap)
		c.Panels[i].render(&b, i, names, x, panelTop, panelW, float64(panelHeight), header)
	}

	for i, line := range foot {
		fmt.Fprintf(&b, `<text class="footnote" x="%s" y="%s" font-size="%d" fill="#555555">%s</text>`+"\n",
			num(margin), num(footTop+footSize+float64(i)*footSize*lineHeight), footSize, esc(line))
	}
	b.WriteString("</svg>\n")
	if _, err := w.Write(b.Bytes()); err != nil {
		return fmt.Errorf("write chart: %w", err)
	}
	return nil
}

// names returns the legend order: c.Legend, then the other series names
// in order of first appearance.
func (c *Chart) names() []string {
	var names []string
	seen := func(n string) bool {
		for _, m := range names {
			if m == n {
				return true
			}
		}
		return false
	}
	for _, n := range c.Legend {
		if !seen(n) {
			names = append(names, n)
		}
	}
	for _, p := range c.Panels {
		for _, s := range p.Series {
			if !seen(s.Name) {
				names = append(names, s.Name)
			}
		}
	}
	return names
}

// legendEntry is a legend name placed at its swatch's left end.
type legendEntry struct {
	name string
	x, y float64
}

// layoutLegend places names left to right from (x, y), wrapping at width;
// bottom is the lowest pixel used.
func layoutLegend(names []string, x, y, width float64) (entries []legendEntry, bottom float64) {
	cx, cy := x, y+legendSize/2
	for _, n := range names {
		w := swatchWidth + 6 + textWidth(n, legendSize) + 22
		if cx > x && cx+w > x+width {
			cx, cy = x, cy+legendSize*lineHeight+4
		}
		entries = append(entries, legendEntry{n, cx, cy})
		cx += w
	}
	if len(names) == 0 {
		return nil, y
	}
	return entries, cy + legendSize/2
}

// boldWidth is charWidth for bold text.
const boldWidth = 0.64

// titleLines returns p's title wrapped to width w.
func (p *Panel) titleLines(w float64) []string {
	return wrapWidth(p.Title, w, headerSize, boldWidth)
}

// headerHeight is the height of p's title and style keys at width w.
func (p *Panel) headerHeight(w float64) float64 {
	h := float64(max(len(p.titleLines(w)), 1)) * headerSize * lineHeight
	if len(p.Keys) > 0 {
		h += tickSize * 1.6
	}
	return h
}

// render draws panel index idx in the box at (x, y) of size w×h, its plot
// area header pixels below y.
func (p *Panel) render(b *bytes.Buffer, idx int, names []string, x, y, w, h, header float64) {
	var xs, ys []float64
	for _, s := range p.Series {
		for _, pt := range s.Points {
			if p.X.valid(pt.X) && p.Y.valid(pt.Y) {
				xs, ys = append(xs, pt.X), append(ys, pt.Y)
			}
		}
	}
	xa, ya := p.X.scale(xs, false), p.Y.scale(ys, true)

	// Header: title, then the style keys.
	top := y + headerSize
	fmt.Fprintf(b, `<g class="panel" id="panel-%d">`+"\n", idx)
	fmt.Fprintf(b, `<text class="panel-title" x="%s" y="%s" font-size="%d" font-weight="bold" fill="#222222">`, num(x), num(top), headerSize)
	if lines := p.titleLines(w); len(lines) > 1 {
		for i, line := range lines {
			if i > 0 {
				top += headerSize * lineHeight
			}
			fmt.Fprintf(b, `<tspan x="%s" y="%s">%s</tspan>`, num(x), num(top), esc(line))
		}
	} else {
		b.WriteString(esc(p.Title))
	}
	b.WriteString("</text>\n")
	if len(p.Keys) > 0 {
		top += tickSize * 1.6
		kx := x
		for _, k := range p.Keys {
			fmt.Fprintf(b, `<g class="key"><line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#444444" stroke-width="2"%s/>`,
				num(kx), num(top-tickSize*0.35), num(kx+swatchWidth), num(top-tickSize*0.35), k.Style.dash())
			fmt.Fprintf(b, `<text x="%s" y="%s" fill="#444444">%s</text></g>`+"\n", num(kx+swatchWidth+5), num(top), esc(k.Label))
			kx += swatchWidth + 5 + textWidth(k.Label, tickSize) + 16
		}
	}

	// Plot area: room on the left for the y tick labels and the rotated
	// axis label, below for the x tick labels and the axis label.
	ylabels := make([]string, len(ya.ticks))
	labelW := 0.0
	for i, t := range ya.ticks {
		ylabels[i] = p.Y.Unit.Format(t)
		labelW = max(labelW, textWidth(ylabels[i], tickSize))
	}
	left := x + labelW + 8
	if p.Y.Label != "" {
		left += tickSize * 1.6
	}
	right := x + w - textWidth(p.X.Unit.Format(xa.max), tickSize)/2 // room for the last x label
	plotTop := y + header + 14
	bottom := y + h - tickSize*3.1 // tick labels and axis label, even if absent: panels align
	pw, ph := right-left, bottom-plotTop
	px := func(v float64) float64 { return left + xa.frac(v)*pw }
	py := func(v float64) float64 { return bottom - ya.frac(v)*ph }

	fmt.Fprintf(b, `<clipPath id="clip-%d"><rect x="%s" y="%s" width="%s" height="%s"/></clipPath>`+"\n",
		idx, num(left-markerR-1), num(plotTop-markerR-1), num(pw+2*markerR+2), num(ph+2*markerR+2))
	fmt.Fprintf(b, `<rect class="frame" x="%s" y="%s" width="%s" height="%s" fill="none" stroke="#bbbbbb"/>`+"\n",
		num(left), num(plotTop), num(pw), num(ph))

	// Grid and ticks.
	b.WriteString(`<g class="grid" stroke="#eeeeee">` + "\n")
	for _, t := range ya.minor {
		fmt.Fprintf(b, `<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", num(left), num(py(t)), num(right), num(py(t)))
	}
	b.WriteString("</g>\n")
	b.WriteString(`<g class="grid" stroke="#d8d8d8">` + "\n")
	for _, t := range ya.ticks {
		fmt.Fprintf(b, `<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", num(left), num(py(t)), num(right), num(py(t)))
	}
	for _, t := range xa.ticks {
		fmt.Fprintf(b, `<line x1="%s" y1="%s" x2="%s" y2="%s"/>`+"\n", num(px(t)), num(plotTop), num(px(t)), num(bottom))
	}
	b.WriteString("</g>\n")

	b.WriteString(`<g class="y-ticks" text-anchor="end" fill="#444444">` + "\n")
	for i, t := range ya.ticks {
		fmt.Fprintf(b, `<text class="tick" x="%s" y="%s">%s</text>`+"\n", num(left-5), num(py(t)+tickSize*0.35), esc(ylabels[i]))
	}
	b.WriteString("</g>\n")
	b.WriteString(`<g class="x-ticks" text-anchor="middle" fill="#444444">` + "\n")
	lastEnd := math.Inf(-1)
	for _, t := range xa.ticks {
		label := p.X.Unit.Format(t)
		lw := textWidth(label, tickSize)
		cx := px(t)
		if cx-lw/2 < lastEnd+6 { // would overlap the previous label: tick only
			continue
		}
		lastEnd = cx + lw/2
		fmt.Fprintf(b, `<text class="tick" x="%s" y="%s">%s</text>`+"\n", num(cx), num(bottom+tickSize*1.3), esc(label))
	}
	b.WriteString("</g>\n")
	if p.X.Label != "" {
		fmt.Fprintf(b, `<text class="axis-label" x="%s" y="%s" text-anchor="middle" fill="#222222">%s</text>`+"\n",
			num(left+pw/2), num(bottom+tickSize*2.9), esc(p.X.Label))
	}
	if p.Y.Label != "" {
		lx, ly := x+tickSize*0.9, plotTop+ph/2
		fmt.Fprintf(b, `<text class="axis-label" x="%s" y="%s" text-anchor="middle" fill="#222222" transform="rotate(-90 %s %s)">%s</text>`+"\n",
			num(lx), num(ly), num(lx), num(ly), esc(p.Y.Label))
	}

	if len(xs) == 0 {
		fmt.Fprintf(b, `<text class="no-data" x="%s" y="%s" text-anchor="middle" fill="#888888">no data</text>`+"\n",
			num(left+pw/2), num(plotTop+ph/2))
	}

	// Series.
	fmt.Fprintf(b, `<g clip-path="url(#clip-%d)">`+"\n", idx)
	for _, s := range p.Series {
		ci := indexOf(names, s.Name)
		col, shape := palette[ci%len(palette)], ci%numShapes
		fmt.Fprintf(b, `<g class="series"><title>%s</title>`+"\n", esc(p.seriesTitle(s)))
		var d strings.Builder
		var pts []Point
		for _, pt := range s.Points {
			if !p.X.valid(pt.X) || !p.Y.valid(pt.Y) {
				continue
			}
			cmd := "L"
			if len(pts) == 0 {
				cmd = "M"
			}
			fmt.Fprintf(&d, "%s%s %s", cmd, num(px(pt.X)), num(py(pt.Y)))
			pts = append(pts, pt)
		}
		if len(pts) > 0 {
			fmt.Fprintf(b, `<path class="line" d="%s" fill="none" stroke="%s" stroke-width="2" stroke-linejoin="round"%s/>`+"\n",
				d.String(), col, s.Style.dash())
		}
		for _, pt := range pts {
			marker(b, "point", shape, px(pt.X), py(pt.Y), col, s.Style == Solid)
			b.WriteString("\n")
		}
		b.WriteString("</g>\n")
	}
	b.WriteString("</g>\n</g>\n")
}

// seriesTitle is the tooltip of s: its name and what its style means.
func (p *Panel) seriesTitle(s Series) string {
	for _, k := range p.Keys {
		if k.Style == s.Style {
			return s.Name + " " + k.Label
		}
	}
	return s.Name
}

// numShapes is the number of marker shapes marker draws.
const numShapes = 5

// marker draws marker shape centred on (x, y): filled, or white inside.
func marker(b *bytes.Buffer, class string, shape int, x, y float64, col string, filled bool) {
	fill := col
	if !filled {
		fill = "#ffffff"
	}
	r := markerR
	paint := fmt.Sprintf(`fill="%s" stroke="%s" stroke-width="1.5"`, fill, col)
	switch shape {
	case 0:
		fmt.Fprintf(b, `<circle class="%s" cx="%s" cy="%s" r="%s" %s/>`, class, num(x), num(y), num(r), paint)
	case 1:
		fmt.Fprintf(b, `<rect class="%s" x="%s" y="%s" width="%s" height="%s" %s/>`, class, num(x-r*0.9), num(y-r*0.9), num(r*1.8), num(r*1.8), paint)
	case 2: // triangle up
		fmt.Fprintf(b, `<path class="%s" d="M%s %sL%s %sL%s %sZ" %s/>`, class,
			num(x), num(y-r*1.2), num(x+r*1.1), num(y+r*0.8), num(x-r*1.1), num(y+r*0.8), paint)
	case 3: // diamond
		fmt.Fprintf(b, `<path class="%s" d="M%s %sL%s %sL%s %sL%s %sZ" %s/>`, class,
			num(x), num(y-r*1.25), num(x+r*1.25), num(y), num(x), num(y+r*1.25), num(x-r*1.25), num(y), paint)
	default: // triangle down
		fmt.Fprintf(b, `<path class="%s" d="M%s %sL%s %sL%s %sZ" %s/>`, class,
			num(x), num(y+r*1.2), num(x+r*1.1), num(y-r*0.8), num(x-r*1.1), num(y-r*0.8), paint)
	}
}

func indexOf(names []string, n string) int {
	for i, m := range names {
		if m == n {
			return i
		}
	}
	return 0 // cannot happen: names holds every series name
}

// num formats a pixel coordinate with one decimal, without a trailing
// ".0".
func num(v float64) string {
	s := fmt.Sprintf("%.1f", v)
	s = strings.TrimSuffix(s, ".0")
	if s == "-0" {
		s = "0"
	}
	return s
}

// esc escapes s for XML text and attribute values; characters XML cannot
// hold become U+FFFD.
func esc(s string) string {
	var sb strings.Builder
	xml.EscapeText(&sb, []byte(s)) // a strings.Builder does not fail
	return sb.String()
}

// textWidth estimates the rendered width of s at font size size.
func textWidth(s string, size float64) float64 {
	return float64(utf8.RuneCountInString(s)) * size * charWidth
}

// wrap splits s into lines at spaces so that each fits width at font size
// size; explicit newlines are kept.
func wrap(s string, width, size float64) []string {
	return wrapWidth(s, width, size, charWidth)
}

// wrapWidth is wrap for a face whose characters are about cw×size wide.
func wrapWidth(s string, width, size, cw float64) []string {
	var lines []string
	for para := range strings.SplitSeq(s, "\n") {
		line := ""
		for _, word := range strings.Fields(para) {
			switch {
			case line == "":
				line = word
			case float64(utf8.RuneCountInString(line+" "+word))*size*cw > width:
				lines = append(lines, line)
				line = word
			default:
				line += " " + word
			}
		}
		if line != "" {
			lines = append(lines, line)
		}
	}
	return lines
}
