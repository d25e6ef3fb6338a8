// Package credit is the arithmetic by which a receiver divides its inbound
// rings among the connections that stream into them: shares of half the
// rings while few connections stream, turns from a pool beyond (socklike's
// credit, socklike/turns.go). ntbench's copy bound copies with the same
// runs and as much in flight, so both take them from here.
package credit

// MinShare is the least window share: below it credit round trips
// dominate.
const MinShare = 16 << 10

// Share is each of n streaming connections' share of rings bytes of
// inbound rings under a window: half the rings split evenly, at least
// MinShare, at most the window.
func Share(rings, window, n int64) int64 {
	return min(window, max(rings/(2*max(n, 1)), MinShare))
}

// TurnSlots: beyond this many streaming connections credit goes in turns.
//
// It is 3, not 8 as first: at 4-8 streaming connections shares come back
// in credit steps of four records, so the connections' records took turns
// in the ring in runs of 4-5, and each change of connection there costs
// the reader 1-2 µs (waking and scheduling the next reader): 10-14 % of
// its time at 8 connections, 5-6 % in turns' runs of 10-16 (AMD VM, near,
// 32 KiB reads, timed in a throwaway). Alternating runs, turns from 4
// streams against from 9: 8 connections 25.7 against 24.0 GB/s (11 and 10
// runs; three earlier batches +3 %, +6 %, -3 %), 6 connections 25.6
// against 24.8 (8 and 11), 4 connections within noise (-5 % to +8 % over
// four batches), 3 unchanged.
const TurnSlots = 3

// turnsInHalf sets a turn's size: half the rings hold four turns, 1 MiB
// each of the default link's 8 MiB, sixteen 64 KiB records in a run (the
// pool, Pool, holds six) — twice that while at most FewStreams
// connections live. Turns of half that (512 KiB), the first form,
// switched writers and readers twice as often.
//
// 2 MiB turns halve the changes of connection at the ring's head (the
// hand-overs and parks a turn costs the reader) and gain at few streams,
// but at many the rings run empty more often (each writer's turn starts
// later, the pipeline of turns drains: at 64 streams the reader found its
// ring empty 1.5 M times a run against 0.9 M, and both processes slept),
// so they lose there. AMD VM, 32 KiB reads, 10 alternating rounds each,
// 2 MiB over 1 MiB turns, paired medians: 4 streams 1.08 and 1.04 (two
// batches), 6 streams 1.09, 8 streams 1.04; 16 streams 0.97, 64 streams
// 0.86 (and 0.87 and 0.91-0.92 with pools of half and all the rings,
// earlier).
const (
	turnsInHalf = 4
	FewStreams  = 8
)

// Turn is the credit of one turn for live connections (counted, not only
// the streaming ones: the receiver looks at it on every poll while
// writers wait in line) when each streaming one's share is share, or 0
// while credit does not go in turns: with TurnSlots streaming connections
// or fewer (each share is half the rings / TurnSlots or more), and where
// a turn would not hold a whole record.
//
// A turn is at most the credit the window leaves beside the baseline of
// MinShare, all a receiver can grant. A larger one, the whole window, as
// windows under a sixteenth of the rings and 16 KiB had, was never
// granted, and every writer waited for one for ever.
func Turn(rings, window, share, record, live int64) int64 {
	slot := min(rings/(2*TurnSlots), window)
	size := TurnSize(rings, window, live)
	if slot < record || size < record || share >= slot {
		return 0
	}
	return size
}

// TurnSize is the credit of a turn while credit goes in turns (see
// turnsInHalf).
func TurnSize(rings, window, live int64) int64 {
	n := int64(turnsInHalf)
	if live <= FewStreams {
		n /= 2
	}
	return min(rings/(2*n), window-min(MinShare, window))
}

// Pool is how much turn credit may be out at once: three quarters of the
// rings, six turns of the default link (three at few streams). The
// quarter left holds the baselines (64 × 16 KiB at 64 connections is an
// eighth) and turns written off while still in use. A pool of half the
// rings, the first form, kept less in the rings than one stream alone
// keeps: that stream's share is half the rings too, but a turn counts
// from its grant, and part of the pool is always granted and not yet sent
// (the CREDIT on its way, the writer waiting for its processor). AMD VM,
// 64 streams, near, 32 KiB reads, alternating rounds, half -> three
// quarters: paired medians 1.12, 1.07, 1.08, 1.02 and 0.96 in five
// batches (71 rounds, 43 faster; the geometric mean of the 58 ratios
// within 0.67-1.5 is 1.04, standard error 0.02): a gain of a few per
// cent. Five eighths 1.18 and 1.02 (11 and 12 rounds), the whole rings
// 1.02 (46), a quarter 0.88 (15). At 16 streams three quarters 0.97 ±
// 0.04 (19 rounds), at 32 1.13 (6).
func Pool(rings int64) int64 { return rings * 3 / 4 }
