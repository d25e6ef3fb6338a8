package socklike

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/pool"
)

// heapPool is a sharedPool of slots rings of pool.MinRing bytes over heap
// memory, for tests that play ntproxy through the slots' words. It holds
// an extra reference, so that it is never unmapped.
func heapPool(slots int) *sharedPool {
	mem := make([]byte, slots*pool.SlotSize(pool.MinRing)) // the heap aligns it to 8 bytes
	return &sharedPool{mem: mem, ring: pool.MinRing, slots: slots, refs: 2, conns: map[*poolConn]struct{}{}}
}

// TestPoolAbortFlags: a shared-pool connection's Abort sets FlagAbort with
// the flags of a close, in one store (an ntproxy that knows no FlagAbort
// sees a close); Close and CloseWrite set no FlagAbort. After either,
// calls fail with net.ErrClosed.
func TestPoolAbortFlags(t *testing.T) {
	sp := heapPool(3)
	open := func(i int) (*Conn, *pool.Slot) {
		pc, err := sp.open(i, 0, Addr{}, Addr{})
		require.NoError(t, err)
		return &Conn{pc: pc}, pc.slot
	}
	c, s := open(0)
	_, err := c.Write([]byte("hi"))
	require.NoError(t, err)
	require.NoError(t, c.Abort())
	require.Equal(t, pool.FlagFin|pool.FlagClosed|pool.FlagAbort, s.AppFlags())
	require.Equal(t, uint64(2), s.OutHead(), "what was written stays published")
	require.ErrorIs(t, c.Abort(), net.ErrClosed)
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, net.ErrClosed)

	c, s = open(1)
	require.NoError(t, c.CloseWrite())
	require.Equal(t, pool.FlagFin, s.AppFlags())
	require.NoError(t, c.Close())
	require.Equal(t, pool.FlagFin|pool.FlagClosed, s.AppFlags())

	c, s = open(2)
	require.NoError(t, c.Close())
	require.ErrorIs(t, c.Abort(), net.ErrClosed)
	require.Equal(t, pool.FlagFin|pool.FlagClosed, s.AppFlags(), "an Abort after Close changes nothing")
}
