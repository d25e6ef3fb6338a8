package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/ntbtest"
	"github.com/ntstack/ntstack/qos"
)

// pattern is the byte at offset i of stream seed: any loss, duplication or
// reordering shows.
func pattern(seed uint64, i int64) byte { return byte(uint64(i)*2654435761>>13 ^ seed) }

// streamOut writes n pattern bytes in random-sized writes.
func streamOut(c *Conn, seed uint64, n int64, rng *rand.Rand) error {
	buf := make([]byte, 256<<10)
	for off := int64(0); off < n; {
		k := min(int64(1+rng.IntN(len(buf))), n-off)
		for i := range k {
			buf[i] = pattern(seed, off+i)
		}
		if _, err := c.Write(buf[:k]); err != nil {
			return fmt.Errorf("write at %d: %w", off, err)
		}
		off += k
	}
	return c.CloseWrite()
}

// streamIn reads to EOF, checking every byte; stall, if set, runs between
// reads.
func streamIn(c *Conn, seed uint64, want int64, stall func()) error {
	buf := make([]byte, 64<<10)
	var off int64
	for {
		n, err := c.Read(buf[:1+rand.IntN(len(buf))])
		for i := range n {
			if buf[i] != pattern(seed, off+int64(i)) {
				return fmt.Errorf("byte %d: got %#x, want %#x", off+int64(i), buf[i], pattern(seed, off+int64(i)))
			}
		}
		off += int64(n)
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("read at %d: %w", off, err)
		}
		if stall != nil {
			stall()
		}
	}
	if off != want {
		return fmt.Errorf("stream ended at %d bytes, want %d", off, want)
	}
	return nil
}

var coreModels = []CoreModel{CoreInline, CoreShared, CoreSplit}

// The stdlib conformance suite on every core model, with several
// partitions and QoS units.
func TestCoreModelsNettest(t *testing.T) {
	for _, m := range coreModels[1:] {
		t.Run(m.String(), func(t *testing.T) {
			a, b := endpoints(t, "ntbtest", Config{CoreModel: m, Partitions: 3, SpinBudget: 20 * time.Microsecond})
			port := 1000
			nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
				port++
				c1, c2 := connPair(t, a, b, port)
				return c1, c2, func() { c1.Close(); c2.Close() }, nil
			})
		})
	}
}

// deafDevice drops the doorbells its endpoint rings while muted: the peer
// learns of records only by looking.
type deafDevice struct {
	ntb.Device
	mute atomic.Bool
}

func (d *deafDevice) RingPeer(bits uint64) error {
	if d.mute.Load() {
		return nil
	}
	return d.Device.RingPeer(bits)
}

// A worker asleep on its doorbells still delivers a record whose doorbell
// was lost: its rings are looked at for it (workerRecheck), within
// workerRecheckMax however long it slept.
func TestWorkerLooksWithoutDoorbell(t *testing.T) {
	for _, m := range coreModels[1:] {
		t.Run(m.String(), func(t *testing.T) {
			da, db := ntbtest.NewPair(1 << 20)
			t.Cleanup(func() { da.Close(); db.Close() })
			deaf := &deafDevice{Device: db}
			a, b := attachPair(t, da, deaf, Config{CoreModel: m, SpinBudget: 20 * time.Microsecond})
			ca, cb := connPair(t, a, b, 1)
			got := make(chan string, 1)
			go func() {
				buf := make([]byte, 5)
				_, err := io.ReadFull(ca, buf)
				assert.NoError(t, err)
				got <- string(buf)
			}()
			time.Sleep(2 * workerRecheckMax) // every look has backed off
			deaf.mute.Store(true)
			start := time.Now()
			_, err := cb.Write([]byte("hello"))
			require.NoError(t, err)
			select {
			case s := <-got:
				require.Equal(t, "hello", s)
				t.Logf("delivered after %v with no doorbell", time.Since(start).Round(time.Millisecond))
			case <-time.After(workerRecheckMax + 5*time.Second):
				t.Fatal("a record whose doorbell was lost was never delivered")
			}
			deaf.mute.Store(false)
		})
	}
}

// A connection migrated hundreds of times mid-stream, in both directions,
// delivers every byte in order.
func TestMigration(t *testing.T) {
	for _, m := range coreModels {
		t.Run(m.String(), func(t *testing.T) {
			a, b := endpoints(t, "ntbtest", Config{CoreModel: m, Partitions: 4, Window: 64 << 10, MTU: 4 << 10})
			c1, c2 := connPair(t, a, b, 7)
			const size = 16 << 20
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			done := make(chan struct{})
			for i, pair := range [][2]*Conn{{c1, c2}, {c2, c1}} {
				wg.Add(2)
				go func() {
					defer wg.Done()
					errs <- streamOut(pair[0], uint64(i), size, rand.New(rand.NewPCG(1, uint64(i))))
				}()
				go func() { defer wg.Done(); errs <- streamIn(pair[1], uint64(i), size, nil) }()
			}
			moves := 0
			go func() { wg.Wait(); close(done) }()
			rng := rand.New(rand.NewPCG(2, 2))
		loop:
			for {
				select {
				case <-done:
					break loop
				case <-time.After(200 * time.Microsecond):
				}
				c := []*Conn{c1, c2}[rng.IntN(2)]
				require.NoError(t, c.Migrate(rng.IntN(4)))
				moves++
			}
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			require.Error(t, c1.Migrate(4), "unit 4 of 4")
			t.Logf("%d migrations requested over %d MiB each way; now on partitions %d and %d", moves, size>>20, c1.Partition(), c2.Partition())
			require.Greater(t, moves, 50)
		})
	}
}

