package socklike

import (
	"context"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/appproto"
	"github.com/ntstack/ntstack/internal/wire/errcode"
	"github.com/ntstack/ntstack/ntb/ntbtest"
)

// transportPair attaches a transport endpoint to each end of an in-memory
// link, closed when t ends.
func transportPair(t *testing.T) (*transport.Endpoint, *transport.Endpoint) {
	t.Helper()
	da, db := ntbtest.NewPair(1 << 20)
	a, err := transport.Attach(da, transport.Config{Logf: t.Logf})
	require.NoError(t, err)
	b, err := transport.Attach(db, transport.Config{Logf: t.Logf})
	require.NoError(t, err)
	t.Cleanup(func() {
		a.Close()
		b.Close()
		da.Close()
		db.Close()
	})
	return a, b
}

// earlyDial starts dialEarly over a new direct link, the lease a
// connection over another link whose far end (the proxy's) it returns;
// refused is closed once the far end of the direct link has refused an
// OPEN.
func earlyDial(t *testing.T) (far *transport.Endpoint, proxy *transport.Conn, refused <-chan struct{}, done <-chan error) {
	t.Helper()
	near, far := transportPair(t)
	la, lb := transportPair(t)
	ln, err := lb.Listen(7)
	require.NoError(t, err)
	defer ln.Close()
	lease, err := la.Dial(7)
	require.NoError(t, err)
	t.Cleanup(func() { lease.Close() })
	proxy, err = ln.AcceptConn()
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	ref := make(chan struct{})
	var once sync.Once
	remove := near.AddTap(func(r transport.TapRecord) {
		if r.Dir == transport.TapRX && r.Kind == transport.FrameRefuse {
			once.Do(func() { close(ref) })
		}
	})
	t.Cleanup(remove)
	errc := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		dc, verdict, err := dialEarly(ctx, near, lease)
		if dc != nil {
			if _, werr := dc.Write([]byte("x")); werr != nil && err == nil {
				err = werr
			}
			t.Cleanup(func() { dc.Close() })
		}
		if verdict != nil {
			err = verdict
		}
		errc <- err
	}()
	return far, proxy, ref, errc
}

// A dial that reaches the far end before it listens is refused, and made
// again once the verdict is OK.
func TestDialEarlyRedialsAfterRefusal(t *testing.T) {
	far, proxy, refused, done := earlyDial(t)
	<-refused
	ln, err := far.Listen(appproto.DirectPort)
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan *transport.Conn, 1)
	go func() {
		c, err := ln.AcceptConn()
		if err == nil {
			accepted <- c
		}
	}()
	require.NoError(t, appproto.WriteFrame(proxy, appproto.DialReply{}))
	require.NoError(t, <-done, "the dial is made again and succeeds")
	c := <-accepted
	defer c.Close()
	b := make([]byte, 1)
	_, err = c.Read(b)
	require.NoError(t, err)
	require.Equal(t, "x", string(b))
}

// A failed verdict ends the dial with the proxy's answer.
func TestDialEarlyVerdictFails(t *testing.T) {
	_, proxy, refused, done := earlyDial(t)
	<-refused
	require.NoError(t, appproto.WriteFrame(proxy, appproto.DialReply{Code: errcode.CodeRefused, Error: "nobody listens on b:80"}))
	err := <-done
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.ErrorContains(t, err, "nobody listens on b:80")
}
