package shmem

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Two ends over two register blocks, as the backends lay them out.
func TestDoorbells(t *testing.T) {
	const base = 64
	blockA, blockB := make(Mem, 512), make(Mem, 512) // A's and B's registers
	a := NewDoorbells(blockA, blockB, base)
	b := NewDoorbells(blockB, blockA, base)
	require.Zero(t, b.Pending())
	a.Ring(1<<3 | 1<<63)
	require.Equal(t, uint64(1<<3|1<<63), b.Pending())
	require.Zero(t, a.Pending(), "ringing does not raise our own bits")
	b.Clear(1 << 3)
	require.Equal(t, uint64(1<<63), b.Pending())
	a.Ring(1 << 3)
	require.Equal(t, uint64(1<<3|1<<63), b.Pending())

	// A new attachment resumes the counters: nothing meant for the old
	// one is pending, and its rings still count.
	b2 := NewDoorbells(blockB, blockA, base)
	require.Zero(t, b2.Pending())
	a2 := NewDoorbells(blockA, blockB, base)
	a2.Ring(1 << 5)
	require.Equal(t, uint64(1<<5), b2.Pending())
}

func TestMem(t *testing.T) {
	m := make(Mem, 16)
	m.Store64(8, 0x0102030405060708)
	require.Equal(t, byte(0x08), m[8], "little endian in memory")
	require.Equal(t, uint64(0x0102030405060708), m.Load64(8))
	m.Store32(4, 7)
	require.Equal(t, uint32(7), m.Load32(4))
	require.Panics(t, func() { m.Load32(14) })
	require.Panics(t, func() { m.Load64(4) }, "misaligned")
	require.True(t, Aligned8(m))
}
