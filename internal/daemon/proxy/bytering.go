package proxy

// byteRing holds bytes base..base+n of a numbered stream (a leg's
// unacknowledged bytes, or its received and not yet delivered ones), each
// at its number modulo the buffer's size, a power of two:
//
//	buf: |....held....|.......free.......|....held....|
//	     0      end%size             base%size     size
//
// Taking bytes off the front moves nothing (the leg used to shift a slice
// of up to legMaxUnacked bytes at every acknowledgement), and the owner
// reads into and writes from the buffer in place: free gives the room after
// the held bytes for a Read straight from a connection, span the held bytes
// for a Write straight to one.
//
// The buffer starts at ringMinSize and doubles, up to max, when a caller
// asks for more room than is free. It never shrinks: a leg's memory is
// bounded by max per direction, as before.
//
// A byteRing has no lock: its owner's lock guards the fields. A slice that
// free or span returned stays valid (the bytes it covers are not moved or
// reused) until the owner's next call of trim or free, with this exception:
// a grow copies into a new buffer and leaves the old one to the garbage
// collector, so a span taken before it still reads the right bytes.
type byteRing struct {
	buf  []byte
	base uint64 // number of the first byte held
	n    int    // bytes held
	max  int    // largest buffer, a power of two
}

// ringMinSize is the first buffer of a byteRing: a full frame of a peer
// that did not say it takes larger ones (a leg's frames need no more room
// than that: they are read and written in parts).
const ringMinSize = legOldPayload

func newByteRing(max int) byteRing { return byteRing{max: max} }

// end is the number of the byte after the last one held.
func (r *byteRing) end() uint64 { return r.base + uint64(r.n) }

// span returns, contiguous, up to limit of the held bytes from number seq
// on (base ≤ seq ≤ end); shorter where the buffer wraps, empty at end.
func (r *byteRing) span(seq uint64, limit int) []byte {
	k := min(r.n-int(seq-r.base), limit)
	if k <= 0 {
		return nil
	}
	i := int(seq & uint64(len(r.buf)-1))
	return r.buf[i : i+min(k, len(r.buf)-i)]
}

// free returns the room after the held bytes, contiguous, at most limit
// bytes; it grows the buffer first if less than want bytes are free (want
// ≤ limit). It is empty when the buffer is full at max.
func (r *byteRing) free(want, limit int) []byte {
	if len(r.buf)-r.n < want && len(r.buf) < r.max {
		r.grow(r.n + want)
	}
	room := len(r.buf) - r.n
	if room == 0 {
		return nil
	}
	i := int(r.end() & uint64(len(r.buf)-1))
	return r.buf[i : i+min(room, len(r.buf)-i, limit)]
}

// commit adds k bytes the caller wrote into the slice free returned.
func (r *byteRing) commit(k int) { r.n += k }

// put appends p; it reports false, having appended nothing, if p does not
// fit below max.
func (r *byteRing) put(p []byte) bool {
	if r.n+len(p) > r.max {
		return false
	}
	for len(p) > 0 {
		k := copy(r.free(len(p), len(p)), p)
		r.commit(k)
		p = p[k:]
	}
	return true
}

// trim drops the bytes before number seq (base ≤ seq ≤ end).
func (r *byteRing) trim(seq uint64) {
	r.n -= int(seq - r.base)
	r.base = seq
}

// grow replaces the buffer by one of at least need bytes (at most max),
// the held bytes at the same positions modulo the new size.
func (r *byteRing) grow(need int) {
	size := max(len(r.buf), ringMinSize)
	for size < need && size < r.max {
		size *= 2
	}
	size = min(size, r.max)
	if size == len(r.buf) {
		return
	}
	nb := make([]byte, size)
	for seq := r.base; seq < r.end(); {
		p := r.span(seq, r.n)
		for q := p; len(q) > 0; {
			i := int(seq & uint64(size-1))
			k := copy(nb[i:], q)
			q, seq = q[k:], seq+uint64(k)
		}
	}
	r.buf = nb
}
