package closeguard

import (
	"errors"
	"testing"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
)

// Close runs stop, marks the device closed, runs wake, and releases only
// once the method in flight has exited; later calls return the first
// one's error and run nothing.
func TestCloseWaitsForMethodsInFlight(t *testing.T) {
	var g Guard
	if !g.Enter() {
		t.Fatal("Enter failed on an open device")
	}
	var order []string
	errRelease := errors.New("release")
	released := make(chan error, 1)
	go func() {
		released <- g.Close(func() { order = append(order, "stop") },
			func() {
				if !g.Closed() {
					t.Error("wake ran before the device was marked closed")
				}
				order = append(order, "wake")
			},
			func() error { order = append(order, "release"); return errRelease })
	}()
	waitfor.True(t, "Close to mark the device closed", g.Closed)
	waitfor.Blocked(t, "(*Guard).Close") // waiting for our Exit
	select {
	case err := <-released:
		t.Fatalf("Close returned (%v) while a method was in flight", err)
	default:
	}
	g.Exit()
	if err := <-released; !errors.Is(err, errRelease) {
		t.Fatalf("Close: %v, want release's error", err)
	}
	if got := len(order); got != 3 || order[0] != "stop" || order[1] != "wake" || order[2] != "release" {
		t.Fatalf("shutdown ran %v, want stop, wake, release", order)
	}
	if g.Enter() {
		t.Fatal("Enter succeeded after Close")
	}
	again := g.Close(func() { t.Error("second Close ran stop") }, func() { t.Error("second Close ran wake") },
		func() error { t.Error("second Close ran release"); return nil })
	if !errors.Is(again, errRelease) {
		t.Fatalf("second Close: %v, want the first one's error", again)
	}
}
