package main

import (
	"slices"
	"time"
)

// stallThreshold is the round-trip time above which a round trip counts as
// a stall: far above any healthy loopback round trip, and about what a
// process loses when the scheduler gives its CPU to another for a tick.
const stallThreshold = time.Millisecond

// latency summarizes a set of round-trip times.
type latency struct {
	p50, p90, p99, p999, max time.Duration
	stalls                   int // round trips longer than stallThreshold
}

// summarize returns the exact percentiles of samples. It sorts samples in
// place. An empty set summarizes to zeros.
func summarize(samples []time.Duration) latency {
	if len(samples) == 0 {
		return latency{}
	}
	slices.Sort(samples)
	firstStall, _ := slices.BinarySearch(samples, stallThreshold+1)
	return latency{
		p50:    percentile(samples, 500_000),
		p90:    percentile(samples, 900_000),
		p99:    percentile(samples, 990_000),
		p999:   percentile(samples, 999_000),
		max:    samples[len(samples)-1],
		stalls: len(samples) - firstStall,
	}
}

// percentile returns the nearest-rank percentile of sorted, a non-empty
// ascending slice: the smallest sample with at least ppm millionths of all
// samples at or below it. Integer arithmetic keeps p99.9 of 1000 samples
// the 999th, where 0.999*1000 in floating point rounds up to the 1000th.
func percentile(sorted []time.Duration, ppm int) time.Duration {
	rank := (ppm*len(sorted) + 999_999) / 1_000_000 // ceil(ppm/1e6 * n)
	return sorted[max(rank, 1)-1]
}
