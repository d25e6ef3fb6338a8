package transport

import (
	"bytes"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/ntbtest"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/partition"
)

// bridgeDev is an ntbtest device that says its outbound window is not
// shared memory, as a device behind a bridge: its connections retain by
// copy.
type bridgeDev struct{ *ntbtest.Device }

func (bridgeDev) WindowShared() bool { return false }

// retentionBackends are the test backends with each way of retaining:
// by reference (ntbtest, shm) and by copy (bridge).
func retentionBackends(t *testing.T, f func(t *testing.T, da, db ntb.Device)) {
	for _, name := range []string{"ntbtest", "shm", "bridge"} {
		t.Run(name, func(t *testing.T) {
			if name == "bridge" {
				a, b := ntbtest.NewPair(1 << 20)
				t.Cleanup(func() { a.Close(); b.Close() })
				f(t, bridgeDev{a}, bridgeDev{b})
				return
			}
			da, db := backends[name](t)
			f(t, da, db)
		})
	}
}

// inFlight is how many of c's sent bytes the peer has not acknowledged.
func inFlight(c *Conn) int64 { return c.sent.Load() - c.peerRead.Load() }

// streamData is n seeded bytes.
func streamData(seed uint64, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = pattern(seed, int64(i))
	}
	return b
}

// writeAll writes data in writes of at most piece bytes and reports the
// result on the channel it returns.
func writeAll(c *Conn, data []byte, piece int) <-chan error {
	done := make(chan error, 1)
	go func() {
		for off := 0; off < len(data); {
			n := min(piece, len(data)-off)
			if _, err := c.Write(data[off : off+n]); err != nil {
				done <- err
				return
			}
			off += n
		}
		done <- nil
	}()
	return done
}

// setLink forces d's link down or lets it up again.
func setLink(d ntb.Device, state ntb.LinkState) {
	switch d := d.(type) {
	case *shm.Device:
		if state == ntb.LinkUp {
			d.ForceLinkUp()
		} else {
			d.ForceLinkDown()
		}
	case *ntbtest.Device:
		d.SetLink(state, "test")
	case bridgeDev:
		d.SetLink(state, "test")
	}
}

// A session restarts while a whole window sits unread in the receiver's
// ring: by reference, the sender held no copy of it until the session
// ended; it sends it again from what it copied out of the old ring, and
// the stream arrives byte-exact on the same Conns.
func TestKeepResumeUnreadRing(t *testing.T) {
	retentionBackends(t, func(t *testing.T, da, db ntb.Device) {
		a, b := attachPair(t, da, db, Config{})
		c1, c2 := connPair(t, a, b, 300)
		defer c1.Close()
		defer c2.Close()
		window := c1.st().window
		data := streamData(1, int(3*window))
		done := writeAll(c1, data, 64<<10)
		// Some is read first, so what waits unread wraps round the end of
		// the ring (the window is half the ring): the next session's
		// records, from the ring's start, land on it before it is sent
		// again.
		got := make([]byte, len(data))
		skip := 3*window/2 + 12345
		_, err := io.ReadFull(c2, got[:skip])
		require.NoError(t, err)
		require.Eventually(t, func() bool { return inFlight(c1) == window }, 30*time.Second, time.Millisecond,
			"the writer fills the window while nobody reads")
		if a.byRef {
			require.Zero(t, c1.keep.size(), "by reference, nothing is copied while the ring holds it")
		} else {
			require.GreaterOrEqual(t, c1.keep.size(), int(window))
		}
		first := epoch(a)
		restart(b)
		newEpoch(t, a, first)
		resumed(t, a, b, 1)
		_, err = io.ReadFull(c2, got[skip:])
		require.NoError(t, err)
		require.NoError(t, <-done)
		require.True(t, bytes.Equal(data, got), "the stream arrives byte-exact")
		require.Zero(t, a.Stats().Resets+b.Stats().Resets)
	})
}

