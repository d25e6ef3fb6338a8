package main

import (
	"math/rand/v2"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	seq := func(n int) []time.Duration { // 1, 2, …, n
		s := make([]time.Duration, n)
		for i := range s {
			s[i] = time.Duration(i + 1)
		}
		return s
	}
	for _, tc := range []struct {
		n, ppm int
		want   time.Duration
	}{
		{1, 500_000, 1},
		{1, 999_000, 1},
		{2, 500_000, 1},
		{2, 500_001, 2},
		{3, 500_000, 2},
		{10, 900_000, 9},
		{10, 990_000, 10},
		{100, 990_000, 99},
		{1000, 999_000, 999}, // floating point would say 1000
		{1001, 999_000, 1000},
		{100_000, 500_000, 50_000},
		{100_000, 999_000, 99_900},
		{5, 1_000_000, 5},
		{5, 1, 1},
	} {
		if got := percentile(seq(tc.n), tc.ppm); got != tc.want {
			t.Errorf("percentile(1..%d, %d ppm) = %d, want %d", tc.n, tc.ppm, got, tc.want)
		}
	}
}

func TestSummarize(t *testing.T) {
	if got := summarize(nil); got != (latency{}) {
		t.Errorf("summarize(nil) = %+v, want zeros", got)
	}

	// 1 µs … 1000 µs (1 ms exactly is not a stall) and one 5 ms stall,
	// shuffled: 1001 samples.
	samples := make([]time.Duration, 1000, 1001)
	for i := range samples {
		samples[i] = time.Duration(i+1) * time.Microsecond
	}
	samples = append(samples, 5*time.Millisecond)
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(samples), func(i, j int) { samples[i], samples[j] = samples[j], samples[i] })

	got := summarize(samples)
	want := latency{
		p50:    501 * time.Microsecond,
		p90:    901 * time.Microsecond,
		p99:    991 * time.Microsecond,
		p999:   1000 * time.Microsecond,
		max:    5 * time.Millisecond,
		stalls: 1,
	}
	if got != want {
		t.Errorf("summarize = %+v, want %+v", got, want)
	}
}
