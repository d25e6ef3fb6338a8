package transport

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/ring"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/partition"
)

// TestCorruption overwrites peer-written parts of a window with random
// bytes, as a faulty or hostile peer could, and checks that the process
// survives and the link fails cleanly:
//
//   - headers: after a random amount of traffic each way, the whole record
//     area of one side's receive ring (so the header it reads next) is
//     garbage. Its next read must fail the link with ErrLinkDown, on both
//     sides.
//   - indices: the read index and wake word in one side's control block
//     are garbage while it streams. The honest peer may rewrite them before
//     they are read, so the outcome is ErrLinkDown or every byte intact.
//
// (Garbage in the payload of records not yet read is delivered as data:
// ntstack validates structure, not content; the link itself is reliable.)
// After every round the link must carry new connections again.
func TestCorruption(t *testing.T) {
	o := shm.Options{Dir: fabricDir(t), WindowSize: 1 << 20}
	devs := make([]*shm.Device, 2)
	eps := make([]*Endpoint, 2)
	for i := range devs {
		d, err := shm.Open("l", o)
		require.NoError(t, err)
		defer d.Close()
		ep, err := Attach(d, Config{Logf: func(string, ...any) {}})
		require.NoError(t, err)
		defer ep.Close()
		devs[i], eps[i] = d, ep
	}
	layout, err := partition.NewLayout(o.WindowSize, 1)
	require.NoError(t, err)

	rng := rand.New(rand.NewPCG(42, 7))
	detected := map[string]int{}
	for round := range 30 {
		conns := [2]*Conn{}
		conns[0], conns[1] = connPair(t, eps[0], eps[1], 100+round)
		for dir := range 2 { // move both rings' positions somewhere random
			n := 1 + rng.IntN(700<<10)
			require.NoError(t, transfer(conns[dir], conns[1-dir], n, byte(round)))
		}
		v := rng.IntN(2) // victim: whose inbound window is damaged
		if rng.IntN(3) > 0 {
			devs[v].CorruptInbound(layout.DataOffset(0)+ring.HeaderSize, layout.RingSize, rng.Uint64())
			// Nothing more is sent: only the victim finding the damage
			// ends these reads. The deadline is a failure guard only.
			for _, c := range []*Conn{conns[v], conns[1-v]} {
				c.SetReadDeadline(time.Now().Add(10 * time.Second))
				_, err := c.Read(make([]byte, 1))
				require.ErrorIs(t, err, ErrLinkDown, "round %d: header corruption on side %d", round, v)
			}
			detected["headers"]++
		} else {
			devs[v].CorruptInbound(layout.CtlOffset(0)+8, 16, rng.Uint64())
			if err := transfer(conns[v], conns[1-v], 2<<20, byte(round)); err != nil {
				require.ErrorIs(t, err, ErrLinkDown, "round %d: index corruption on side %d", round, v)
				detected["indices"]++
			} else {
				detected["indices repaired by the peer"]++
			}
		}
		conns[0].Close()
		conns[1].Close()
	}
	t.Logf("outcomes: %v", detected)
	require.Positive(t, detected["headers"])

	c1, c2 := connPair(t, eps[0], eps[1], 999)
	require.NoError(t, transfer(c1, c2, 1<<20, 9), "the link recovers")
}

// transfer writes n bytes of b from w to r and checks what r reads.
func transfer(w, r *Conn, n int, b byte) error {
	errc := make(chan error, 1)
	go func() {
		chunk := bytes.Repeat([]byte{b}, 16<<10)
		var err error
		for left := n; left > 0 && err == nil; left -= len(chunk) {
			_, err = w.Write(chunk[:min(left, len(chunk))])
		}
		errc <- err
	}()
	buf := make([]byte, 64<<10)
	var rerr error
	for got := 0; got < n && rerr == nil; {
		k, err := r.Read(buf[:min(len(buf), n-got)])
		if !bytes.Equal(buf[:k], bytes.Repeat([]byte{b}, k)) {
			err = errors.New("received a corrupted byte")
		}
		got, rerr = got+k, err
	}
	if rerr != nil {
		w.Close() // unblock the writer
	}
	return errors.Join(rerr, <-errc)
}
