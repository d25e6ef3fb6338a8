package transport

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// tapLog collects tapped frames, copying their payloads as a tap must.
type tapLog struct {
	mu   sync.Mutex
	recs []TapRecord
}

func (l *tapLog) tap(r TapRecord) {
	r.Payload = append([]byte(nil), r.Payload...)
	l.mu.Lock()
	l.recs = append(l.recs, r)
	l.mu.Unlock()
}

func (l *tapLog) snapshot() []TapRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]TapRecord(nil), l.recs...)
}

// find returns the first record matching dir and kind.
func (l *tapLog) find(dir TapDir, kind FrameKind) (TapRecord, bool) {
	for _, r := range l.snapshot() {
		if r.Dir == dir && r.Kind == kind {
			return r, true
		}
	}
	return TapRecord{}, false
}

// TestTap: both ends' taps see every kind of a connection's life, in both
// directions, with the ids, rings and payloads the frames carried; removed
// taps see nothing more.
func TestTap(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		a, b := endpoints(t, backend, Config{Window: 16 << 10, Partitions: 2})
		var la, lb tapLog
		removeA := a.AddTap(la.tap)
		removeB := b.AddTap(lb.tap)
		c1, c2 := connPair(t, a, b, 7)
		require.NoError(t, c1.Migrate(1))
		msg := []byte("SET k v")
		total := 0
		for total < 8<<10 { // past an eighth of the window: CREDIT
			_, err := c1.Write(msg)
			require.NoError(t, err)
			total += len(msg)
			_, err = io.ReadFull(c2, make([]byte, len(msg)))
			require.NoError(t, err)
		}
		require.NoError(t, c1.Close())
		_, err := c2.Read(make([]byte, 1))
		require.ErrorIs(t, err, io.EOF)
		require.NoError(t, c2.Close())

		require.Eventually(t, func() bool {
			_, ok1 := la.find(TapRX, FrameClose)
			_, ok2 := lb.find(TapRX, FrameClose)
			return ok1 && ok2
		}, 5*time.Second, time.Millisecond)

		open, ok := la.find(TapTX, FrameOpen)
		require.True(t, ok)
		require.Equal(t, c1.ID(), open.Conn)
		require.Equal(t, c1.ID(), open.Local)
		require.Len(t, open.Payload, 20)
		open, ok = lb.find(TapRX, FrameOpen)
		require.True(t, ok)
		require.Equal(t, c1.ID(), open.Conn)
		require.Zero(t, open.Local, "an OPEN received belongs to no connection yet")

		accept, ok := lb.find(TapTX, FrameAccept)
		require.True(t, ok)
		require.Equal(t, c1.ID(), accept.Conn)
		require.Equal(t, c2.ID(), accept.Local)
		accept, ok = la.find(TapRX, FrameAccept)
		require.True(t, ok)
		require.Equal(t, c1.ID(), accept.Local)

		move, ok := la.find(TapTX, FrameMove)
		require.True(t, ok)
		require.Equal(t, []byte{1, 0, 0, 0}, move.Payload)

		data, ok := la.find(TapTX, FrameData)
		require.True(t, ok)
		require.Equal(t, msg, data.Payload)
		require.Equal(t, c2.ID(), data.Conn)
		require.Equal(t, c1.ID(), data.Local)
		data, ok = lb.find(TapRX, FrameData)
		require.True(t, ok)
		require.Equal(t, msg, data.Payload)
		require.Equal(t, c2.ID(), data.Local)

		credit, ok := lb.find(TapTX, FrameCredit)
		require.True(t, ok)
		require.Equal(t, TapControl, credit.Ring)
		require.Equal(t, c2.ID(), credit.Local)
		require.Equal(t, c1.ID(), credit.Conn)
		credit, ok = la.find(TapRX, FrameCredit)
		require.True(t, ok)
		require.Equal(t, TapControl, credit.Ring)

		for _, l := range []*tapLog{&la, &lb} {
			var tx, rx int
			for _, r := range l.snapshot() {
				if r.Kind == FrameData {
					if r.Dir == TapTX {
						tx += len(r.Payload)
					} else {
						rx += len(r.Payload)
					}
				}
				if r.Ring != TapControl {
					require.Contains(t, []int{0, 1}, r.Ring)
				}
			}
			require.Equal(t, total, tx+rx, "DATA bytes one way, none the other")
		}

		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err = a.DialContext(ctx, 9) // nobody listens: REFUSE
		require.Error(t, err)
		// b's tap sees its REFUSE just after sending it: a's dial may
		// return first.
		var refuse TapRecord
		require.Eventually(t, func() bool {
			refuse, ok = lb.find(TapTX, FrameRefuse)
			return ok
		}, time.Second, time.Millisecond)
		require.Zero(t, refuse.Local)
		require.Equal(t, []byte{refuseNoListener, 0, 0, 0}, refuse.Payload)
		refuse, ok = la.find(TapRX, FrameRefuse)
		require.True(t, ok)
		require.Equal(t, refuse.Conn, refuse.Local)

		removeA()
		removeA() // idempotent
		removeB()
		require.Nil(t, a.taps.Load())
		n := len(la.snapshot())
		c3, c4 := connPair(t, a, b, 7)
		c3.Close()
		c4.Close()
		require.Len(t, la.snapshot(), n)
	})
}

// TestTapKinds names every frame kind.
func TestTapKinds(t *testing.T) {
	var names []string
	for k := FrameOpen; k <= FrameReset; k++ {
		names = append(names, k.String())
	}
	require.Equal(t, []string{"OPEN", "ACCEPT", "REFUSE", "DATA", "FIN", "CLOSE", "CREDIT", "MOVE", "WANT", "RESUME", "RESET"}, names)
	require.Equal(t, "FrameKind(12)", FrameKind(12).String())
	require.Equal(t, "rx", TapRX.String())
}