// 64 connections whose readers stall at random: every byte arrives, and
// the receive queues never hold more than the window — memory stays
// bounded by connections × window.
func TestNoLossUnderPressure(t *testing.T) {
	const (
		conns  = 64
		window = 64 << 10
		size   = 1 << 20
		// Bound on the Go heap the transfer may add: 64 × 64 KiB of
		// receive queues (4 MiB), write buffers of 256 KiB per writer
		// (16 MiB) and slack for the collector's pacing.
		heapBound = 48 << 20
	)
	for _, m := range []CoreModel{CoreInline, CoreShared} {
		t.Run(m.String(), func(t *testing.T) {
			a, b := endpoints(t, "ntbtest", Config{CoreModel: m, Partitions: 2, Window: window, MTU: 16 << 10})
			ln, err := b.Listen(9)
			require.NoError(t, err)
			defer ln.Close()
			runtime.GC()
			var before runtime.MemStats
			runtime.ReadMemStats(&before)
			var maxQueued, maxHeap atomic.Int64
			errs := make(chan error, 2*conns)
			var wg sync.WaitGroup
			for i := range conns {
				wg.Add(2)
				go func() {
					defer wg.Done()
					c, err := a.Dial(9)
					if err != nil {
						errs <- err
						return
					}
					defer c.Close()
					errs <- streamOut(c, uint64(i), size, rand.New(rand.NewPCG(3, uint64(i))))
				}()
				go func() {
					defer wg.Done()
					c, err := ln.AcceptConn()
					if err != nil {
						errs <- err
						return
					}
					defer c.Close()
					// The first byte says which stream this is.
					var first [1]byte
					if _, err := io.ReadFull(c, first[:]); err != nil {
						errs <- err
						return
					}
					seed := uint64(0)
					for ; seed < conns && pattern(seed, 0) != first[0]; seed++ {
					}
					rng := rand.New(rand.NewPCG(4, uint64(i)))
					stall := func() {
						q := c.queued.Load()
						for old := maxQueued.Load(); q > old && !maxQueued.CompareAndSwap(old, q); old = maxQueued.Load() {
						}
						if rng.IntN(20) == 0 { // an injected stall: a slow reader, the thing under test
							time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
						}
					}
					errs <- streamInFrom(c, seed, 1, size, stall)
				}()
			}
			stop := make(chan struct{})
			go func() {
				for {
					var ms runtime.MemStats
					runtime.ReadMemStats(&ms)
					if h := int64(ms.HeapInuse) - int64(before.HeapInuse); h > maxHeap.Load() {
						maxHeap.Store(h)
					}
					select {
					case <-stop:
						return
					case <-time.After(20 * time.Millisecond):
					}
				}
			}()
			wg.Wait()
			close(stop)
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			t.Logf("max receive queue %d bytes (window %d); heap grew by at most %d KiB (bound %d KiB)",
				maxQueued.Load(), window, maxHeap.Load()>>10, heapBound>>10)
			require.LessOrEqual(t, maxQueued.Load(), int64(window))
			require.Less(t, maxHeap.Load(), int64(heapBound))
		})
	}
}

// streamInFrom is streamIn for a stream whose first skip bytes were read.
func streamInFrom(c *Conn, seed uint64, skip, want int64, stall func()) error {
	off, err := streamInCount(c, seed, skip, stall)
	if err != nil {
		return err
	}
	if off != want {
		return fmt.Errorf("stream %d ended at %d bytes, want %d", seed, off, want)
	}
	return nil
}

// streamInCount reads to EOF, checking every byte from offset skip on, and
// returns the offset it ended at.
func streamInCount(c *Conn, seed uint64, skip int64, stall func()) (int64, error) {
	buf := make([]byte, 16<<10)
	off := skip
	for {
		n, err := c.Read(buf[:1+rand.IntN(len(buf))])
		for i := range n {
			if buf[i] != pattern(seed, off+int64(i)) {
				return off, fmt.Errorf("stream %d byte %d: got %#x, want %#x", seed, off+int64(i), buf[i], pattern(seed, off+int64(i)))
			}
		}
		off += int64(n)
		if err == io.EOF {
			return off, nil
		}
		if err != nil {
			return off, err
		}
		stall()
	}
}

// With QoS each class has its partition; SetPriority moves a connection
// there without disturbing its stream.
func TestQoSPartitions(t *testing.T) {
	a, b := endpoints(t, "ntbtest", Config{QoS: true, Partitions: 8, Window: 64 << 10})
	ln, err := b.Listen(3)
	require.NoError(t, err)
	require.NoError(t, ln.SetPriority(5))
	require.Error(t, ln.SetPriority(8))
	c1, err := a.DialClass(context.Background(), 3, 3)
	require.NoError(t, err)
	c2, err := ln.AcceptConn()
	require.NoError(t, err)
	require.Equal(t, 3, c1.Partition())
	require.Equal(t, qos.Class(5), c2.Priority())
	require.Equal(t, 5, c2.Partition())

	errs := make(chan error, 1)
	go func() { errs <- streamIn(c2, 9, 4<<20, nil) }()
	moved := make(chan error, 1)
	go func() {
		// Mid-stream: once the first MiB is in the ring.
		for deadline := time.Now().Add(10 * time.Second); c1.sent.Load() < 1<<20 && time.Now().Before(deadline); {
			runtime.Gosched()
		}
		moved <- c1.SetPriority(qos.Lowest)
	}()
	require.NoError(t, streamOut(c1, 9, 4<<20, rand.New(rand.NewPCG(5, 5))))
	require.NoError(t, <-errs)
	require.NoError(t, <-moved)
	require.Equal(t, 7, c1.Partition())
	require.Error(t, c1.SetPriority(9))
}

