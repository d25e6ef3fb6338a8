package proc

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A memfd from NewMemfd cannot be resized by whoever it is passed to, but
// its pages can still be given back.
func TestMemfdSealed(t *testing.T) {
	f, err := NewMemfd("test", 1<<20)
	require.NoError(t, err)
	defer f.Close()
	mem, err := MapShared(f, 1<<20)
	require.NoError(t, err)
	defer Unmap(mem)
	mem[4096] = 7
	require.Error(t, f.Truncate(4096), "shrinking under a mapping")
	require.Error(t, f.Truncate(2<<20), "growing")
	require.NoError(t, Discard(f, 0, 1<<20))
	require.Zero(t, mem[4096], "discarded pages read as zeros")
	mem[4096] = 9 // and are writable again
}
