package rack

import (
	"errors"
	"testing"
)

// StartForTest starts a rack for a test: it skips the test, with the
// reason, when this machine cannot run one (ErrNotSupported), fails it on
// any other error, and closes the rack when the test ends, after logging
// the end of every daemon log if the test failed.
func StartForTest(tb testing.TB, spec Spec) *Rack {
	tb.Helper()
	r, err := Start(tb.Context(), spec)
	if errors.Is(err, ErrNotSupported) {
		tb.Skipf("skip: %v", err)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if tb.Failed() {
			for _, h := range r.hosts {
				for _, d := range r.daemons {
					tb.Logf("rack %s: %s on %s, log %s ends:\n%s", r.name, d.Name, h.Name, h.LogPath(d.Name), logTail(h.LogPath(d.Name)))
				}
			}
		}
		if err := r.Close(); err != nil {
			tb.Error(err)
		}
	})
	return r
}
