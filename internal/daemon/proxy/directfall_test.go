package proxy

import (
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/socklike"
)

// A direct connection follows the NTB link under its own: pulled, the
// connection moves to the fallback through the two proxies (its Route
// says so, and a's snapshot shows the proxied connection carrying it);
// restored, it moves back to its direct link. The echo of everything
// written arrives byte for byte on the same Conn. The echo server closed
// its listener once it had accepted: the fallback does not need it.
func TestDirectFailover(t *testing.T) { directFailover(t, false) }

// The same for a connection on a direct link an earlier, closed one
// opened (a stream of the link, its continuation named by the stream).
func TestDirectFailoverReusedLink(t *testing.T) { directFailover(t, true) }

func directFailover(t *testing.T, reuse bool) {
	port := 20000 + rand.IntN(20000)
	r := newRack(t, fmt.Sprintf(`fallback = "{peer}:%d"`, port), fmt.Sprintf(`fallback = "{self}:%d"`, port))
	ln, err := (&socklike.ListenConfig{Proxy: attach(t, r.cb)}).Listen(context.Background(), "tcp", ":80")
	require.NoError(t, err)
	go func() {
		if reuse {
			if c, err := ln.Accept(); err == nil {
				io.Copy(c, c)
				c.Close()
			}
		}
		c, err := ln.Accept()
		ln.Close()
		if err == nil {
			io.Copy(c, c)
			c.Close()
		}
	}()
	client := attach(t, r.ca)
	d := &socklike.Dialer{Proxy: client, Direct: true}
	if reuse {
		first, err := d.Dial("tcp", "b:80")
		require.NoError(t, err)
		roundTrip(t, first, 1, 1000)
		require.NoError(t, first.Close())
	}
	nc, err := d.Dial("tcp", "b:80")
	require.NoError(t, err)
	defer nc.Close()
	c := nc.(*socklike.Conn)
	home := onLink(t, c)
	require.Equal(t, "direct", home.Mode)
	if reuse {
		require.Contains(t, home.Reason, "on the window slice of an earlier one")
	}
	dev := r.a.links["b"].ep.Device().(*shm.Device)

	const total = 32 << 20
	var read atomic.Int64
	carried := func() bool {
		for _, cs := range r.a.Snapshot().Conns {
			if cs.Mode == "proxy" && strings.Contains(cs.Reason, "through the proxies while it is") {
				return true
			}
		}
		return false
	}
	back := make(chan struct{})
	var onFallback socklike.Route
	var wasCarried bool
	outage := make(chan error, 1)
	go func() {
		steps := []struct {
			what string
			cond func() bool
			then func()
		}{
			{"a quarter of the stream", func() bool { return read.Load() > total/4 }, dev.ForceLinkDown},
			{"the move to the fallback", func() bool { return c.Route().Mode == "proxy" }, func() { onFallback, wasCarried = c.Route(), carried() }},
			{"half the stream", func() bool { return read.Load() > total/2 }, dev.ForceLinkUp},
			{"the move back to the direct link", func() bool { return c.Route() == home }, func() { close(back) }},
		}
		for _, s := range steps {
			if !waitfor.Until(s.cond) {
				c.Close() // unblock the reader and the writer
				outage <- fmt.Errorf("timed out waiting for %s", s.what)
				return
			}
			s.then()
		}
		outage <- nil
	}()
	sum := sha256.New()
	written := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(total, 41))
		buf := make([]byte, 32<<10)
		for n := 0; n < total; n += len(buf) {
			if n == total*3/4 {
				<-back // the last quarter goes over the direct link again
			}
			for i := range buf {
				buf[i] = byte(rng.Uint32())
			}
			sum.Write(buf)
			if _, err := c.Write(buf); err != nil {
				written <- err
				return
			}
		}
		written <- c.CloseWrite()
	}()
	got := sha256.New()
	buf := make([]byte, 64<<10)
	var rerr error
	for {
		k, err := c.Read(buf)
		got.Write(buf[:k])
		read.Add(int64(k))
		if err != nil {
			rerr = err
			break
		}
	}
	require.NoError(t, <-outage)
	require.ErrorIs(t, rerr, io.EOF)
	require.NoError(t, <-written)
	require.Equal(t, int64(total), read.Load())
	require.Equal(t, sum.Sum(nil), got.Sum(nil), "every byte, in order, once")
	require.Equal(t, ctlapi.PathTCP, onFallback.Path, "on the fallback: %+v", onFallback)
	require.Contains(t, onFallback.Reason, "direct link", "on the fallback: %+v", onFallback)
	require.True(t, wasCarried, "a's snapshot shows the proxied connection carrying the direct one")
}

