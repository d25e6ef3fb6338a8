package ntbtest

import (
	"testing"

	"github.com/ntstack/ntstack/ntb"
)

func TestConformance(t *testing.T) {
	Conformance(t, func(t *testing.T) (ntb.Device, ntb.Device) {
		a, b := NewPair(64 << 10)
		return a, b
	})
}

// The fake's own liveness controls: a killed end is gone to its peer, a
// silence that outlasts the timeout is silent, and the link comes back
// when the silence ends.
func TestFakeLiveness(t *testing.T) {
	a, b := NewPair(4096)
	a.SilenceHeartbeat(true)
	WaitEvent(t, b, LivenessTimeout, "suspect", IsSuspect(true))
	if a.Suspect() {
		t.Fatal("the silent end's own link is suspect")
	}
	a.ExpireSilence()
	WaitEvent(t, b, LivenessTimeout, "silent", IsDown(ntb.CauseSilent))
	if b.LinkCause() != ntb.CauseSilent || b.Suspect() {
		t.Fatalf("cause %v, suspect %v", b.LinkCause(), b.Suspect())
	}
	a.SilenceHeartbeat(false)
	WaitEvent(t, b, LivenessTimeout, "up again", IsSuspect(false))
	if b.Link() != ntb.LinkUp {
		t.Fatalf("link %v after the silence ended", b.Link())
	}
	a.SetLink(ntb.LinkDown, "cable pulled")
	WaitEvent(t, b, LivenessTimeout, "hardware down", IsDown(ntb.CauseHardware))
	a.SilenceHeartbeat(false) // not silenced: leaves a pulled link down
	if b.Link() != ntb.LinkDown {
		t.Fatal("ending a silence that never began brought a pulled link up")
	}
	a.SetLink(ntb.LinkUp, "cable back")
	a.Kill()
	WaitEvent(t, b, LivenessTimeout, "gone", IsDown(ntb.CauseGone))
	if a.LinkCause() != ntb.CauseLocal {
		t.Fatalf("killed end's own cause %v", a.LinkCause())
	}
	b.Close()
}
