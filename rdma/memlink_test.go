package rdma

import (
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

// memLink is an in-memory link for the unit tier: two of them form a
// reliable-connected pair over Go memory, with the semantics ringConn
// relies on — writes land in the peer's ring in order before its receive
// completion, every write with immediate consumes a posted receive (a
// write finding none waits, as a receiver-not-ready NAK would make it),
// and writes to a closed peer fail like an exhausted retry count.
type memLink struct {
	f      *memFabric
	side   int
	tx, rx []byte
}

// memFabric holds both ends' state under one mutex.
type memFabric struct {
	mu sync.Mutex
	// mu protects the following fields.
	cond   *sync.Cond
	cq     [2][]completion
	recvs  [2]int
	rnr    [2][]memWrite // writes waiting for a posted receive at that end
	wire   [2][]memWrite // writes from that end still in flight (delay)
	closed [2]bool
	rx     [2][]byte // each end's receive ring (written here only)
	// delay, if set, is how long each write takes to arrive.
	delay time.Duration
}

type memWrite struct {
	from       int
	id, off, n uint64
	imm        uint32
	data       []byte
}

var errRetryExceeded = errors.New("transport retry counter exceeded")

func newMemLinks(size int) (*memLink, *memLink) {
	f := &memFabric{}
	f.cond = sync.NewCond(&f.mu)
	f.recvs = [2]int{rqDepth, rqDepth}
	a := &memLink{f: f, side: 0, tx: make([]byte, size), rx: make([]byte, size)}
	b := &memLink{f: f, side: 1, tx: make([]byte, size), rx: make([]byte, size)}
	f.rx = [2][]byte{a.rx, b.rx}
	return a, b
}

func (l *memLink) txBuf() []byte { return l.tx }
func (l *memLink) rxBuf() []byte { return l.rx }
func (l *memLink) peer() int     { return 1 - l.side }

func (l *memLink) write(id, off, n uint64, imm uint32) error {
	if off+n > uint64(len(l.tx)) {
		return fmt.Errorf("write %d+%d outside the %d-byte ring", off, n, len(l.tx))
	}
	w := memWrite{from: l.side, id: id, off: off, n: n, imm: imm, data: append([]byte(nil), l.tx[off:off+n]...)}
	f := l.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed[l.side] {
		return net.ErrClosed
	}
	if f.delay > 0 {
		// Each timer delivers the oldest write in flight: whichever timer
		// fires first, writes arrive in order, as on an RC queue pair.
		f.wire[l.side] = append(f.wire[l.side], w)
		time.AfterFunc(f.delay, func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			w := f.wire[l.side][0]
			f.wire[l.side] = f.wire[l.side][1:]
			f.arriveLocked(l.peer(), w)
		})
		return nil
	}
	f.arriveLocked(l.peer(), w)
	return nil
}

// failLater fails w at its sender after retryTime, as an RC queue pair
// writing to a destroyed one does once its retries are exhausted.
func (f *memFabric) failLater(w memWrite) {
	time.AfterFunc(retryTime, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.cq[w.from] = append(f.cq[w.from], completion{id: w.id, err: errRetryExceeded})
		f.cond.Broadcast()
	})
}

const retryTime = 20 * time.Millisecond

// arriveLocked delivers w at end to, or queues it for a receive.
func (f *memFabric) arriveLocked(to int, w memWrite) {
	switch {
	case f.closed[to]:
		f.failLater(w)
		return
	case f.recvs[to] == 0 || len(f.rnr[to]) > 0:
		f.rnr[to] = append(f.rnr[to], w)
		return
	default:
		f.recvs[to]--
		copy(f.rx[to][w.off:], w.data)
		f.cq[to] = append(f.cq[to], completion{recv: true, imm: w.imm})
		f.cq[w.from] = append(f.cq[w.from], completion{id: w.id})
	}
	f.cond.Broadcast()
}

func (l *memLink) postRecv(n int) error {
	f := l.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed[l.side] {
		return net.ErrClosed
	}
	f.recvs[l.side] += n
	for len(f.rnr[l.side]) > 0 && f.recvs[l.side] > 0 {
		w := f.rnr[l.side][0]
		f.rnr[l.side] = f.rnr[l.side][1:]
		f.recvs[l.side]--
		copy(l.rx[w.off:], w.data)
		f.cq[l.side] = append(f.cq[l.side], completion{recv: true, imm: w.imm})
		f.cq[w.from] = append(f.cq[w.from], completion{id: w.id})
	}
	f.cond.Broadcast()
	return nil
}

func (l *memLink) poll(cs []completion) (int, error) {
	f := l.f
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.cq[l.side]) == 0 && !f.closed[l.side] {
		f.cond.Wait()
	}
	if f.closed[l.side] {
		return 0, net.ErrClosed
	}
	n := copy(cs, f.cq[l.side])
	f.cq[l.side] = f.cq[l.side][n:]
	return n, nil
}

func (l *memLink) close() error {
	f := l.f
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed[l.side] = true
	// Writes queued for us fail at the sender.
	for _, w := range f.rnr[l.side] {
		f.failLater(w)
	}
	f.rnr[l.side] = nil
	f.cond.Broadcast()
	return nil
}

// inject queues a completion at end side, as if the peer's NIC made it.
func (l *memLink) inject(c completion) {
	l.f.mu.Lock()
	defer l.f.mu.Unlock()
	l.f.cq[l.side] = append(l.f.cq[l.side], c)
	l.f.cond.Broadcast()
}

// ringPipe returns two connected ringConns over memLinks and net.Pipe
// as the side channel.
func ringPipe(t testing.TB, size int) (*ringConn, *ringConn, *memLink, *memLink) {
	t.Helper()
	a, b := newMemLinks(size)
	sa, sb := net.Pipe()
	ca := newRingConn(a, sa, "mem", 2*time.Second)
	cb := newRingConn(b, sb, "mem", 2*time.Second)
	t.Cleanup(func() {
		ca.Close()
		cb.Close()
	})
	return ca, cb, a, b
}
