//go:build integration

package test

import (
	"bytes"
	"runtime"
	"strings"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
)

// blockedCount is the number of this process's goroutines that are
// blocked (parked in a channel operation, select, lock, sleep, poller or
// system call, not running) with a frame whose function contains fn, as
// runtime stacks print it ("transport.(*Conn).Read").
func blockedCount(fn string) int {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		header, frames, _ := strings.Cut(string(g), "\n")
		_, state, ok := strings.Cut(header, " [") // "goroutine 7 [chan receive, 2 minutes]:"
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
				count++
				break
			}
		}
	}
	return count
}

// awaitBlocked waits until at least n goroutines are blocked in fn (see
// blockedCount) and reports whether they came to be within waitfor's
// Timeout. Child processes use it too, so it takes no *testing.T.
func awaitBlocked(fn string, n int) bool {
	return waitfor.Until(func() bool { return blockedCount(fn) >= n })
}
