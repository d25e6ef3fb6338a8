package workload

import (
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestYCSB(t *testing.T) {
	for _, tc := range []struct {
		workload string
		readMin  float64 // share of reads, with slack for 4000 draws
		readMax  float64
	}{
		{"A", 0.45, 0.55},
		{"B", 0.93, 0.97},
	} {
		t.Run(tc.workload, func(t *testing.T) {
			check := checkGoroutines(t)
			kv, addr := startKV(t, nil)
			res, err := RunYCSB(testCtx(t, 30*time.Second), YCSBConfig{
				Dial:     tcpDial,
				Addr:     addr,
				Records:  500,
				Clients:  8,
				Ops:      4000,
				Workload: tc.workload,
				Seed:     7,
			})
			require.NoError(t, err)
			require.Equal(t, uint64(4000), res.Ops)
			require.Zero(t, res.Errors)
			require.Zero(t, res.VerifyErrors)
			share := float64(res.Reads) / float64(res.Ops)
			require.True(t, tc.readMin < share && share < tc.readMax, "read share %.3f", share)
			require.Equal(t, res.Reads, res.Read.Count)
			require.Equal(t, res.Updates, res.Update.Count)
			require.Equal(t, res.Ops, res.All.Count)
			require.Positive(t, res.OpsPerSec)
			require.Positive(t, res.All.P50)
			require.LessOrEqual(t, res.All.P50, res.All.P99)
			require.LessOrEqual(t, res.All.P999, res.All.Max)
			require.Positive(t, res.LoadElapsed)
			// The load wrote every key once; the run's SETs found them.
			require.GreaterOrEqual(t, kv.Stats().Commands, uint64(4500))
			require.Equal(t, int64(500), kv.dbsize())
			require.NoError(t, kv.Close())
			check()
		})
	}
}

// TestYCSBDuration runs for a duration instead of an operation count.
func TestYCSBDuration(t *testing.T) {
	_, addr := startKV(t, nil)
	cfg := YCSBConfig{Dial: tcpDial, Addr: addr, Records: 200, Clients: 4, Duration: 200 * time.Millisecond, Workload: "b", Seed: 1}
	start := time.Now()
	res, err := RunYCSB(testCtx(t, 30*time.Second), cfg)
	require.NoError(t, err)
	require.Less(t, time.Since(start), 10*time.Second)
	require.Positive(t, res.Ops)
	require.GreaterOrEqual(t, res.Elapsed, 200*time.Millisecond)
	require.Equal(t, "B", res.Workload)
}

// TestYCSBDetectsCorruption flips one byte of one GET reply on its way
// from the server: the run must report it as a verification failure.
func TestYCSBDetectsCorruption(t *testing.T) {
	ln := &corruptListener{Listener: listen(t), skip: 50}
	_, addr := startKV(t, ln)
	res, err := RunYCSB(testCtx(t, 30*time.Second), YCSBConfig{
		Dial: tcpDial, Addr: addr, Records: 300, Clients: 4, Ops: 2000, Workload: "B", Seed: 3,
	})
	require.True(t, ln.didFlip(), "the wrapper found no value to corrupt")
	require.ErrorIs(t, err, ErrVerify)
	require.Equal(t, uint64(1), res.VerifyErrors)
	require.Zero(t, res.Errors)
	require.Equal(t, uint64(2000), res.Ops)
	t.Log(err)
}

func TestYCSBConfigErrors(t *testing.T) {
	ok := YCSBConfig{Addr: "127.0.0.1:1", Records: 1, Clients: 1, Ops: 1, Workload: "A"}
	for _, mod := range []func(*YCSBConfig){
		func(c *YCSBConfig) { c.Workload = "C" },
		func(c *YCSBConfig) { c.Records = 0 },
		func(c *YCSBConfig) { c.Clients = 0 },
		func(c *YCSBConfig) { c.Ops = 0 },
		func(c *YCSBConfig) { c.Addr = "" },
	} {
		cfg := ok
		mod(&cfg)
		_, err := RunYCSB(t.Context(), cfg)
		require.Error(t, err)
	}
	// Nothing listens: the load fails at once, without retries.
	ln := listen(t)
	addr := ln.Addr().String()
	ln.Close()
	ok.Addr = addr
	start := time.Now()
	_, err := RunYCSB(t.Context(), ok)
	require.ErrorContains(t, err, "ycsb load")
	require.Less(t, time.Since(start), 5*time.Second)
}

func TestYCSBValues(t *testing.T) {
	sizes := map[int]int{}
	for k := range uint64(20000) {
		n := ycsbValueSize(k)
		require.True(t, ycsbMinValue <= n && n <= ycsbMaxValue, "size %d", n)
		sizes[n]++
		if k < 40 {
			v := ycsbValue(k, 3)
			require.NoError(t, checkYCSBValue(k, 3, v))
			require.NoError(t, checkYCSBValue(k, 9, v))
			require.ErrorIs(t, checkYCSBValue(k, 2, v), ErrVerify, "version from the future")
			for i := range v { // every single flipped bit is caught
				v[i] ^= 1 << (k % 8)
				if err := checkYCSBValue(k, 1<<31, v); !errors.Is(err, ErrVerify) {
					t.Fatalf("key %d: bit %d of byte %d flipped: %v", k, k%8, i, err)
				}
				v[i] ^= 1 << (k % 8)
			}
			require.ErrorIs(t, checkYCSBValue(k, 3, v[:len(v)-1]), ErrVerify)
			require.ErrorIs(t, checkYCSBValue(k+1, 3, v), ErrVerify)
		}
	}
	// Log-uniform: as many values in [8, 64) as in [512, 4096].
	var small, large int
	for n, c := range sizes {
		if n < 64 {
			small += c
		}
		if n >= 512 {
			large += c
		}
	}
	require.InDelta(t, 1, float64(small)/float64(large), 0.1)
	require.Equal(t, "user0000000042", ycsbKey(42))
}

func TestZipfian(t *testing.T) {
	const n, draws = 1000, 200_000
	z := NewZipfian(n, ZipfianTheta)
	r := rand.New(rand.NewPCG(1, 2))
	ranks := make([]int, n)
	items := make([]int, n)
	for range draws {
		rank := z.Rank(r)
		ranks[rank]++
		items[z.Item(rank)]++
	}
	// Rank 0 has probability 1/zeta(n) (13.4 % of 1000 items), rank 1
	// that times 2^-theta.
	p0 := 1 / zeta(n, ZipfianTheta)
	require.InDelta(t, p0, float64(ranks[0])/draws, 0.005)
	require.InDelta(t, p0/2, float64(ranks[1])/draws, 0.005) // 2^-0.99 ≈ 0.503
	require.Greater(t, ranks[0], ranks[1])
	require.Greater(t, ranks[1], ranks[10])
	require.Greater(t, ranks[10], ranks[500])

	// Scrambled: the most popular item is rank 0's, and it is not item 0.
	hot := slices.Index(items, slices.Max(items))
	require.Equal(t, int(z.Item(0)), hot)
	require.NotZero(t, hot)
	top := 0
	for i := range 10 {
		top += items[i]
	}
	require.Less(t, top, draws/10, "popularity is spread over the keyspace")

	// Seeded: the same seed gives the same sequence.
	a, b := rand.New(rand.NewPCG(5, 5)), rand.New(rand.NewPCG(5, 5))
	for range 100 {
		require.Equal(t, z.Next(a), z.Next(b))
	}
	one := NewZipfian(1, ZipfianTheta)
	require.Equal(t, uint64(0), one.Next(r))
}
