package waitfor

import (
	"sync"
	"sync/atomic"
	"testing"
)

func TestTrue(t *testing.T) {
	var n atomic.Int32
	go func() {
		for range 100 {
			n.Add(1)
		}
	}()
	True(t, "100 increments", func() bool { return n.Load() == 100 })
}

//go:noinline
func parkHere(c chan struct{}) { <-c }

func TestBlocked(t *testing.T) {
	c := make(chan struct{})
	done := make(chan struct{})
	go func() {
		parkHere(c)
		close(done)
	}()
	Blocked(t, "waitfor.parkHere")
	close(c)
	<-done
	if blockedIn(stacks(), "waitfor.parkHere") {
		t.Error("parkHere still reported blocked after it returned")
	}
}

func TestBlockedN(t *testing.T) {
	c := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { parkHere(c) })
	}
	BlockedN(t, "waitfor.parkHere", 3)
	if n := blockedCount(stacks(), "waitfor.parkHere"); n != 3 {
		t.Errorf("%d goroutines counted blocked in parkHere, want 3", n)
	}
	close(c)
	wg.Wait()
}

func TestBlockedIn(t *testing.T) {
	dump := []byte(`goroutine 1 [running]:
main.main()
	/src/main.go:10 +0x1d

goroutine 7 [chan receive, 2 minutes]:
example.com/p.(*T).Wait(0xc000010000)
	/src/p/t.go:42 +0x25
created by example.com/p.Start in goroutine 1
	/src/p/t.go:30 +0x66

goroutine 8 [runnable]:
example.com/p.spin()
	/src/p/t.go:50 +0x10
created by example.com/p.(*U).Run in goroutine 1
	/src/p/t.go:31 +0x66`)
	for fn, want := range map[string]bool{
		"(*T).Wait": true,  // blocked
		"p.spin":    false, // runnable
		"main.main": false, // running
		"p.Start":   false, // only its creator
		"(*U).Run":  false, // only its creator
		"t.go:42":   false, // a file position, not a frame
	} {
		if got := blockedIn(dump, fn); got != want {
			t.Errorf("blockedIn(%q) = %v, want %v", fn, got, want)
		}
	}
}
