package ntb

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Changed's channel closes at the next Set, not before; every caller
// until then shares it, and a later caller gets a fresh one. Close closes
// it too.
func TestLinkTrackerChanged(t *testing.T) {
	closed := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	lt := NewLinkTracker()
	a, b := lt.Changed(), lt.Changed()
	require.False(t, closed(a))
	lt.Set(LinkUp, "test", time.Now())
	require.True(t, closed(a))
	require.True(t, closed(b))
	c := lt.Changed()
	require.False(t, closed(c), "a change before the call does not count")
	lt.Close()
	require.True(t, closed(c))
}
