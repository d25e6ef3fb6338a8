// Package shmem is memory shared with another process or guest, and the
// NTB registers the emulating backends (ntb/shm, ntb/ivshmem) keep in it:
// Mem gives atomic, little-endian word access at fixed offsets, Doorbells
// emulates doorbell bits as per-bit counters.
//
// Offsets passed to Mem are layout constants, never values read from the
// memory, so an offset outside the slice, or misaligned, is a bug and
// panics. Doorbells is not safe for concurrent use: its owner serialises
// calls under its own lock.
package shmem

// Mem is shared memory accessed one atomic little-endian word at a time.
// The words' methods live in shmem_unsafe.go.
type Mem []byte

// DoorbellBits is the number of emulated doorbell bits.
const DoorbellBits = 64

// Doorbells emulates doorbell bits between the two ends of a link. Bit i is
// a 32-bit counter at base+4i of the receiver's register block, which only
// the sender writes: ringing adds one, and a bit is pending while the
// counter differs from what the receiver saw at its last clear. Nothing is
// ever read across the link, and no word has two writers.
type Doorbells struct {
	local, remote Mem
	base          int
	sent, seen    [DoorbellBits]uint32
}

// NewDoorbells attaches to the counters at base of the local and remote
// register blocks. It resumes both where they stand, so that rings meant
// for an earlier attachment do not look pending and ours carry on from
// its count.
func NewDoorbells(local, remote Mem, base int) *Doorbells {
	d := &Doorbells{local: local, remote: remote, base: base}
	for i := range DoorbellBits {
		d.seen[i] = local.Load32(base + 4*i)
		d.sent[i] = remote.Load32(base + 4*i)
	}
	return d
}

// Ring raises bits on the peer.
func (d *Doorbells) Ring(bits uint64) {
	for i := 0; bits != 0; i, bits = i+1, bits>>1 {
		if bits&1 != 0 {
			d.sent[i]++
			d.remote.Store32(d.base+4*i, d.sent[i])
		}
	}
}

// Pending returns the bits raised on us since their last Clear.
func (d *Doorbells) Pending() uint64 {
	var p uint64
	for i := range d.seen {
		if d.local.Load32(d.base+4*i) != d.seen[i] {
			p |= 1 << i
		}
	}
	return p
}

// Clear acknowledges bits.
func (d *Doorbells) Clear(bits uint64) {
	for i := 0; bits != 0; i, bits = i+1, bits>>1 {
		if bits&1 != 0 {
			d.seen[i] = d.local.Load32(d.base + 4*i)
		}
	}
}
