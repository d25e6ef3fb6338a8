// Package waitfor lets a test wait for the event it expects rather than
// sleep and hope: a condition that comes to hold, or a goroutine that has
// reached a blocking call. Every wait polls with a generous overall limit
// (Timeout), so a loaded machine is slow, not flaky; a wait that times out
// fails the test and names the event it waited for.
//
// It is for tests only (it imports testing).
package waitfor

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Timeout bounds every wait: far beyond what any event takes on a loaded
// machine, so that reaching it means the event will not come.
const Timeout = time.Minute

// poll is the interval between looks.
const poll = time.Millisecond

// True waits until cond holds, failing t (FailNow) if it does not within
// Timeout. what names the event, for the failure message.
func True(t testing.TB, what string, cond func() bool) {
	t.Helper()
	if !Until(cond) {
		t.Fatalf("waited %v for %s", Timeout, what)
	}
}

// Until waits until cond holds and reports true, or false once Timeout
// has passed without it, for a caller that says more than True would.
func Until(cond func() bool) bool {
	deadline := time.Now().Add(Timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(poll)
	}
	return true
}

// Blocked waits until some goroutine whose stack holds a frame containing
// fn (a function as runtime stacks print it, e.g. "(*EventFD).Wait") is
// blocked: parked in a channel operation, select, lock, sleep, the network
// poller or a system call, rather than running. A test uses it to make
// sure a call is waiting before it does what should end the wait.
func Blocked(t testing.TB, fn string) {
	t.Helper()
	True(t, "a goroutine blocked in "+fn, func() bool { return blockedIn(stacks(), fn) })
}

// BlockedN waits until at least n goroutines are blocked in fn, as
// Blocked does for one: a test whose callers share fn waits for the
// last of them to sleep.
func BlockedN(t testing.TB, fn string, n int) {
	t.Helper()
	what := fmt.Sprintf("%d goroutines blocked in %s", n, fn)
	True(t, what, func() bool { return blockedCount(stacks(), fn) >= n })
}

// stacks returns every goroutine's stack.
func stacks() []byte {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return buf[:n]
		}
		buf = make([]byte, 2*len(buf))
	}
}

// blockedIn reports whether the dump (runtime.Stack's, all goroutines)
// holds a blocked goroutine with a frame containing fn.
func blockedIn(dump []byte, fn string) bool { return blockedCount(dump, fn) > 0 }

// blockedCount counts the blocked goroutines of the dump with a frame
// containing fn.
func blockedCount(dump []byte, fn string) int {
	n := 0
	for _, g := range bytes.Split(dump, []byte("\n\n")) {
		header, frames, _ := strings.Cut(string(g), "\n")
		// "goroutine 7 [chan receive, 2 minutes]:"
		_, state, ok := strings.Cut(header, " [")
		if !ok {
			continue
		}
		state, _, _ = strings.Cut(state, "]")
		state, _, _ = strings.Cut(state, ",")
		if state == "running" || state == "runnable" {
			continue
		}
		for _, line := range strings.Split(frames, "\n") {
			if !strings.HasPrefix(line, "created by ") && !strings.HasPrefix(line, "\t") && strings.Contains(line, fn) {
				n++
				break
			}
		}
	}
	return n
}
