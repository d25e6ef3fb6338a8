package transport

// byteQueue is a FIFO of bytes in one circular buffer that grows by
// doubling up to the connection's receive window (credit flow control
// guarantees it never needs more).
type byteQueue struct {
	buf  []byte
	head int // index of the first byte
	n    int // bytes queued
}

// push appends p; the caller has checked that len(p) fits the window.
func (q *byteQueue) push(p []byte) {
	if len(p) == 0 {
		return // an empty DATA frame: legal, and nothing to queue
	}
	if q.n+len(p) > len(q.buf) {
		size := max(4096, 2*len(q.buf))
		for size < q.n+len(p) {
			size *= 2
		}
		nb := make([]byte, size)
		q.copyOut(nb)
		q.buf, q.head = nb, 0
	}
	tail := (q.head + q.n) % len(q.buf)
	c := copy(q.buf[tail:], p)
	copy(q.buf, p[c:])
	q.n += len(p)
}

// pop moves up to len(p) bytes into p.
func (q *byteQueue) pop(p []byte) int {
	n := q.copyOut(p)
	q.head = (q.head + n) % max(1, len(q.buf))
	q.n -= n
	if q.n == 0 {
		q.head = 0
	}
	return n
}

// copyOut copies up to len(p) queued bytes into p without consuming them.
func (q *byteQueue) copyOut(p []byte) int {
	n := min(len(p), q.n)
	if n == 0 {
		return 0
	}
	c := copy(p[:n], q.buf[q.head:min(q.head+n, len(q.buf))])
	copy(p[c:n], q.buf)
	return n
}