// With QoS a class's connections share one partition's ring, so their
// windows together must leave it half free, as without QoS they leave all
// the rings half free: counted over all eight rings, two connections of a
// class kept theirs full (2 streams: 4.5 GB/s against 14 with it).
func TestQoSShareFitsClassRing(t *testing.T) {
	da, db := ntbtest.NewPair(16 << 20) // the default window: 1 MiB rings
	t.Cleanup(func() { da.Close(); db.Close() })
	a, b := attachPair(t, da, db, Config{QoS: true, Partitions: 8})
	b.smallFor = int64(time.Hour) // both count as streaming (see share)
	_, r := bulkPair(t, a, b, 1)
	bulkPair(t, a, b, 2)
	const conns = 2
	ring := int64(r.st().parts[0].RxRingSize())
	t.Logf("ring %d bytes, %d connections, share %d bytes", ring, conns, r.st().share())
	require.Greater(t, ring/(2*conns), int64(minShare), "a ring large enough to bound the share")
	require.LessOrEqual(t, r.st().share()*conns, ring/2)
}

// A connection's window, as OPEN and ACCEPT announce it, is at most half a
// ring however large Config.Window (the 4 MiB default over 512 KiB rings
// here): announcing all of Config.Window let a writer fill the ring before
// its first CREDIT, where every connection of the partition waits for ring
// space. (The producer can still find the ring full as it sees it: its copy
// of the read index lags; see package ring.)
func TestWindowFitsRing(t *testing.T) {
	a, b := endpoints(t, "ntbtest", Config{}) // 1 MiB link windows: 512 KiB rings
	w, r := connPair(t, a, b, 1)
	ring := int64(r.st().parts[0].RxRingSize())
	require.Equal(t, ring/2, w.window, "the window the dialer was given")
	require.Equal(t, ring/2, r.window, "the window the listener was given")
	const size = 16 << 20
	done := make(chan error, 1)
	go func() { done <- streamOut(w, 1, size, rand.New(rand.NewPCG(1, 1))) }()
	require.NoError(t, streamIn(r, 1, size, func() {}))
	require.NoError(t, <-done)
}

// A small write on a connection whose unit has nobody queued goes into the
// ring without the schedule (Conn.sendNow); a large one takes the
// schedule; bytes stay in order either way.
func TestSmallWriteSkipsSchedule(t *testing.T) {
	a, b := endpoints(t, "ntbtest", Config{})
	w, r := connPair(t, a, b, 1)
	var msgs [][]byte
	for i := range 100 {
		msgs = append(msgs, bytes.Repeat([]byte{byte(i)}, 1+i%64))
	}
	msgs = append(msgs, bytes.Repeat([]byte{0xee}, 256<<10), []byte("tail"))
	want := bytes.Join(msgs, nil)
	got := make(chan []byte, 1)
	go func() { // reading as it goes: the large write is as large as the window
		buf := make([]byte, len(want))
		if _, err := io.ReadFull(r, buf); err != nil {
			t.Error(err)
		}
		got <- buf
	}()
	posts := func() uint32 { return w.unit.posts.Load() }
	before := posts()
	for i, msg := range msgs {
		_, err := w.Write(msg)
		require.NoError(t, err)
		if i == 99 {
			require.Equal(t, before, posts(), "small writes on an idle unit should not be scheduled")
		}
	}
	require.Greater(t, posts(), before, "a large write goes through the schedule")
	require.True(t, bytes.Equal(want, <-got), "bytes out of order")
}

// Quotas fail with clear, typed errors on the side that hits them.
func TestQuotas(t *testing.T) {
	t.Run("memory", func(t *testing.T) {
		a, b := endpoints(t, "ntbtest", Config{Window: 64 << 10, MemoryQuota: 128 << 10})
		connPair(t, a, b, 1)
		connPair(t, a, b, 2)
		_, err := a.Dial(3)
		require.True(t, errors.Is(err, qos.ErrQuota), "%v", err)
		require.ErrorContains(t, err, "receive-window memory quota")
	})
	t.Run("memory beside a larger Window", func(t *testing.T) {
		// The default 4 MiB Window over 512 KiB rings: each connection
		// announces and reserves 256 KiB, half a ring, so a 1 MiB quota
		// holds four (reserving the 4 MiB it never uses refused them all).
		a, b := endpoints(t, "ntbtest", Config{MemoryQuota: 1 << 20})
		for port := 1; port <= 4; port++ {
			c, _ := connPair(t, a, b, port)
			require.Equal(t, int64(256<<10), c.window, "the window announced")
		}
		_, err := a.Dial(5)
		require.True(t, errors.Is(err, qos.ErrQuota), "%v", err)
	})
	t.Run("partition", func(t *testing.T) {
		a, b := endpoints(t, "ntbtest", Config{Partitions: 2, PartitionConns: 1})
		connPair(t, a, b, 1)
		connPair(t, a, b, 2)
		_, err := a.Dial(3)
		require.ErrorIs(t, err, ErrPartitionFull)
	})
	t.Run("peer partition", func(t *testing.T) {
		da, db := backends["ntbtest"](t)
		a, err := Attach(da, Config{Logf: t.Logf})
		require.NoError(t, err)
		b, err := Attach(db, Config{PartitionConns: 1, Logf: t.Logf})
		require.NoError(t, err)
		defer a.Close()
		defer b.Close()
		connPair(t, a, b, 1)
		_, err = b.Listen(2)
		require.NoError(t, err)
		_, err = a.Dial(2)
		require.ErrorIs(t, err, syscall.ECONNREFUSED)
		require.ErrorContains(t, err, "connection quota")
	})
}

