package gateway

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// echo sends payload on a new connection to addr, half closes, and
// returns what came back.
func echo(addr string, payload []byte) ([]byte, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	go func() {
		c.Write(payload)
		c.(*net.TCPConn).CloseWrite()
	}()
	return io.ReadAll(c)
}

// Many connections at once share the one trunk: each echoes its own bytes
// back whole, and every one is carried on the trunk.
func TestTrunkManyConns(t *testing.T) {
	a, b := newRack(t, config.GatewayTrunk, echoServer(t))
	fwd := a.gw.Stats()[0].Listen
	const conns, size = 32, 64 << 10
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			payload := make([]byte, size)
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for j := range payload {
				payload[j] = byte(rng.Uint32())
			}
			got, err := echo(fwd, payload)
			if err == nil && !bytes.Equal(got, payload) {
				err = io.ErrUnexpectedEOF
			}
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, int64(conns), a.gw.services[0].trunked.Load())
	require.Equal(t, int64(conns), b.gw.Stats()[0].Total)
	a.gw.mu.Lock()
	require.Len(t, a.gw.trunks, 1)
	a.gw.mu.Unlock()
}

// A trunk that ends — here the far gateway drops it — takes its carried
// connections with it. A connection that comes while the opener has not
// yet seen the end is carried all the same (on a direct link); once it
// has, the forward's next connection opens a new trunk and is carried on
// that.
func TestTrunkReopens(t *testing.T) {
	a, b := newRack(t, config.GatewayTrunk, echoServer(t))
	fwd := a.gw.Stats()[0].Listen
	msg := []byte("first")
	got, err := echo(fwd, msg)
	require.NoError(t, err)
	require.Equal(t, msg, got)

	a.gw.mu.Lock()
	first := a.gw.trunks["b"]
	a.gw.mu.Unlock()
	b.gw.mu.Lock()
	served := b.gw.served["a"]
	b.gw.mu.Unlock()
	require.NotNil(t, first)
	require.NotNil(t, served)
	served.end()
	msg = []byte("meanwhile")
	got, err = echo(fwd, msg)
	require.NoError(t, err)
	require.Equal(t, msg, got)
	// The opener sees its control connection end.
	require.Eventually(t, func() bool { return !first.alive() }, 10*time.Second, time.Millisecond)

	msg = []byte("second")
	got, err = echo(fwd, msg)
	require.NoError(t, err)
	require.Equal(t, msg, got)
	a.gw.mu.Lock()
	second := a.gw.trunks["b"]
	a.gw.mu.Unlock()
	require.NotSame(t, first, second)
	require.True(t, second.alive())
	// The second trunk carried "second"; "meanwhile" went either way.
	require.GreaterOrEqual(t, a.gw.services[0].trunked.Load(), int64(2))
	require.Equal(t, int64(3), b.gw.Stats()[0].Total)
}

// The far gateway applies the ACL to the trunk: an export its rules deny
// to the opener is not carried on it, and the proxies refuse it too.
func TestTrunkACL(t *testing.T) {
	a, _ := newRack(t, config.GatewayTrunk, echoServer(t), "[[acl]]\naction = \"deny\"\ndirection = \"in\"\nhost = \"a\"\nport = 7000")
	got, err := echo(a.gw.Stats()[0].Listen, []byte("denied"))
	require.Empty(t, got, "err %v", err)
	a.gw.mu.Lock()
	tr := a.gw.trunks["b"]
	a.gw.mu.Unlock()
	require.NotNil(t, tr)
	<-tr.ready
	require.NoError(t, tr.err)
	require.Empty(t, tr.ports)
	require.Equal(t, int64(0), a.gw.services[0].trunked.Load())
	require.Equal(t, int64(1), a.gw.Stats()[0].Failed)
}

// Each end lists its trunk with the connections it carries, for ntmon
// status and the metrics (which ntproxy reads from the gateway process:
// ServeStats); a trunk that ends is listed as ended.
func TestTrunkStats(t *testing.T) {
	a, b := newRack(t, config.GatewayTrunk, echoServer(t))
	c, err := net.Dial("tcp", a.gw.Stats()[0].Listen)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte("x"))
	require.NoError(t, err)
	_, err = io.ReadFull(c, make([]byte, 1))
	require.NoError(t, err)

	opened, served := a.gw.TrunkStats(), b.gw.TrunkStats()
	require.Len(t, opened, 1)
	require.Len(t, served, 1)
	require.Equal(t, "b", opened[0].Peer)
	require.Equal(t, "opened", opened[0].Role)
	require.Equal(t, "a", served[0].Peer)
	require.Equal(t, "served", served[0].Role)
	for _, st := range []ctlapi.TrunkStat{opened[0], served[0]} {
		require.Equal(t, "up", st.State)
		require.Equal(t, []int{7000}, st.Ports)
		require.Equal(t, 1, st.Conns, "the one carried connection")
		require.Equal(t, opened[0].Link, st.Link)
	}
	require.Equal(t, opened, statsOverPipe(t, a.gw).TrunkStats(), "as ntproxy reads them from the gateway process")
	require.Equal(t, a.gw.Stats(), statsOverPipe(t, a.gw).Stats())

	c.Close()
	waitfor.True(t, "the closed connection off both ends", func() bool {
		return a.gw.TrunkStats()[0].Conns == 0 && b.gw.TrunkStats()[0].Conns == 0
	})
	b.gw.mu.Lock()
	b.gw.served["a"].end()
	b.gw.mu.Unlock()
	waitfor.True(t, "the opener's trunk listed as ended", func() bool { return a.gw.TrunkStats()[0].State == "ended" })
}
