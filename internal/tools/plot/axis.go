package plot

import (
	"math"
	"slices"
	"strconv"
	"strings"
)

// Scale maps data values to positions along an axis.
type Scale int

const (
	Linear Scale = iota
	Log
)

// Unit says how tick labels are written.
type Unit int

const (
	Number         Unit = iota // 1, 2, 500, 1.5k, 2M
	Bytes                      // 64 B, 1 KiB, 16 MiB (powers of 1024); log ticks at powers of 2
	Nanoseconds                // 500 ns, 1.5 µs, 10 ms, 2 s
	BytesPerSecond             // 800 kB/s, 1.2 GB/s (powers of 1000, as ntbench's MB/s column)
)

// Axis describes one axis of a panel.
type Axis struct {
	Label string
	Scale Scale
	Unit  Unit
	// Min and Max fix the range; both 0 (or Min ≥ Max): from the data.
	Min, Max float64
	// Ticks places labelled ticks at these values (those in range);
	// nil: chosen from the range.
	Ticks []float64
}

// valid reports whether v can be placed on a.
func (a *Axis) valid(v float64) bool {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return false
	}
	return a.Scale != Log || v > 0
}

// axisScale is an axis resolved against its data: the range and the ticks.
type axisScale struct {
	min, max float64
	log      bool
	ticks    []float64 // labelled
	minor    []float64 // grid lines only
}

// frac returns v's position along the axis, 0 at min and 1 at max.
func (s *axisScale) frac(v float64) float64 {
	if s.log {
		return (math.Log(v) - math.Log(s.min)) / (math.Log(s.max) - math.Log(s.min))
	}
	return (v - s.min) / (s.max - s.min)
}

// maxTicks bounds the automatic labelled ticks of an axis.
const maxTicks = 7

// scale resolves a against the data values vs (all valid). A y axis
// (expand) grows to whole decades (log) or to a nice bound and zero
// (linear), so its ends carry labels; an x axis is padded by a few per cent
// so markers clear the frame.
func (a *Axis) scale(vs []float64, expand bool) axisScale {
	s := axisScale{log: a.Scale == Log}
	fixed := a.Min < a.Max && a.valid(a.Min) && a.valid(a.Max)
	switch {
	case fixed:
		s.min, s.max = a.Min, a.Max
	case len(vs) == 0:
		s.min, s.max = 0, 1
		if s.log {
			s.min, s.max = 1, 10
		}
	default:
		s.min, s.max = slices.Min(vs), slices.Max(vs)
	}
	if !fixed {
		s.extend(expand, a.base())
	}
	if a.Ticks != nil {
		for _, t := range a.Ticks {
			if a.valid(t) && t >= s.min && t <= s.max {
				s.ticks = append(s.ticks, t)
			}
		}
		return s
	}
	if s.log {
		s.ticks, s.minor = logTicks(s.min, s.max, a.base())
	} else {
		step := niceStep((s.max - s.min) / 5)
		for k := math.Ceil(s.min/step - 1e-9); k*step <= s.max*(1+1e-9); k++ {
			s.ticks = append(s.ticks, k*step)
		}
	}
	return s
}

// extend widens a data range for display.
func (s *axisScale) extend(expand bool, base float64) {
	if s.log {
		lo, hi := logb(s.min, base), logb(s.max, base)
		if expand {
			lo, hi = math.Floor(lo+1e-9), math.Ceil(hi-1e-9)
			if lo == hi {
				hi++
			}
		} else {
			pad := max(hi-lo, 1) * 0.04
			lo, hi = lo-pad, hi+pad
		}
		s.min, s.max = math.Pow(base, lo), math.Pow(base, hi)
		return
	}
	if s.min == s.max {
		s.min, s.max = s.min-1, s.max+1
	}
	if expand {
		step := niceStep((max(s.max, 0) - min(s.min, 0)) / 5)
		s.min = min(0, math.Floor(s.min/step)*step)
		s.max = math.Ceil(s.max/step-1e-9) * step
		return
	}
	pad := (s.max - s.min) * 0.04
	s.min, s.max = s.min-pad, s.max+pad
}