// Only an application holding a direct link continues it: a's ntproxy
// takes a continuation only from the application holding the link, and
// b's hands one only for a link a granted to the application holding it.
func TestDirectContinueRefused(t *testing.T) {
	r := newRack(t, "")
	_, client := echoRack(t, r)
	nc, err := (&socklike.Dialer{Proxy: client, Direct: true}).Dial("tcp", "b:80")
	require.NoError(t, err)
	defer nc.Close()
	other := attach(t, r.ca) // another application on a
	oc, err := (&socklike.Dialer{Proxy: other}).Dial("tcp", "b:80")
	require.NoError(t, err, "an ordinary dial")
	defer oc.Close()
	lease := func(s *Server) (name string, holder *app, apps []*app) {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, pc := range s.conns {
			if pc.direct {
				name, holder = pc.dlName, s.apps[pc.app]
			}
		}
		for _, a := range s.apps {
			apps = append(apps, a)
		}
		return name, holder, apps
	}
	name, holder, apps := lease(r.a)
	require.True(t, strings.HasPrefix(name, directPrefix+"a-"), "a's lease names its direct link: %q", name)
	require.NotNil(t, holder)
	for _, a := range apps {
		require.Equal(t, a == holder, r.a.holdsDirect(a, name), "app %d continues %s", a.id, name)
	}
	farName, far, _ := lease(r.b)
	require.Equal(t, name, farName, "b's lease is of the same link")
	require.NotNil(t, far)
	holderB, _ := r.b.directHolder("a", name)
	require.Equal(t, far, holderB)
	holderB, _ = r.b.directHolder("c", name)
	require.Nil(t, holderB, "a link a granted, continued from c")
	holderB, _ = r.b.directHolder("a", name+"0")
	require.Nil(t, holderB, "a link b's application does not hold")
}

// The NTB link down because the far ntproxy went away is not the direct
// link's failure: the direct connection stays on its link and carries on.
func TestDirectOutlivesFarProxy(t *testing.T) {
	r := newRack(t, "")
	_, client := echoRack(t, r)
	nc, err := (&socklike.Dialer{Proxy: client, Direct: true}).Dial("tcp", "b:80")
	require.NoError(t, err)
	defer nc.Close()
	c := nc.(*socklike.Conn)
	home := onLink(t, c)
	roundTrip(t, c, 1, 256<<10)
	require.NoError(t, r.b.Close())
	dev := r.a.links["b"].ep.Device()
	waitfor.True(t, "a's NTB link down once b's ntproxy closed", func() bool { return dev.Link() != ntb.LinkUp })
	roundTrip(t, c, 2, 256<<10)
	require.Equal(t, home, c.Route(), "still on its direct link")
}

// onLink waits until direct connection c is on its direct link (a first
// dial's begins on the proxied path) and returns its Route there.
func onLink(t *testing.T, c *socklike.Conn) socklike.Route {
	t.Helper()
	waitfor.True(t, "the connection on its direct link", func() bool { return !strings.HasPrefix(c.Route().Reason, "on the proxied path until") })
	return c.Route()
}