// A token bucket holds a partition to its rate.
func TestPartitionRate(t *testing.T) {
	const rate = 8 << 20
	a, b := endpoints(t, "ntbtest", Config{PartitionRate: rate, MTU: 16 << 10})
	c1, c2 := connPair(t, a, b, 1)
	go io.Copy(io.Discard, c2)
	start := time.Now()
	buf := make([]byte, 4<<20)
	_, err := c1.Write(buf)
	require.NoError(t, err)
	el := time.Since(start)
	// 4 MiB at 8 MiB/s with a 0.8 MiB burst: ≥ 0.4 s.
	require.Greater(t, el, 350*time.Millisecond)
	t.Logf("4 MiB at a %d MiB/s limit took %v", rate>>20, el)
}

// A bulk connection's unread data stays within Config.SharedWindow while a
// small-message connection shares its partition, and uses its full share
// while none does. Every byte still arrives, in order.
func TestSharedWindow(t *testing.T) {
	const shared = 32 << 10
	a, b := endpoints(t, "ntbtest", Config{SharedWindow: shared})
	// The small flow counts as such for a second after each message, not
	// 10 ms: under -race on a busy machine it stalls longer than that.
	a.smallFor, b.smallFor = int64(time.Second), int64(time.Second)
	bw, br := connPair(t, a, b, 1) // bulk: a -> b
	sw, sr := connPair(t, a, b, 2) // small messages: a -> b and back
	require.Equal(t, bw.Partition(), sw.Partition())

	// The bulk reader pauses now and then, so the writer keeps its whole
	// allowance in flight; inFlight samples what is sent and unread.
	stopBulk, stopSmall := make(chan struct{}), make(chan struct{})
	errs := make(chan error, 3)
	var written atomic.Int64
	go func() {
		buf := make([]byte, 64<<10)
		for off := int64(0); ; off += int64(len(buf)) {
			select {
			case <-stopBulk:
				written.Store(off)
				errs <- bw.CloseWrite()
				return
			default:
			}
			for i := range buf {
				buf[i] = pattern(3, off+int64(i))
			}
			if _, err := bw.Write(buf); err != nil {
				errs <- err
				return
			}
		}
	}()
	type result struct {
		n   int64
		err error
	}
	read := make(chan result, 1)
	go func() {
		n := 0
		var r result
		r.n, r.err = streamInCount(br, 3, 0, func() {
			if n++; n%8 == 0 { // an injected stall: a slow reader, the thing under test
				time.Sleep(100 * time.Microsecond)
			}
		})
		read <- r
	}()
	// inFlightBeside samples, for d, the bulk bytes sent and not yet read,
	// once the receiver treats the partition as carrying small messages
	// and has read past what earlier credit allowed (a while to watch for
	// too much in flight: a slow machine can only take samples away).
	inFlightBeside := func(d time.Duration) (most int64) {
		require.Eventually(t, func() bool { return br.st().sharedShare(br) > 0 }, 10*time.Second, time.Millisecond,
			"the receiver should see the small-message flow")
		// Credit granted before allowed at most a window more.
		from := br.read.Load()
		require.Eventually(t, func() bool { return br.read.Load() >= from+br.st().window }, 10*time.Second, time.Millisecond,
			"the reader should read past the credit granted before")
		for end := time.Now().Add(d); time.Now().Before(end); {
			sent := bw.sent.Load() // first: it only grows after what was read
			most = max(most, sent-br.read.Load())
			runtime.Gosched()
		}
		return most
	}

	// Alone, the bulk connection comes to hold more than the shared window
	// in flight: waited for, not sampled for a while, since a starved
	// writer is late, not wrong.
	var alone int64
	waitfor.True(t, "the bulk connection alone, more than the shared window in flight", func() bool {
		alone = max(alone, bw.sent.Load()-br.read.Load())
		return alone > int64(shared)
	})

	go func() {
		msg := make([]byte, 64)
		for {
			select {
			case <-stopSmall:
				errs <- nil
				return
			default:
			}
			_, err := sw.Write(msg)
			if err == nil {
				_, err = io.ReadFull(sw, msg)
			}
			if err != nil {
				errs <- err
				return
			}
		}
	}()
	go func() { _, _ = io.Copy(sr, sr) }()
	beside := inFlightBeside(100 * time.Millisecond)
	close(stopSmall)
	close(stopBulk)
	require.LessOrEqual(t, beside, int64(shared), "unread bulk data beside a small-message flow")
	for range 2 {
		require.NoError(t, <-errs)
	}
	r := <-read
	require.NoError(t, r.err)
	require.Equal(t, written.Load(), r.n, "bulk bytes read")
}