// base is the logarithm base of a's automatic ticks.
func (a *Axis) base() float64 {
	if a.Unit == Bytes {
		return 2
	}
	return 10
}

func logb(v, base float64) float64 {
	if base == 2 {
		return math.Log2(v)
	}
	return math.Log10(v)
}

// pow returns base**k exactly for integer k.
func pow(base float64, k int) float64 {
	if base == 2 {
		return math.Ldexp(1, k)
	}
	return math.Pow10(k)
}

// logTicks returns labelled ticks at powers of base between lo and hi,
// every step-th power so that at most maxTicks remain; for base 10 it adds
// 2× and 5× when the range spans two decades or less, and returns the
// other multiples as minor grid lines.
func logTicks(lo, hi, base float64) (ticks, minor []float64) {
	k0, k1 := int(math.Ceil(logb(lo, base)-1e-9)), int(math.Floor(logb(hi, base)+1e-9))
	n := k1 - k0 + 1
	// Steps keep labels round: 1 µs, 1 ms, 1 s (base 10, every 3rd);
	// 1 KiB, 1 MiB (base 2, every 10th) or 256 B, 4 KiB, 64 KiB (every 4th).
	steps := []int{1, 2, 3, 5, 10}
	if base == 2 {
		steps = []int{1, 2, 4, 5, 10, 20}
	}
	step := 1
	for _, s := range steps {
		step = s
		if (n+s-1)/s <= maxTicks {
			break
		}
	}
	few := base == 10 && n <= 3 // two decades or less
	for k := int(math.Floor(logb(lo, base))); k <= k1; k++ {
		p := pow(base, k)
		if k >= k0 && mod(k, step) == 0 {
			ticks = append(ticks, p)
		}
		if base != 10 {
			continue
		}
		for m := 2.0; m <= 9; m++ {
			v := m * p
			if v < lo*(1-1e-9) || v > hi*(1+1e-9) {
				continue
			}
			if few && (m == 2 || m == 5) {
				ticks = append(ticks, v)
			} else {
				minor = append(minor, v)
			}
		}
	}
	return ticks, minor
}

func mod(a, b int) int { return ((a % b) + b) % b }

// niceStep returns the 1, 2 or 5 × 10^k nearest above raw.
func niceStep(raw float64) float64 {
	if raw <= 0 || math.IsNaN(raw) || math.IsInf(raw, 0) {
		return 1
	}
	p := math.Pow10(int(math.Floor(math.Log10(raw))))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw*(1-1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// Format writes v in u's units with at most three significant digits.
func (u Unit) Format(v float64) string {
	switch u {
	case Bytes:
		return scaled(v, 1024, []string{" B", " KiB", " MiB", " GiB", " TiB"})
	case Nanoseconds:
		return scaled(v, 1000, []string{" ns", " µs", " ms", " s"})
	case BytesPerSecond:
		return scaled(v, 1000, []string{" B/s", " kB/s", " MB/s", " GB/s", " TB/s"})
	default:
		return scaled(v, 1000, []string{"", "k", "M", "G", "T"})
	}
}

// scaled divides v by step until it is below step (or the suffixes run
// out) and appends the suffix reached.
func scaled(v, step float64, suffixes []string) string {
	i := 0
	for math.Abs(v) >= step && i < len(suffixes)-1 {
		v /= step
		i++
	}
	return sig3(v) + suffixes[i]
}

// sig3 formats v with at most three significant digits (all integer
// digits are kept) and no trailing zeros.
func sig3(v float64) string {
	if v == 0 {
		return "0"
	}
	digits := max(0, 2-int(math.Floor(math.Log10(math.Abs(v))+1e-9)))
	s := strconv.FormatFloat(v, 'f', digits, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	if s == "-0" {
		s = "0"
	}
	return s
}
