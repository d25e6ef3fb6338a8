package workload

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBuckets(t *testing.T) {
	prev := -1
	for _, ns := range []uint64{0, 1, 127, 128, 130, 255, 256, 1000, 1 << 40, 1<<63 - 1, 1 << 63, 1<<64 - 1} {
		i := bucketOf(ns)
		require.Less(t, i, numBuckets)
		require.Greater(t, i, prev, "ns %d", ns)
		prev = i
		require.GreaterOrEqual(t, bucketMax(i), ns)
		if i > 0 {
			require.Less(t, bucketMax(i-1), ns, "ns %d: the bucket below ends before it", ns)
		}
	}
	require.Equal(t, numBuckets-1, bucketOf(1<<64-1))
}

func TestRecorder(t *testing.T) {
	var r Recorder
	require.Equal(t, LatencySummary{}, r.Summary())
	rng := rand.New(rand.NewPCG(1, 1))
	samples := make([]time.Duration, 10000)
	for i := range samples {
		samples[i] = time.Duration(rng.ExpFloat64() * float64(50*time.Microsecond))
	}
	// Record in two halves and merge.
	var a, b Recorder
	for i, d := range samples {
		if i%2 == 0 {
			a.Record(d)
		} else {
			b.Record(d)
		}
	}
	r.Merge(&a)
	r.Merge(&b)
	slices.Sort(samples)
	exact := func(ppm int) time.Duration { return samples[(ppm*len(samples)+999_999)/1_000_000-1] }
	s := r.Summary()
	require.Equal(t, uint64(len(samples)), s.Count)
	require.Equal(t, samples[len(samples)-1], s.Max)
	for ppm, got := range map[int]time.Duration{500_000: s.P50, 900_000: s.P90, 990_000: s.P99, 999_000: s.P999} {
		want := exact(ppm)
		require.GreaterOrEqual(t, got, want, "ppm %d", ppm)
		require.LessOrEqual(t, float64(got), float64(want)*(1+1.0/subBuckets)+1, "ppm %d", ppm)
	}
	require.Equal(t, s.Max, r.Percentile(1_000_000))

	var small Recorder
	for _, d := range []time.Duration{3, 1, 2, -5} {
		small.Record(d)
	}
	require.Equal(t, time.Duration(0), small.Percentile(250_000))
	require.Equal(t, time.Duration(1), small.Percentile(500_000))
	require.Equal(t, time.Duration(3), small.Summary().Max)
}