// TestHeaderBeforeBodyIsNotLatencyTraffic: a connection's small record
// followed by large ones (a header before its body, on a new connection or
// one back from a pause) does not mark its partition as carrying latency
// traffic, which would cut every bulk window there to SharedWindow, its
// own first; a second small record within smallFor does.
func TestHeaderBeforeBodyIsNotLatencyTraffic(t *testing.T) {
	a, b := endpoints(t, "ntbtest", Config{})
	const smallFor = 100 * time.Millisecond // longer than the sends below take, even under -race
	a.smallFor, b.smallFor = int64(smallFor), int64(smallFor)
	w, r := connPair(t, a, b, 1)
	marked := func() bool { return r.st().traffic[r.rxPart.Load()].smallAt.Load() != 0 }
	send := func(sizes ...int) { // and read them, at once
		t.Helper()
		total := 0
		for _, n := range sizes {
			total += n
		}
		read := make(chan error, 1)
		go func() {
			_, err := io.ReadFull(r, make([]byte, total))
			read <- err
		}()
		for _, n := range sizes {
			_, err := w.Write(make([]byte, n))
			require.NoError(t, err)
		}
		require.NoError(t, <-read)
	}
	send(8, 256<<10, 256<<10)
	require.False(t, marked(), "a header before a body marked the partition")
	waitOlder(t, r, "the body") // the body is old news: the next small record starts afresh
	send(8)
	require.False(t, marked(), "one small record after a pause marked the partition")
	send(8)
	require.True(t, marked(), "the second small record should mark the partition")
}

// waitOlder waits until c's last large record is older than smallFor by
// its endpoint's clock: the pause the classification looks for.
func waitOlder(t *testing.T, c *Conn, what string) {
	t.Helper()
	require.Eventually(t, func() bool { return c.ep.now()+1-c.bigAt.Load() > c.ep.smallFor }, 10*time.Second, time.Millisecond,
		"%s should become older than smallFor", what)
}

// TestStreamStaysBulkReader: a reader whose last record was large counts
// as a bulk reader however long ago that was (a stream whose writer
// waited in the turns' line), so it leaves its neighbours' records to
// their readers rather than copy them into their queues; a small record
// after smallFor without a large one makes it a small-message reader.
func TestStreamStaysBulkReader(t *testing.T) {
	a, b := endpoints(t, "ntbtest", Config{})
	const smallFor = 50 * time.Millisecond
	a.smallFor, b.smallFor = int64(smallFor), int64(smallFor)
	w, r := connPair(t, a, b, 1)
	send := func(n int) { // and read it
		t.Helper()
		read := make(chan error, 1)
		go func() {
			_, err := io.ReadFull(r, make([]byte, n))
			read <- err
		}()
		_, err := w.Write(make([]byte, n))
		require.NoError(t, err)
		require.NoError(t, <-read)
	}
	require.False(t, r.bulkReader(), "before any record")
	send(256 << 10)
	require.True(t, r.bulkReader(), "after a large record")
	waitOlder(t, r, "the large record")
	require.True(t, r.bulkReader(), "a stream paused longer than smallFor")
	send(8)
	require.False(t, r.bulkReader(), "a small record after the pause")
	send(256 << 10)
	require.True(t, r.bulkReader(), "a large record again")
}

// A bulk reader leaves its neighbours' records at the head of the ring for
// their own readers (state.leaveForReader), but only while they are about
// to come: a neighbour whose application stops reading must not stall the
// partition. Here y's reader reads a little, then stays away while x
// streams 32 MiB through the same partition; x must finish meanwhile, and
// y's records, queued after the bound, must arrive intact once it reads
// again.
func TestAbsentReaderDoesNotStall(t *testing.T) {
	const xBytes, yBytes = 32 << 20, 4 << 20
	a, b := endpoints(t, "ntbtest", Config{})
	xw, xr, yw, yr := samePartition(t, a, b, 1, 2)
	errs := make(chan error, 3)
	go func() { errs <- streamOut(xw, 1, xBytes, rand.New(rand.NewPCG(1, 1))) }()
	go func() { errs <- streamOut(yw, 2, yBytes, rand.New(rand.NewPCG(2, 2))) }()

	// y's reader takes 64 KiB (so y counts as bulk, and its reader was
	// just in Read), then goes away until x is done.
	first := make([]byte, 64<<10)
	_, err := io.ReadFull(yr, first)
	require.NoError(t, err)
	for i, v := range first {
		require.Equal(t, pattern(2, int64(i)), v, "y byte %d", i)
	}
	xDone := make(chan error, 1)
	go func() { xDone <- streamIn(xr, 1, xBytes, nil) }()
	select {
	case err := <-xDone:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("x stalled while y's reader was away")
	}
	require.NoError(t, streamInFrom(yr, 2, int64(len(first)), yBytes, func() {}))
	for range 2 {
		require.NoError(t, <-errs)
	}
	st := b.Stats()
	t.Logf("receiver: %d DATA records, %d queued", st.DataRecords, st.QueuedRecords)
	require.Positive(t, st.QueuedRecords, "y's records should have been queued while its reader was away")
}

