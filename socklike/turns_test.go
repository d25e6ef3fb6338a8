package socklike

import (
	"io"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/ntb/ntbtest"
)

// Beyond turnSlots connections over rings large enough, credit goes in
// turns. Sixteen writers each stop a little way into their first turn and
// stay open, holding its credit; four more stream 32 MiB each beside them.
// Every byte arrives in order, turns are granted, and the unused ones are
// written off, so the streams finish.
func TestCreditTurns(t *testing.T) {
	da, db := ntbtest.NewPair(16 << 20)
	t.Cleanup(func() { da.Close(); db.Close() })
	a, err := Attach(da, Config{Logf: t.Logf})
	require.NoError(t, err)
	b, err := Attach(db, Config{Logf: t.Logf})
	require.NoError(t, err)
	t.Cleanup(func() { a.Close(); b.Close() })
	ln, err := b.Listen(9)
	require.NoError(t, err)
	defer ln.Close()

	const idle, bulk, size = 16, 4, 32 << 20
	deadline := time.Now().Add(time.Minute)
	pair := func() (*Conn, *Conn) {
		c, err := a.Dial(9)
		require.NoError(t, err)
		s, err := ln.AcceptConn()
		require.NoError(t, err)
		c.SetDeadline(deadline)
		s.SetDeadline(deadline)
		t.Cleanup(func() { c.Close(); s.Close() })
		return c, s
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2*(idle+bulk))
	// Each idle writer sends its window, which needs no turn, then a
	// record and a byte more, on its first turn, and stops.
	for i := range idle {
		c, s := pair()
		part := s.st.window + DefaultMTU + 1
		wg.Add(2)
		go func() {
			defer wg.Done()
			errs <- streamOutOpen(c, uint64(i), part)
		}()
		go func() {
			defer wg.Done()
			errs <- streamInN(s, uint64(i), part)
		}()
	}
	wg.Wait()
	for i := range bulk {
		c, s := pair()
		wg.Add(2)
		go func() {
			defer wg.Done()
			errs <- streamOut(c, uint64(idle+i), size, rand.New(rand.NewPCG(5, uint64(i))))
		}()
		go func() {
			defer wg.Done()
			errs <- streamIn(s, uint64(idle+i), size, nil)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	st := b.Stats()
	t.Logf("turns %d, written off %d, credits %d", st.Turns, st.TurnsExpired, st.Credits)
	require.Positive(t, st.Turns)
	require.Positive(t, st.TurnsExpired)
}

// streamOutOpen writes n pattern bytes in writes of a record and leaves
// the connection open.
func streamOutOpen(c *Conn, seed uint64, n int64) error {
	buf := make([]byte, DefaultMTU)
	for off := int64(0); off < n; {
		k := min(int64(len(buf)), n-off)
		for i := range k {
			buf[i] = pattern(seed, off+i)
		}
		if _, err := c.Write(buf[:k]); err != nil {
			return err
		}
		off += k
	}
	return nil
}

// streamInN reads and checks n pattern bytes.
func streamInN(c *Conn, seed uint64, n int64) error {
	buf := make([]byte, n)
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	for i, v := range buf {
		if v != pattern(seed, int64(i)) {
			return io.ErrUnexpectedEOF
		}
	}
	return nil
}
