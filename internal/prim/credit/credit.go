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

// turnsInHalf sets a turn's size: half the rings hold two turns, 2 MiB
// each of the default link's 8 MiB, 32 64 KiB records in a run (the pool,
// Pool, holds three). Each change of connection at the rings' head costs
// the reader ~2 µs (waking the next reader, then its first copy into a
// buffer the cache has lost: 2 µs against 0.9 for the 32 KiB after, AMD VM,
// server-side event trace), so larger turns pay for fewer of them.
//
// Turns of 512 KiB, the first form, switched twice as often as 1 MiB. 2
// MiB over 1 MiB turns gained at 4-8 streams (paired medians 1.04-1.09)
// but lost at 16-64 (0.97, 0.86) while a turn left unused stalled the
// pool until the timer wrote it off (every stream ends each of ntbench's
// slices with part of a turn unused: 64 streams stalled the rings ~2 ms at
// a time, some twenty times a slice); with the write-off of idle turns
// (socklike's turnIdle) 2 MiB over 1 MiB is 1.03 and 1.14 at 64 streams,
// 1.08 at 16 (AMD VM, 32 KiB reads, two batches of 8 alternating rounds).
const turnsInHalf = 2

// Turn is the credit of one turn when each streaming connection's share
// is share, or 0 while credit does not go in turns: with TurnSlots
// streaming connections or fewer (each share is half the rings /
// TurnSlots or more), and where a turn would not hold a whole record.
//
// A turn is at most the credit the window leaves beside the baseline of
// MinShare, all a receiver can grant. A larger one, the whole window, as
// windows under a sixteenth of the rings and 16 KiB had, was never
// granted, and every writer waited for one for ever.
func Turn(rings, window, share, record int64) int64 {
	slot := min(rings/(2*TurnSlots), window)
	size := TurnSize(rings, window)
	if slot < record || size < record || share >= slot {
		return 0
	}
	return size
}

// TurnSize is the credit of a turn while credit goes in turns (see
// turnsInHalf).
func TurnSize(rings, window int64) int64 {
	return min(rings/(2*turnsInHalf), window-min(MinShare, window))
}

// Pool is how much turn credit may be out at once: three quarters of the
// rings, three turns of the default link. The quarter left holds the
// baselines (64 × 16 KiB at 64 connections is an eighth) and turns written
// off while still in use. A pool of half the rings, the first form, kept
// less in the rings than one stream alone keeps: that stream's share is
// half the rings too, but a turn counts from its grant, and part of the
// pool is always granted and not yet sent (the CREDIT on its way, the
// writer waiting for its processor). AMD VM, 64 streams, near, 32 KiB
// reads, alternating rounds, half -> three quarters: paired medians 1.12,
// 1.07, 1.08, 1.02 and 0.96 in five batches (71 rounds, 43 faster; the
// geometric mean of the 58 ratios within 0.67-1.5 is 1.04, standard error
// 0.02): a gain of a few per cent. Five eighths 1.18 and 1.02 (11 and 12
// rounds), the whole rings 1.02 (46), a quarter 0.88 (15). At 16 streams
// three quarters 0.97 ± 0.04 (19 rounds), at 32 1.13 (6).
func Pool(rings int64) int64 { return rings * 3 / 4 }
