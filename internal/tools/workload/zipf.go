package workload

import (
	"math"
	"math/rand/v2"
)

// ZipfianTheta is YCSB's default zipfian constant: the most popular of n
// items is chosen with probability 1/zeta(n, 0.99) (about 13 % of 1000
// items, 7 % of a million).
const ZipfianTheta = 0.99

// Zipfian chooses items 0..n-1 as YCSB's ScrambledZipfianGenerator does:
// a zipfian rank (Gray et al., "Quickly generating billion-record
// synthetic databases", SIGMOD 1994, as in YCSB's ZipfianGenerator) is
// hashed with 64-bit FNV-1a, so the popular items are spread over the
// keyspace instead of being the lowest key numbers. Unlike YCSB, which
// draws ranks from 10 billion items for speed, the rank is drawn over n
// items, so the popularity of the hottest item is exactly 1/zeta(n).
//
// A Zipfian is immutable after NewZipfian and safe for concurrent use;
// each caller passes its own *rand.Rand.
type Zipfian struct {
	n     uint64
	theta float64
	alpha float64 // 1/(1-theta)
	zetan float64 // zeta(n, theta)
	eta   float64
	half  float64 // 1 + 0.5^theta: the uz bound of rank 1
}

// NewZipfian returns a chooser over n ≥ 1 items with constant theta in
// (0, 1). It sums n powers, O(n): about 10 ms per million items.
func NewZipfian(n uint64, theta float64) *Zipfian {
	n = max(n, 1)
	z := &Zipfian{n: n, theta: theta, alpha: 1 / (1 - theta)}
	z.zetan = zeta(n, theta)
	zeta2 := zeta(2, theta)
	z.eta = (1 - math.Pow(2/float64(n), 1-theta)) / (1 - zeta2/z.zetan)
	z.half = 1 + math.Pow(0.5, theta)
	return z
}

func zeta(n uint64, theta float64) float64 {
	var sum float64
	for i := uint64(1); i <= n; i++ {
		sum += 1 / math.Pow(float64(i), theta)
	}
	return sum
}

// Rank returns a zipfian rank in [0, n): 0 is the most popular.
func (z *Zipfian) Rank(r *rand.Rand) uint64 {
	u := r.Float64()
	uz := u * z.zetan
	switch {
	case uz < 1 || z.n == 1:
		return 0
	case uz < z.half:
		return 1
	}
	return min(uint64(float64(z.n)*math.Pow(z.eta*u-z.eta+1, z.alpha)), z.n-1)
}

// Next returns an item in [0, n): the scrambled rank.
func (z *Zipfian) Next(r *rand.Rand) uint64 { return z.Item(z.Rank(r)) }

// Item returns the item that rank maps to.
func (z *Zipfian) Item(rank uint64) uint64 { return fnv64(rank) % z.n }

// fnv64 is YCSB's Utils.fnvhash64: FNV-1a over the value's 8 bytes, low
// byte first, with the sign bit cleared (YCSB takes Math.abs).
func fnv64(v uint64) uint64 {
	h := uint64(0xCBF29CE484222325)
	for range 8 {
		h ^= v & 0xff
		h *= 1099511628211
		v >>= 8
	}
	if int64(h) < 0 && int64(h) != math.MinInt64 {
		h = uint64(-int64(h))
	}
	return h
}
