package proxy

import "testing"

// TestBurstMeter checks that the first writes of a row go on at once, the
// inlineRun-th and later are a burst, and a pause starts a new row.
func TestBurstMeter(t *testing.T) {
	var b burstMeter
	now := int64(1e12)
	for row := range 2 {
		now += 2 * int64(inlineGap) // a pause
		for i := 1; i <= inlineRun+2; i++ {
			if got, want := b.burst(now), i >= inlineRun; got != want {
				t.Fatalf("row %d, write %d: burst %v, want %v", row, i, got, want)
			}
			now += int64(inlineGap) / 2
		}
	}
}
