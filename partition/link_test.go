package partition

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/ring"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/ntbtest"
)

// sessions records the sessions a Link establishes.
type sessions chan *Session

func (s sessions) next(t *testing.T) *Session {
	t.Helper()
	select {
	case x := <-s:
		return x
	case <-time.After(5 * time.Second):
		t.Fatal("no session established")
		return nil
	}
}

func openLinks(t *testing.T, da, db ntb.Device) (*Link, *Link, sessions, sessions) {
	t.Helper()
	sa, sb := make(sessions, 16), make(sessions, 16)
	la, err := Open(da, Config{OnSession: func(s *Session) { sa <- s }, Logf: t.Logf})
	require.NoError(t, err)
	lb, err := Open(db, Config{OnSession: func(s *Session) { sb <- s }, Logf: t.Logf})
	require.NoError(t, err)
	t.Cleanup(func() { la.Close(); lb.Close() })
	return la, lb, sa, sb
}

// exchange sends one record each way through partition 0 and checks it.
func exchange(t *testing.T, a, b *Session) {
	t.Helper()
	for _, dir := range [][2]*Session{{a, b}, {b, a}} {
		tx, rx := dir[0].Partitions()[0], dir[1].Partitions()[0]
		require.NoError(t, tx.TrySend(7, []byte("hdr"), []byte("body")))
		rx.LockRX()
		tag, p, ok, err := rx.Peek()
		require.NoError(t, err)
		require.True(t, ok)
		require.Equal(t, uint32(7), tag)
		require.Equal(t, "hdrbody", string(p))
		rx.Release()
		rx.UnlockRX()
	}
}

func TestHandshake(t *testing.T) {
	da, db := ntbtest.NewPair(1 << 20)
	la, lb, sa, sb := openLinks(t, da, db)
	a, b := sa.next(t), sb.next(t)
	require.Equal(t, a.Epoch, b.Epoch)
	require.Equal(t, a, la.Current())
	require.Equal(t, b, lb.Current())
	exchange(t, a, b)

	// Either side failing the session makes both start a new one.
	for _, failer := range []func(){func() { a.Fail(errors.New("test")) }, func() { b.Fail(errors.New("test")) }} {
		failer()
		<-a.Done()
		<-b.Done()
		a, b = sa.next(t), sb.next(t)
		require.Equal(t, a.Epoch, b.Epoch)
		exchange(t, a, b)
	}

	// Link down ends it; link up brings a new one.
	da.SetLink(ntb.LinkDown, "cable pulled")
	<-a.Done()
	<-b.Done()
	require.ErrorIs(t, a.Err(), ErrSessionEnded)
	require.ErrorContains(t, a.Err(), "link down (cable pulled)", "the device's reason is passed on")
	da.SetLink(ntb.LinkUp, "test")
	a, b = sa.next(t), sb.next(t)
	exchange(t, a, b)
}

func TestPeerRestart(t *testing.T) {
	for _, restart := range []int{0, 1} {
		da, db := ntbtest.NewPair(1 << 20)
		la, lb, sa, sb := openLinks(t, da, db)
		a, b := sa.next(t), sb.next(t)
		exchange(t, a, b)
		// One side's process "restarts": a new Link on the same port.
		var fresh sessions = make(sessions, 16)
		if restart == 0 {
			require.NoError(t, la.Close())
			<-a.Done()
			_, err := Open(da, Config{OnSession: func(s *Session) { fresh <- s }})
			require.NoError(t, err)
			a, b = fresh.next(t), sb.next(t)
		} else {
			require.NoError(t, lb.Close())
			<-b.Done()
			_, err := Open(db, Config{OnSession: func(s *Session) { fresh <- s }})
			require.NoError(t, err)
			a, b = sa.next(t), fresh.next(t)
		}
		require.Equal(t, a.Epoch, b.Epoch)
		exchange(t, a, b)
	}
}

func TestVersionMismatchRefused(t *testing.T) {
	w := make([]byte, 1<<20)
	l, err := NewLayout(len(w), 1)
	require.NoError(t, err)
	require.NoError(t, l.format(w))
	binary.LittleEndian.PutUint16(w[offWinVersion:], winVersion+1)
	_, err = peerLayout(w, 1)
	require.ErrorContains(t, err, fmt.Sprintf("peer speaks window layout version %d, this build speaks %d", winVersion+1, winVersion))
	require.NoError(t, l.format(w))
	_, err = peerLayout(w, 2)
	require.ErrorContains(t, err, "peer has 1 partitions, this side 2")
}

func TestLayoutArithmetic(t *testing.T) {
	l, err := NewLayout(16<<20, 1)
	require.NoError(t, err)
	require.Equal(t, 8<<20, l.RingSize, "the default window gives one 8 MiB ring")
	l, err = NewLayout(16<<20, 4)
	require.NoError(t, err)
	require.Equal(t, 2<<20, l.RingSize)
	w := make([]byte, 16<<20)
	require.NoError(t, l.format(w))
	end := l.dataBase + 4*ring.RegionSize(l.RingSize) + ring.RegionSize(l.ControlRing)
	require.LessOrEqual(t, end, len(w))
	_, err = NewLayout(8<<10, 1)
	require.Error(t, err)
}

// TestRingOnEnd: a batch marked with RingOnEnd rings the peer's data
// doorbell although the peer has not armed it, and only that batch does.
func TestRingOnEnd(t *testing.T) {
	da, db := ntbtest.NewPair(1 << 20)
	_, _, sa, sb := openLinks(t, da, db)
	a, b := sa.next(t), sb.next(t)
	tx, rx := a.Partitions()[0], b.Partitions()[0]
	bit := rx.DataBit()
	drain := func() {
		t.Helper()
		rx.LockRX()
		defer rx.UnlockRX()
		for {
			_, _, ok, err := rx.Peek()
			require.NoError(t, err)
			if !ok {
				return
			}
			rx.Release()
		}
	}
	// A first record takes any arming left from the session's start.
	require.NoError(t, tx.TrySend(7, nil, []byte("first")))
	drain()
	db.ClearDoorbells(bit)

	require.NoError(t, tx.TrySend(7, nil, []byte("unarmed")))
	require.Zero(t, db.Doorbells()&bit, "a record to an unarmed ring rang")
	drain()

	tx.BeginTX()
	require.NoError(t, tx.Send(7, nil, []byte("open")))
	tx.RingOnEnd()
	tx.EndTX()
	require.NotZero(t, db.Doorbells()&bit, "RingOnEnd's batch did not ring")
	drain()
	db.ClearDoorbells(bit)

	require.NoError(t, tx.TrySend(7, nil, []byte("after")))
	require.Zero(t, db.Doorbells()&bit, "RingOnEnd outlived its batch")
}
