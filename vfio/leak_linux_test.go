package vfio

import (
	"os"
	"testing"
)

// checkNoFDLeak fails the test if it ends with more or fewer descriptors
// open than it started with. Tests using it must not run in parallel.
func checkNoFDLeak(t *testing.T) {
	t.Helper()
	// Let the runtime create its netpoller descriptors before counting.
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	w.Close()
	before := countFDs(t)
	t.Cleanup(func() {
		if after := countFDs(t); after != before {
			t.Errorf("%d descriptors open before the test, %d after", before, after)
		}
	})
}

func countFDs(t *testing.T) int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

// tempFile returns a file of size bytes standing in for a VFIO file: reads,
// writes and mmap work on it, ioctls fail with ENOTTY.
func tempFile(t *testing.T, size int64) *os.File {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "vfio")
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}