// TestSmallReadsCopyOnce checks that Reads smaller than a record take it
// in parts straight from the ring rather than queueing the rest, and that
// a reader that goes away in the middle of a record does not stall the
// other connection of its partition: the rest is queued for it then.
func TestSmallReadsCopyOnce(t *testing.T) {
	const xBytes, yBytes = 8 << 20, 16 << 20
	a, b := endpoints(t, "ntbtest", Config{})
	xw, xr, yw, yr := samePartition(t, a, b, 1, 2)
	errs := make(chan error, 4)
	write := func(c *Conn, seed uint64, n int64) {
		buf := make([]byte, 64<<10)
		for off := int64(0); off < n; off += int64(len(buf)) {
			for i := range buf {
				buf[i] = pattern(seed, off+int64(i))
			}
			if _, err := c.Write(buf); err != nil {
				errs <- err
				return
			}
		}
		errs <- c.CloseWrite()
	}
	// readIn reads c's stream from offset off up to n, size bytes a Read,
	// checking every byte.
	readIn := func(c *Conn, seed uint64, off, n int64, size int) error {
		buf := make([]byte, size)
		for off < n {
			k, err := c.Read(buf[:min(int64(size), n-off)])
			if err != nil {
				return fmt.Errorf("stream %d: read at %d: %w", seed, off, err)
			}
			for i := range k {
				if buf[i] != pattern(seed, off+int64(i)) {
					return fmt.Errorf("stream %d byte %d: got %#x, want %#x", seed, off+int64(i), buf[i], pattern(seed, off+int64(i)))
				}
			}
			off += int64(k)
		}
		return nil
	}

	// Alone, x is read 4 KiB at a time: its 64 KiB records are not queued.
	go write(xw, 1, xBytes)
	before := b.Stats()
	require.NoError(t, readIn(xr, 1, 0, xBytes/2, 4<<10))
	st := b.Stats()
	records, queued := st.DataRecords-before.DataRecords, st.QueuedRecords-before.QueuedRecords
	t.Logf("x read in 4 KiB pieces: %d records, %d queued", records, queued)
	// (A record that comes while the reader is parked meets its 4 KiB
	// buffer and is queued; the reader, slower than the writer, seldom
	// parks. Queueing the rest of every record was the old way.)
	require.Less(t, queued, records/2, "records read in parts should stay in the ring")

	// Two connections of one partition, both read 4 KiB at a time: a
	// reader parked with its small buffer posted is woken to take its
	// record in parts rather than have the rest queued.
	// One P, as in a process pinned to one CPU: there a reader that is
	// not polling is parked, with its buffer posted.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	zw, zr, ww, wr := samePartition(t, a, b, 3, 4)
	go write(zw, 3, xBytes)
	go write(ww, 4, xBytes)
	before = b.Stats()
	zDone := make(chan error, 1)
	go func() { zDone <- readIn(zr, 3, 0, xBytes, 4<<10) }()
	require.NoError(t, readIn(wr, 4, 0, xBytes, 4<<10))
	require.NoError(t, <-zDone)
	st = b.Stats()
	records, queued = st.DataRecords-before.DataRecords, st.QueuedRecords-before.QueuedRecords
	t.Logf("two connections read in 4 KiB pieces: %d records, %d queued", records, queued)
	require.Less(t, queued, records/4, "a parked reader should take its record in parts")
	for range 2 {
		require.NoError(t, <-errs)
	}

	// x's reader stops 1000 bytes into a record; y's stream must go on.
	const stop = xBytes/2 + 1000
	require.NoError(t, readIn(xr, 1, xBytes/2, stop, 1000))
	go write(yw, 2, yBytes)
	yDone := make(chan error, 1)
	go func() { yDone <- readIn(yr, 2, 0, yBytes, 64<<10) }()
	select {
	case err := <-yDone:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("y stalled behind the rest of x's record")
	}
	require.NoError(t, readIn(xr, 1, stop, xBytes, 4<<10))
	for range 2 {
		require.NoError(t, <-errs)
	}
}

// TestPollerLeavesRecords: a reader blocked in Read with a buffer smaller
// than the record that comes takes the record in parts from the ring,
// when the poller finds it as when another reader does (leaveForReader),
// rather than have the poller fill its buffer and queue the rest.
func TestPollerLeavesRecords(t *testing.T) {
	// One P, as in a process pinned to one CPU: the reader runs between
	// its Reads without the poller running beside it.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	a, b := endpoints(t, "ntbtest", Config{})
	w, r := connPair(t, a, b, 7)
	record := make([]byte, DefaultMTU)
	buf := make([]byte, 16<<10)
	const rounds = 20
	queued := 0
	for round := range rounds {
		for i := range record {
			record[i] = pattern(uint64(round), int64(i))
		}
		before := b.Stats()
		got := make(chan error, 1)
		go func() {
			for off := 0; off < len(record); {
				n, err := r.Read(buf)
				if err != nil {
					got <- err
					return
				}
				if !bytes.Equal(buf[:n], record[off:off+n]) {
					got <- fmt.Errorf("round %d: bytes %d-%d differ", round, off, off+n)
					return
				}
				off += n
			}
			got <- nil
		}()
		// The reader parks, its buffer posted; the poller takes the
		// doorbell.
		require.Eventually(t, func() bool { return b.Stats().Parks > before.Parks }, 5*time.Second, 100*time.Microsecond)
		_, err := w.Write(record)
		require.NoError(t, err)
		require.NoError(t, <-got)
		st := b.Stats()
		require.Equal(t, before.DataRecords+1, st.DataRecords, "round %d: one record", round)
		if st.QueuedRecords > before.QueuedRecords {
			queued++
		}
	}
	// A reader that takes longer than readerBack between its Reads (the
	// race detector slows the checks) has the rest queued, by design; the
	// poller that does not leave records queued it every round.
	t.Logf("the record was queued in %d of %d rounds", queued, rounds)
	require.Less(t, queued, rounds/4)
}

