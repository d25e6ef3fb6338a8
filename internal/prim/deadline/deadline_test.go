package deadline

import (
	"testing"
	"time"
)

// Set arms, re-arms and disarms; Wait's channel closes only once the
// current deadline passes.
func TestDeadline(t *testing.T) {
	d := New()
	if d.Passed() {
		t.Fatal("a new deadline has passed")
	}
	d.Set(time.Now().Add(-time.Second))
	if !d.Passed() {
		t.Fatal("a deadline in the past has not passed")
	}
	d.Set(time.Now().Add(time.Hour)) // re-armed: not passed any more
	if d.Passed() {
		t.Fatal("re-armed deadline reports passed")
	}
	d.Set(time.Now().Add(20 * time.Millisecond))
	select {
	case <-d.Wait():
	case <-time.After(5 * time.Second):
		t.Fatal("deadline 20ms ahead did not pass within 5s")
	}
	d.Set(time.Time{})
	if d.Passed() {
		t.Fatal("disarmed deadline reports passed")
	}
	select {
	case <-d.Wait():
		t.Fatal("disarmed deadline's channel is closed")
	default:
	}
}