// A connection whose reader stops while another streams on the same ring:
// its bytes leave the ring for its receive queue unacknowledged, and the
// ring comes round over them; by reference the sender drops them then,
// uncopied, as the peer holds them. A restart then, and a link flap after
// it, lose none of either stream.
func TestKeepResumeOverwrittenRing(t *testing.T) {
	retentionBackends(t, func(t *testing.T, da, db ntb.Device) {
		a, b := attachPair(t, da, db, Config{})
		slow1, slow2 := connPair(t, a, b, 301)
		fast1, fast2 := connPair(t, a, b, 302)
		defer slow1.Close()
		defer slow2.Close()
		defer fast1.Close()
		defer fast2.Close()
		require.Equal(t, slow1.Partition(), fast1.Partition(), "one partition: one ring")
		ringSize := int64(slow1.st().parts[slow1.Partition()].RxRingSize())
		slowData := streamData(2, 1<<20)
		fastData := streamData(3, int(4*ringSize))
		slowDone := writeAll(slow1, slowData, 16<<10)
		require.Eventually(t, func() bool { return inFlight(slow1) > 0 && slow2.queued.Load() > 0 }, 30*time.Second, time.Millisecond,
			"the slow connection's bytes wait in its receive queue")
		held := inFlight(slow1)
		fastDone := writeAll(fast1, fastData, 64<<10)
		fastGot := make([]byte, len(fastData))
		fastRead := make(chan error, 1)
		go func() {
			_, err := io.ReadFull(fast2, fastGot[:2*ringSize])
			fastRead <- err
		}()
		require.NoError(t, <-fastRead, "the fast stream laps the ring")
		if a.byRef {
			require.Zero(t, slow1.keep.size(), "the ring came round: the peer holds what it overwrote, nothing is copied")
			require.Greater(t, slow1.keep.from(slow1.peerRead.Load()), slow1.peerRead.Load(),
				"the retention begins past the acknowledgement")
		} else {
			require.GreaterOrEqual(t, int64(slow1.keep.size()), min(held, inFlight(slow1)))
		}
		first := epoch(a)
		restart(a)
		newEpoch(t, a, first)
		resumed(t, a, b, 2)
		go func() {
			_, err := io.ReadFull(fast2, fastGot[2*ringSize:])
			fastRead <- err
		}()
		slowGot := make([]byte, len(slowData))
		_, err := io.ReadFull(slow2, slowGot)
		require.NoError(t, err)
		require.NoError(t, <-fastRead)
		require.NoError(t, <-slowDone)
		require.NoError(t, <-fastDone)
		require.True(t, bytes.Equal(slowData, slowGot), "the slow stream arrives byte-exact")
		require.True(t, bytes.Equal(fastData, fastGot), "the fast stream arrives byte-exact")
		require.Zero(t, a.Stats().Resets+b.Stats().Resets)
	})
}

// The link fails while records are in flight and the writer is mid-write
// (bytes sent, not yet read): the stream resumes byte-exact once the link
// is back, both ways at once.
func TestKeepResumeLinkFailsInFlight(t *testing.T) {
	retentionBackends(t, func(t *testing.T, da, db ntb.Device) {
		a, b := attachPair(t, da, db, Config{})
		c1, c2 := connPair(t, a, b, 303)
		defer c1.Close()
		defer c2.Close()
		window := c1.st().window
		d12, d21 := streamData(4, int(4*window)), streamData(5, int(4*window))
		done12, done21 := writeAll(c1, d12, 100<<10), writeAll(c2, d21, 3<<10)
		got12, got21 := make([]byte, len(d12)), make([]byte, len(d21))
		half := make(chan error, 2)
		go func() { _, err := io.ReadFull(c2, got12[:window]); half <- err }()
		go func() { _, err := io.ReadFull(c1, got21[:window]); half <- err }()
		require.NoError(t, <-half)
		require.NoError(t, <-half)
		require.Eventually(t, func() bool { return inFlight(c1) > 0 && inFlight(c2) > 0 }, 30*time.Second, time.Millisecond)
		setLink(da, ntb.LinkDown)
		require.Eventually(t, func() bool { return epoch(a) == 0 && epoch(b) == 0 }, 30*time.Second, time.Millisecond,
			"both ends should see the link down")
		setLink(da, ntb.LinkUp)
		go func() { _, err := io.ReadFull(c2, got12[window:]); half <- err }()
		go func() { _, err := io.ReadFull(c1, got21[window:]); half <- err }()
		require.NoError(t, <-half)
		require.NoError(t, <-half)
		require.NoError(t, <-done12)
		require.NoError(t, <-done21)
		require.True(t, bytes.Equal(d12, got12), "a to b arrives byte-exact")
		require.True(t, bytes.Equal(d21, got21), "b to a arrives byte-exact")
		resumed(t, a, b, 1)
		require.Zero(t, a.Stats().Resets+b.Stats().Resets)
	})
}

// Retained by reference over a ring that comes round: whatever the ring
// overwrites, materialize and bytesAt give back exactly the bytes from
// where the retention begins to what was sent, small records copied and
// large ones referenced alike, at every step and once the ring is
// scribbled over (a new session's records). What the ring overwrites the
// peer took off it: it is dropped, unacknowledged, and the retention
// begins past it — unless the connection moved partitions and the peer
// has not read up to the MOVE, when it is copied out and the retention
// begins at the acknowledgement.
func TestKeepRefsRing(t *testing.T) {
	for _, moved := range []bool{false, true} {
		t.Run(map[bool]string{false: "taken", true: "moved"}[moved], func(t *testing.T) {
			keepRefsRing(t, moved)
		})
	}
}