// bulkPair is connPair with bulkMark pattern bytes (seed 5) sent and read,
// one record of more than smallWrite: the receiver counts the connection
// among those that stream (state.share) for b.smallFor.
func bulkPair(t *testing.T, a, b *Endpoint, port int) (*Conn, *Conn) {
	t.Helper()
	c, d := connPair(t, a, b, port)
	require.NoError(t, streamOutOpen(c, 5, 0, bulkMark))
	require.NoError(t, streamInN(d, 5, 0, bulkMark))
	return c, d
}

const bulkMark = smallWrite + 1

// samePartition dials two connections from a to b (on ports p and q) and
// checks that they share a data partition: writer and reader of each.
func samePartition(t *testing.T, a, b *Endpoint, p, q int) (xw, xr, yw, yr *Conn) {
	t.Helper()
	xw, xr = connPair(t, a, b, p)
	yw, yr = connPair(t, a, b, q)
	require.Equal(t, xw.Partition(), yw.Partition())
	return xw, xr, yw, yr
}

// TestCreditKeepsRecordsWhole: a writer whose share is about one MTU
// waits for credit for a whole record rather than send what a part-read
// record freed, and a writer waiting so is not stranded when the share
// shrinks under it or grows.
func TestCreditKeepsRecordsWhole(t *testing.T) {
	const msg, total = 64 << 10, 8 << 20
	a, b := endpoints(t, "ntbtest", Config{MTU: msg})
	b.smallFor = int64(time.Hour) // connections count as streaming to the end (see share)
	w, r := bulkPair(t, a, b, 1)
	// Streaming connections bring the share down to between one and two
	// MTUs.
	port := 2
	for ; r.st().share() >= 2*msg; port++ {
		bulkPair(t, a, b, port)
	}
	t.Logf("share %d bytes with %d connections", r.st().share(), port-1)
	require.GreaterOrEqual(t, r.st().share(), int64(msg), "a share of at least one record")

	// stream sends n bytes in msg-byte writes and reads them 32 KiB at a
	// time (as io.Copy does), checking every byte; during runs meanwhile.
	off := int64(bulkMark)
	stream := func(n int64, during func()) {
		t.Helper()
		wrote := make(chan error, 1)
		go func(from int64) {
			buf := make([]byte, msg)
			for o := from; o < from+n; o += msg {
				for i := range buf {
					buf[i] = pattern(5, o+int64(i))
				}
				if _, err := w.Write(buf); err != nil {
					wrote <- err
					return
				}
			}
			wrote <- nil
		}(off)
		read := make(chan error, 1)
		go func(from int64) {
			buf := make([]byte, 32<<10)
			for o := from; o < from+n; {
				k, err := r.Read(buf)
				if err != nil {
					read <- err
					return
				}
				for i := range k {
					if buf[i] != pattern(5, o+int64(i)) {
						read <- fmt.Errorf("byte %d: got %#x, want %#x", o+int64(i), buf[i], pattern(5, o+int64(i)))
						return
					}
				}
				o += int64(k)
			}
			read <- nil
		}(off)
		during()
		select {
		case err := <-read:
			require.NoError(t, err)
		case <-time.After(30 * time.Second):
			t.Fatalf("stream stalled: %d of %d bytes read", r.read.Load()-off, n)
		}
		require.NoError(t, <-wrote)
		off += n
	}

	before := b.Stats()
	stream(total, func() {})
	records := b.Stats().DataRecords - before.DataRecords
	credits := b.Stats().Credits - before.Credits
	t.Logf("%d writes of %d bytes came as %d records, %d CREDITs back", total/msg, msg, records, credits)
	// Sending on whatever credit came back cut them into two to four.
	require.LessOrEqual(t, records, int64(total/msg)*11/10, "records cut by credit")
	// Credit on every 32 KiB read, half of it too little to send on, was
	// 228 CREDITs.
	require.LessOrEqual(t, credits, records, "CREDITs the writer cannot send on")

	// The share falls to the least while the writer waits for the old
	// floor, then rises again.
	var extra []*Conn
	stream(total, func() {
		for p := port; p < port+64; p++ {
			c, d := bulkPair(t, a, b, p)
			extra = append(extra, c, d)
		}
		t.Logf("share %d bytes", r.st().share())
		require.Less(t, r.st().share(), int64(msg), "64 more connections should shrink the share below the floor sent")
	})
	stream(total, func() {
		for _, c := range extra {
			c.Close()
		}
	})
}

// TestSmallMessageTakenAhead: a small message published behind another
// connection's bulk records is taken out of order, before them, by
// whoever polls the ring (state.takeAhead), and both connections still
// get their bytes intact and in order.
func TestSmallMessageTakenAhead(t *testing.T) {
	a, b := endpoints(t, "ntbtest", Config{})
	a.smallFor, b.smallFor = int64(time.Hour), int64(time.Hour)
	xw, xr, yw, yr := samePartition(t, a, b, 1, 2)
	small := func(c *Conn, r *Conn, msg string) { // written, and read at the other end
		t.Helper()
		_, err := c.Write([]byte(msg))
		require.NoError(t, err)
		got := make([]byte, len(msg))
		_, err = io.ReadFull(r, got)
		require.NoError(t, err)
		require.Equal(t, msg, string(got))
	}
	small(yw, yr, "one")
	small(yw, yr, "two") // the partition carries small messages now
	part := int(yr.rxPart.Load())
	require.True(t, b.cur.smallTraffic(part))

	// x's records, then y's, published while nobody can poll the ring.
	p := yr.st().parts[part]
	p.LockRX()
	const xBytes = 48 << 10
	xbuf := make([]byte, xBytes)
	for i := range xbuf {
		xbuf[i] = pattern(1, int64(i))
	}
	_, err := xw.Write(xbuf)
	require.NoError(t, err)
	for _, m := range []string{"three", "four!"} { // two records: a Read takes one
		_, err = yw.Write([]byte(m))
		require.NoError(t, err)
	}
	before := b.Stats().TakenAhead
	got := make(chan string, 1)
	go func() {
		buf := make([]byte, 10)
		_, err := io.ReadFull(yr, buf)
		if err != nil {
			got <- err.Error()
			return
		}
		got <- string(buf)
	}()
	p.UnlockRX()
	select {
	case m := <-got:
		require.Equal(t, "threefour!", m)
	case <-time.After(10 * time.Second):
		t.Fatal("y's two messages did not arrive (one taken over the other?)")
	}
	require.Greater(t, b.Stats().TakenAhead, before, "y's message should have been taken ahead of x's records")
	require.NoError(t, xw.CloseWrite())
	require.NoError(t, streamIn(xr, 1, xBytes, nil))
}

