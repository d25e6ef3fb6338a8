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

// Publish keeps a cause only on a down link and suspicion only on an up
// one, and the accessors follow the latest event.
func TestLinkTrackerCauseAndSuspect(t *testing.T) {
	lt := NewLinkTracker()
	defer lt.Close()
	lt.Publish(LinkEvent{State: LinkUp, Cause: CauseGone, Reason: "peer attached"})
	require.Equal(t, CauseNone, lt.Cause(), "an up link has no cause")
	lt.Publish(LinkEvent{State: LinkUp, Suspect: true, Reason: "peer heartbeat missed"})
	require.True(t, lt.Suspect())
	require.Equal(t, LinkUp, lt.Link())
	lt.Publish(LinkEvent{State: LinkDown, Cause: CauseSilent, Suspect: true, Reason: "peer silent"})
	require.False(t, lt.Suspect(), "a down link is not suspect")
	require.Equal(t, CauseSilent, lt.Cause())
	var got []LinkEvent
	for len(lt.Events()) > 0 {
		got = append(got, <-lt.Events())
	}
	require.Len(t, got, 3)
	require.False(t, got[2].Suspect)
	require.Equal(t, CauseSilent, got[2].Cause)
	lt.ForceDown()
	require.Equal(t, CauseLocal, lt.Cause())
}
