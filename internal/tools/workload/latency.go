package workload

import (
	"math/bits"
	"time"
)

// Recorder is a latency histogram with bounded memory: it keeps counts in
// log-linear buckets, not samples, so it takes the same 30 KiB whether it
// records ten durations or ten billion, and two Recorders merge exactly.
//
// Durations below subBuckets*2 ns (128 ns) each have a bucket of their
// own. Above that, every power of two [2^k, 2^(k+1)) is cut into
// subBuckets equal buckets, so a bucket is at most 1/subBuckets (1.6 %)
// of its lower bound wide; a percentile reports its bucket's upper bound
// (clamped to the largest duration recorded), an overestimate by at most
// that much. Max and Mean are exact.
//
//	index 0..127:            d = index ns, exact
//	index 128 + (s-1)*64 + j: d in [(64+j)<<s, (65+j)<<s), s = bits.Len64(d)-7
//	last index (s = 57):      128 + 56*64 + 63 = 3775, so 128 + 57*64 = 3776 buckets * 8 B = 30 KiB
//
// A Recorder is not safe for concurrent use; the zero value is ready.
type Recorder struct {
	counts [numBuckets]uint64
	n      uint64
	sum    uint64 // ns; wraps only after 584 years of recorded time
	max    uint64 // ns
}

const (
	subBucketBits = 6
	subBuckets    = 1 << subBucketBits // buckets per power of two
	numBuckets    = 2*subBuckets + (64-subBucketBits-1)*subBuckets
)

// bucketOf returns the index of the bucket holding ns.
func bucketOf(ns uint64) int {
	if ns < 2*subBuckets {
		return int(ns)
	}
	s := bits.Len64(ns) - (subBucketBits + 1)
	return 2*subBuckets + (s-1)*subBuckets + int(ns>>s) - subBuckets
}

// bucketMax returns the largest duration, in ns, that falls in bucket i.
func bucketMax(i int) uint64 {
	if i < 2*subBuckets {
		return uint64(i)
	}
	i -= 2 * subBuckets
	s := i/subBuckets + 1
	j := uint64(i % subBuckets)
	return (subBuckets+j+1)<<s - 1
}

// Record adds one duration; negative durations count as zero.
func (r *Recorder) Record(d time.Duration) {
	ns := uint64(max(d, 0))
	r.counts[bucketOf(ns)]++
	r.n++
	r.sum += ns
	r.max = max(r.max, ns)
}

// Merge adds every duration recorded in o to r.
func (r *Recorder) Merge(o *Recorder) {
	for i, c := range o.counts {
		r.counts[i] += c
	}
	r.n += o.n
	r.sum += o.sum
	r.max = max(r.max, o.max)
}

// Count returns how many durations were recorded.
func (r *Recorder) Count() uint64 { return r.n }

// Percentile returns the nearest-rank percentile for ppm millionths
// (990_000 is p99): the upper bound of the bucket holding the smallest
// recorded duration with at least ppm/1e6 of all durations at or below it.
// It returns 0 if nothing was recorded.
func (r *Recorder) Percentile(ppm int) time.Duration {
	if r.n == 0 {
		return 0
	}
	ppm = min(max(ppm, 0), 1_000_000)
	rank := max((uint64(ppm)*r.n+999_999)/1_000_000, 1) // ceil(ppm/1e6 * n)
	var seen uint64
	for i, c := range r.counts {
		seen += c
		if seen >= rank {
			return time.Duration(min(bucketMax(i), r.max))
		}
	}
	return time.Duration(r.max) // unreachable: the counts sum to n
}

// LatencySummary is what a Recorder reports.
type LatencySummary struct {
	Count uint64        `json:"count"`
	Mean  time.Duration `json:"mean_ns"`
	P50   time.Duration `json:"p50_ns"`
	P90   time.Duration `json:"p90_ns"`
	P99   time.Duration `json:"p99_ns"`
	P999  time.Duration `json:"p999_ns"`
	Max   time.Duration `json:"max_ns"`
}

// Summary returns the count, mean, p50, p90, p99, p99.9 and max.
func (r *Recorder) Summary() LatencySummary {
	if r.n == 0 {
		return LatencySummary{}
	}
	return LatencySummary{
		Count: r.n,
		Mean:  time.Duration(r.sum / r.n),
		P50:   r.Percentile(500_000),
		P90:   r.Percentile(900_000),
		P99:   r.Percentile(990_000),
		P999:  r.Percentile(999_000),
		Max:   time.Duration(r.max),
	}
}
