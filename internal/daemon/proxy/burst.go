package proxy

import "time"

// A proxy-mode leg's bytes go on at once on the goroutine that has them —
// the pump sending, the receive loop delivering — unless they come in a
// burst, which the hand-off to runSend or runDeliver batches: one frame
// and one write for many of the application's writes, while the goroutine
// that has them goes back to reading. A request or a reply after a pause
// is no burst; the write after it within inlineGap, and a stream of small
// writes, are. (In shared-pool mode runPool hands every write to runSend:
// it also watches the application's reads, which must not wait on a
// send.)
const (
	// inlineGap: bytes that come within this of the previous ones are in
	// a row with them. It is shorter than any round trip through two
	// proxies, so a connection's next request never counts.
	inlineGap = 20 * time.Microsecond
	// inlineRun: the inlineRun-th write in a row and those after it are a
	// burst.
	inlineRun = 2
)

// burstMeter tells a burst from a request; its owner's lock guards it.
type burstMeter struct {
	at  int64 // when the last bytes came (UnixNano)
	run int   // how many writes in a row, those included
}

// burst notes bytes that came at now (UnixNano) and reports whether they
// are in a burst.
func (b *burstMeter) burst(now int64) bool {
	if now-b.at < int64(inlineGap) {
		b.run++
	} else {
		b.run = 1
	}
	b.at = now
	return b.run >= inlineRun
}