func keepRefsRing(t *testing.T, moved bool) {
	const size = 64 << 10
	mem := make([]byte, size)
	c := newConn(nil, Addr{}, Addr{})
	if moved {
		c.movedAt.Store(1 << 40) // the peer never reads up to it
	}
	part := &partition.Partition{} // the ring's, for the spans
	var q ringRefs
	rng := rand.New(rand.NewPCG(7, 8))
	var stream []byte
	var sent, pos int64   // stream offset, ring write position
	var overwritten int64 // the stream offset the ring has overwritten up to
	var ends []int64      // the ring's records' ends and positions, in order
	var ats []int64
	check := func() {
		t.Helper()
		ack := c.peerRead.Load()
		from := c.keep.from(ack)
		if moved {
			require.Equal(t, ack, from, "a move pending: retained from the acknowledgement")
		} else {
			require.Equal(t, max(ack, overwritten), from, "retained from the acknowledgement or what the ring overwrote")
		}
		require.True(t, c.keep.holds(from, sent), "holds %d..%d", from, sent)
		for o := from; o < sent; {
			b := c.keep.bytesAt(o, sent)
			require.NotEmpty(t, b, "byte %d not retained", o)
			require.True(t, bytes.Equal(b, stream[o:o+int64(len(b))]), "bytes from %d differ", o)
			o += int64(len(b))
		}
	}
	send := func(n int) {
		b := make([]byte, n)
		for k := range b {
			b[k] = byte(rng.Uint32())
		}
		stream = append(stream, b...)
		if pos%size+int64(n) > size {
			pos += size - pos%size // padding at the end
		}
		below := max(0, pos+int64(n)-size)
		q.overwrite(part, uint64(below))
		for len(ats) > 0 && ats[0] < below {
			overwritten = ends[0]
			ends, ats = ends[1:], ats[1:]
		}
		ref := mem[pos%size:][:n:n]
		copy(ref, b)
		if n <= keepSmall {
			c.keep.addSmall(sent, b, c.peerRead.Load())
		} else {
			c.keep.addRef(sent, ref, part, uint64(pos), c.peerRead.Load())
			q.push(c, sent+int64(n), uint64(pos))
			ends, ats = append(ends, sent+int64(n)), append(ats, pos)
		}
		sent += int64(n)
		pos += int64(n)
	}
	for i := range 3000 {
		n := 1 + rng.IntN(6000)
		if rng.IntN(3) == 0 {
			n = 1 + rng.IntN(keepSmall)
		}
		send(n)
		// The peer acknowledges in bursts, every 50 records: about
		// 100 KiB in flight between them, more than the ring, which
		// comes round over unacknowledged bytes (read off it into the
		// peer's queue).
		if i%50 == 49 {
			c.peerRead.Store(max(c.peerRead.Load(), sent-int64(rng.IntN(8<<10))))
		}
		if i%7 == 0 {
			check()
		}
	}
	send(5000) // unacknowledged, in the ring
	send(100)
	c.keep.materialize(c.peerRead.Load())
	for i := range mem {
		mem[i] = 0xee
	}
	check()
	if !moved {
		require.Less(t, c.keep.size(), 64<<10, "little copied: the small records since the ring last came round")
	}
}

// Sessions restarted back to back while what waited unread is being sent
// again: each resume sends again everything from what the peer received,
// once, whichever session the last RESUME was read on, and the stream
// arrives byte-exact.
func TestKeepResumeBackToBack(t *testing.T) {
	retentionBackends(t, func(t *testing.T, da, db ntb.Device) {
		a, b := attachPair(t, da, db, Config{Batch: 16 << 10})
		c1, c2 := connPair(t, a, b, 304)
		defer c1.Close()
		defer c2.Close()
		window := c1.st().window
		data := streamData(6, int(6*window))
		done := writeAll(c1, data, 64<<10)
		got := make([]byte, len(data))
		read := 0
		for round := range 4 {
			// Half a window or more waits unread, then two restarts: the
			// second comes as soon as the first's session is up, while
			// what waited is being sent again in 16 KiB passes.
			require.Eventually(t, func() bool { return inFlight(c1) >= window/2 }, 30*time.Second, time.Millisecond,
				"round %d: the writer fills half the window", round)
			e := epoch(a)
			restart(b)
			e = newEpoch(t, a, e)
			restart(a)
			newEpoch(t, a, e)
			n, err := io.ReadFull(c2, got[read:read+int(window)])
			require.NoError(t, err)
			read += n
		}
		_, err := io.ReadFull(c2, got[read:])
		require.NoError(t, err)
		require.NoError(t, <-done)
		require.True(t, bytes.Equal(data, got), "the stream arrives byte-exact")
		require.Zero(t, a.Stats().Resets+b.Stats().Resets)
	})
}
