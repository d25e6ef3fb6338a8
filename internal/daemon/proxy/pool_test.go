package proxy

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/pool"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/socklike"
)

// poolEcho listens on b:80 in shared-pool mode and echoes; accepted
// receives each connection's type.
func poolEcho(t *testing.T, r *rack) (accepted chan net.Conn) {
	srv := attach(t, r.cb)
	ln, err := (&socklike.ListenConfig{Proxy: srv, Pool: true}).Listen(context.Background(), "tcp", ":80")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	accepted = make(chan net.Conn, 64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
			go func() {
				io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	return accepted
}

func appMemory(s *Server) int64 {
	var m int64
	for _, a := range s.Snapshot().Apps {
		m += a.Memory
	}
	return m
}

// Shared-pool mode: both applications write and read their slots in
// place; every byte arrives, the slots' memory comes back, and a dial that
// cannot have a slot settles for the memory link and says why.
func TestPool(t *testing.T) {
	r := newRack(t, "", "pool_slots = 2\npool_ring = 65536")
	accepted := poolEcho(t, r)
	client := attach(t, r.ca)
	base := appMemory(r.a)
	ctx := context.Background()

	c, err := (&socklike.Dialer{Proxy: client, Pool: true}).DialContext(ctx, "tcp", "b:80")
	require.NoError(t, err)
	pc := c.(*socklike.Conn)
	require.Equal(t, "pool", pc.Route().Mode, "a pool connection")
	require.Equal(t, ctlapi.PathNTB, pc.Route().Path)
	require.Contains(t, pc.Route().Reason, "shared pool")
	require.Equal(t, "pool", (<-accepted).(*socklike.Conn).Route().Mode, "b's end is in shared-pool mode too")
	for i, size := range []int{1, 64, 4096, 65536, 1 << 20, 3<<20 + 17} {
		roundTrip(t, c, uint64(i), size) // up to 48 times a ring
	}
	require.Greater(t, appMemory(r.a), base, "the slot is charged while in use")
	snap := r.a.Snapshot()
	require.Len(t, snap.Conns, 1)
	require.Equal(t, uint64(1<<20+3<<20+17+65536+4096+64+1), snap.Conns[0].BytesTX)

	// Two slots: the third connection goes through the memory link.
	c2, err := (&socklike.Dialer{Proxy: client, Pool: true}).DialContext(ctx, "tcp", "b:80")
	require.NoError(t, err)
	c3, err := (&socklike.Dialer{Proxy: client, Pool: true}).DialContext(ctx, "tcp", "b:80")
	require.NoError(t, err)
	require.Equal(t, "proxy", c3.(*socklike.Conn).Route().Mode)
	require.Contains(t, c3.(*socklike.Conn).Route().Reason, "shared pool refused (all 2 shared-pool slots are in use")
	for _, x := range []net.Conn{c2, c3} {
		roundTrip(t, x, 9, 100000)
	}

	// A connection on this host never leaves shared memory.
	lnA, err := (&socklike.ListenConfig{Proxy: client}).Listen(context.Background(), "tcp", ":0")
	require.NoError(t, err)
	defer lnA.Close()
	go echo(lnA)
	c4, err := (&socklike.Dialer{Proxy: client, Pool: true}).DialContext(ctx, "tcp", fmt.Sprintf("a:%d", lnA.Addr().(socklike.Addr).Port))
	require.NoError(t, err)
	require.Contains(t, c4.(*socklike.Conn).Route().Reason, "shared pool refused (a connection on this host never leaves shared memory)")
	roundTrip(t, c4, 3, 1000)

	for _, x := range []net.Conn{c, c2, c3, c4} {
		require.NoError(t, x.Close())
	}
	require.Eventually(t, func() bool {
		return len(r.a.Snapshot().Conns) == 0 && len(r.b.Snapshot().Conns) == 0 && appMemory(r.a) == base
	}, 5*time.Second, 10*time.Millisecond, "connections end, slots come back")
	// And are granted again.
	c5, err := (&socklike.Dialer{Proxy: client, Pool: true}).DialContext(ctx, "tcp", "b:80")
	require.NoError(t, err)
	require.Equal(t, "pool", c5.(*socklike.Conn).Route().Mode)
	roundTrip(t, c5, 5, 200000)
	require.NoError(t, c5.Close())
}

// A shared-pool connection passes the standard library's conformance
// suite.
func TestPoolNettest(t *testing.T) {
	r := newRack(t, "", "pool_ring = 65536")
	srv := attach(t, r.cb)
	client := attach(t, r.ca)
	ln, err := (&socklike.ListenConfig{Proxy: srv, Pool: true}).Listen(context.Background(), "tcp", ":0")
	require.NoError(t, err)
	defer ln.Close()
	addr := fmt.Sprintf("b:%d", ln.Addr().(socklike.Addr).Port)
	conformance(t, ln, func(ctx context.Context) (net.Conn, error) {
		c, err := (&socklike.Dialer{Proxy: client, Pool: true}).DialContext(ctx, "tcp", addr)
		if err == nil {
			if r := c.(*socklike.Conn).Route(); r.Mode != "pool" {
				c.Close()
				return nil, fmt.Errorf("dialed a %s connection: %s", r.Mode, r.Reason)
			}
		}
		return c, err
	})
}

// Failover in shared-pool mode: the leg resends from the application's
// out ring, which keeps every byte until the far end acknowledges it.
func TestPoolFailover(t *testing.T) {
	port := 20000 + rand.IntN(20000)
	r := newRack(t, fmt.Sprintf(`fallback = "{peer}:%d"`, port), fmt.Sprintf(`fallback = "{self}:%d"`, port), "pool_ring = 262144")
	poolEcho(t, r)
	client := attach(t, r.ca)
	c, err := (&socklike.Dialer{Proxy: client, Pool: true}).DialContext(context.Background(), "tcp", "b:80")
	require.NoError(t, err)
	require.Equal(t, "pool", c.(*socklike.Conn).Route().Mode)
	defer c.Close()
	streamThroughOutage(t, r, c, 32<<20, ctlapi.PathTCP)
}

// An application that goes away mid-stream: its proxy ends its
// connections and takes its pool back; the peer's end sees the end.
func TestPoolDetach(t *testing.T) {
	r := newRack(t, "")
	accepted := poolEcho(t, r)
	client, err := socklike.AttachProxy(r.ca.Path(config.ProxySocket), socklike.Config{})
	require.NoError(t, err)
	var conns []net.Conn
	for range 3 {
		c, err := (&socklike.Dialer{Proxy: client, Pool: true}).DialContext(context.Background(), "tcp", "b:80")
		require.NoError(t, err)
		roundTrip(t, c, 1, 300000)
		conns = append(conns, c)
		<-accepted
	}
	go conns[0].Write(make([]byte, 8<<20)) // mid-stream
	require.NoError(t, client.Close())
	_, err = conns[1].Read(make([]byte, 1))
	require.ErrorIs(t, err, socklike.ErrProxyGone)
	require.Eventually(t, func() bool {
		sa, sb := r.a.Snapshot(), r.b.Snapshot()
		return len(sa.Apps) == 0 && len(sa.Conns) == 0 && len(sb.Conns) == 0
	}, 5*time.Second, 10*time.Millisecond)
	for _, c := range conns {
		c.Close()
	}
}

// An application that writes nonsense into its slot's indices loses that
// connection (reset), never the proxy: the others carry on.
func TestPoolCorruptIndices(t *testing.T) {
	r := newRack(t, "", "pool_ring = 65536")
	poolEcho(t, r)
	client := attach(t, r.ca)
	ctx := context.Background()
	bad, err := (&socklike.Dialer{Proxy: client, Pool: true}).DialContext(ctx, "tcp", "b:80")
	require.NoError(t, err)
	good, err := (&socklike.Dialer{Proxy: client, Pool: true}).DialContext(ctx, "tcp", "b:80")
	require.NoError(t, err)
	roundTrip(t, bad, 1, 1000)

	// Play the application: an out head far beyond what the ring holds.
	var slot *poolUse
	r.a.mu.Lock()
	for _, pc := range r.a.conns {
		if pc.slot != nil && pc.bytesTX.Load() == 1000 {
			slot = pc.slot
		}
	}
	r.a.mu.Unlock()
	require.NotNil(t, slot)
	slot.SetOutHead(slot.OutHead() + 1<<40)
	slot.Kick(pool.Proxy)

	_, err = bad.Read(make([]byte, 1))
	require.ErrorIs(t, err, syscall.ECONNRESET)
	roundTrip(t, good, 2, 500000)
	require.NoError(t, bad.Close())
	require.NoError(t, good.Close())
	require.Eventually(t, func() bool { return len(r.a.Snapshot().Conns) == 0 }, 5*time.Second, 10*time.Millisecond)
}

// A connection in shared-pool mode at one end and through the memory link
// at the other carries streams of many rings both ways: the proxy-mode
// end acknowledges within the pool end's ring, which is all that end can
// hold unacknowledged.
func TestPoolMixedModes(t *testing.T) {
	const ring = 64 << 10
	r := newRack(t, "", fmt.Sprintf("pool_ring = %d", ring))
	srv := attach(t, r.cb)
	client := attach(t, r.ca)
	for _, dialPool := range []bool{false, true} {
		ln, err := (&socklike.ListenConfig{Proxy: srv, Pool: !dialPool}).Listen(context.Background(), "tcp", ":0")
		require.NoError(t, err)
		go echo(ln)
		c, err := (&socklike.Dialer{Proxy: client, Pool: dialPool}).Dial("tcp", fmt.Sprintf("b:%d", ln.Addr().(socklike.Addr).Port))
		require.NoError(t, err)
		require.Equal(t, map[bool]string{false: "proxy", true: "pool"}[dialPool], c.(*socklike.Conn).Route().Mode)
		require.NoError(t, c.SetDeadline(time.Now().Add(time.Minute))) // a failure guard only
		roundTrip(t, c, 4, 16*ring+17)
		require.NoError(t, c.Close())
		require.NoError(t, ln.Close())
	}
}
