package credit

import "testing"

// The default link: 8 MiB of inbound rings, a 4 MiB window, 64 KiB records.
func TestTurns(t *testing.T) {
	const rings, window, record = 8 << 20, 4 << 20, 64 << 10
	for _, c := range []struct {
		streams, want int64
	}{
		{1, 0},         // one stream: its share, half the rings
		{TurnSlots, 0}, // shares of a sixth: no turns yet
		{TurnSlots + 1, rings / 4},
		{64, rings / 4},
	} {
		share := Share(rings, window, c.streams)
		if got := Turn(rings, window, share, record); got != c.want {
			t.Errorf("%d streams (share %d): turn %d, want %d", c.streams, share, got, c.want)
		}
	}
	if got := Share(rings, window, 1000); got != MinShare {
		t.Errorf("share of 1000 streams %d, want MinShare", got)
	}
	// A turn never passes what the window leaves beside the baseline, nor
	// is one smaller than a record given.
	if got := Turn(rings, 32<<10, MinShare, 16<<10); got != 16<<10 {
		t.Errorf("turn under a 32 KiB window %d, want 16 KiB", got)
	}
	if got := Turn(rings, 32<<10, MinShare, record); got != 0 {
		t.Errorf("turn under a 32 KiB window of 64 KiB records %d, want none", got)
	}
	if got, want := Pool(rings), int64(6<<20); got != want {
		t.Errorf("pool %d, want %d", got, want)
	}
}