// TestPiecesBesideSmallMessages: on a partition that carries small
// messages, bulk records are sent, and read, in smallPiece pieces, so a
// process with one P copies no more than that between yields; elsewhere
// a record is MTU-sized and a Read takes all of it.
func TestPiecesBesideSmallMessages(t *testing.T) {
	a, b := endpoints(t, "ntbtest", Config{})
	a.smallFor, b.smallFor = int64(time.Hour), int64(time.Hour)
	xw, xr, yw, yr := samePartition(t, a, b, 1, 2)
	bulk := func() (records int64, reads []int) { // 64 KiB written, read in 256 KiB Reads
		t.Helper()
		before := b.Stats().DataRecords
		done := make(chan error, 1)
		go func() {
			_, err := xw.Write(make([]byte, DefaultMTU))
			done <- err
		}()
		buf := make([]byte, 256<<10)
		for total := 0; total < DefaultMTU; {
			n, err := xr.Read(buf)
			require.NoError(t, err)
			reads, total = append(reads, n), total+n
		}
		require.NoError(t, <-done)
		return b.Stats().DataRecords - before, reads
	}
	records, reads := bulk()
	require.Equal(t, int64(1), records, "no small messages: one record")
	require.Equal(t, []int{DefaultMTU}, reads, "no small messages: one Read")

	echo := func(w, r *Conn) {
		t.Helper()
		for range 2 {
			_, err := w.Write([]byte("ping"))
			require.NoError(t, err)
			_, err = io.ReadFull(r, make([]byte, 4))
			require.NoError(t, err)
		}
	}
	echo(yw, yr) // b's side of the partition carries small messages: Reads take pieces
	// ... when the reader takes the record from the ring itself, or the
	// poller leaves it to it; a reader away for more than readerBack (under
	// -race, once in ~30 runs) finds it queued whole. Three tries.
	pieces := []int{smallPiece, smallPiece, smallPiece, smallPiece}
	for try := 0; ; try++ {
		if _, reads = bulk(); slices.Equal(reads, pieces) || try == 2 {
			break
		}
	}
	require.Equal(t, pieces, reads)
	echo(yr, yw) // and a's: the writer sends pieces
	records, _ = bulk()
	require.Equal(t, int64(DefaultMTU/smallPiece), records)
}

// TestMixedSizesKeepOrder streams small and bulk writes on two connections
// of one partition in both directions at once, readers stalling now and
// then: small messages are taken ahead of bulk records and bulk moves in
// pieces, and every byte must still arrive once, in order.
func TestMixedSizesKeepOrder(t *testing.T) {
	const perConn = 8 << 20
	a, b := endpoints(t, "ntbtest", Config{})
	a.smallFor, b.smallFor = int64(time.Hour), int64(time.Hour)
	xw, xr, yw, yr := samePartition(t, a, b, 1, 2)
	mixed := func(c *Conn, seed uint64) error {
		rng := rand.New(rand.NewPCG(seed, 7))
		buf := make([]byte, 96<<10)
		for off := int64(0); off < perConn; {
			k := int64(1 + rng.IntN(smallWrite)) // mostly small,
			if rng.IntN(4) == 0 {
				k = int64(smallWrite + rng.IntN(len(buf)-smallWrite)) // some bulk
			}
			k = min(k, perConn-off)
			for i := range k {
				buf[i] = pattern(seed, off+i)
			}
			if _, err := c.Write(buf[:k]); err != nil {
				return err
			}
			off += k
		}
		return c.CloseWrite()
	}
	stall := func(seed uint64) func() {
		rng := rand.New(rand.NewPCG(seed, 9))
		return func() {
			if rng.IntN(64) == 0 { // an injected stall: a slow reader, the thing under test
				time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
			}
		}
	}
	errs := make(chan error, 8)
	for i, c := range []*Conn{xw, yw, xr, yr} {
		go func() { errs <- mixed(c, uint64(10+i)) }()
	}
	for i, c := range []*Conn{xr, yr, xw, yw} {
		go func() { errs <- streamIn(c, uint64(10+i), perConn, stall(uint64(i))) }()
	}
	for range 8 {
		require.NoError(t, <-errs)
	}
	t.Logf("taken ahead: %d at a, %d at b", a.Stats().TakenAhead, b.Stats().TakenAhead)
	require.Positive(t, a.Stats().TakenAhead+b.Stats().TakenAhead, "nothing was taken ahead: the test tests nothing")
}
