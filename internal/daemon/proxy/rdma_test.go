package proxy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/rdma"
	"github.com/ntstack/ntstack/socklike"
)

// rdmaRack is newRack with an RDMA path between a and b. These machines
// have no RDMA device, so the provider is rdma's TCP provider — the same
// Provider interface, framing and semantics as verbs (which the VM tier
// runs for real, test/vm TestRDMARack) — on 127.0.0.<letter>:port;
// StaticControl stands in for ntmon's capability exchange. proxyKeys are
// added to both hosts' [proxy].
func rdmaRack(t *testing.T) *rack {
	port := 20000 + rand.IntN(20000)
	addr := func(host string) string { return fmt.Sprintf("127.0.0.%d:%d", host[0], port) }
	return newRackWith(t, func(cfg *config.Config, o *Options) {
		peer := map[string]string{"a": "b", "b": "a"}[cfg.Host]
		auth, err := cfg.HostAuth()
		require.NoError(t, err)
		o.RDMA = rdma.NewTCP(rdma.Config{Auth: auth})
		o.Control = &StaticControl{Config: cfg, RDMA: addr(cfg.Host), PeerRDMA: map[string]string{peer: addr(peer)}}
	}, "", "[proxy.rdma]", fmt.Sprintf(`listen = "{self}:%d"`, port))
}

// A connection that asks for RDMA takes it, says so, carries data both
// ways and passes nettest's conformance tests through both proxies.
func TestRDMAPath(t *testing.T) {
	r := rdmaRack(t)
	srv, client := echoRack(t, r)
	d := socklike.Dialer{Proxy: client, Transports: []string{"rdma"}}
	c, err := d.Dial("tcp", "b:80")
	require.NoError(t, err)
	route := c.(*socklike.Conn).Route()
	require.Equal(t, ctlapi.PathRDMA, route.Path)
	require.Contains(t, route.Reason, "rdma first in the order [rdma]: RDMA 127.0.0.98:")
	for i, size := range []int{1, 64, 4096, 1 << 20, 3<<20 + 17} {
		roundTrip(t, c, uint64(i), size)
	}
	snap := r.a.Snapshot()
	require.Len(t, snap.Conns, 1)
	require.Equal(t, ctlapi.PathRDMA, snap.Conns[0].Path)
	require.Eventually(t, func() bool {
		s := r.b.Snapshot()
		return len(s.Conns) == 1 && s.Conns[0].Path == ctlapi.PathRDMA
	}, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, c.Close())

	// Direct mode needs the NTB: a Dialer asking for it settles for RDMA
	// through the proxies, and says why.
	dd := socklike.Dialer{Proxy: client, Transports: []string{"rdma"}, Direct: true}
	c, err = dd.Dial("tcp", "b:80")
	require.NoError(t, err)
	route = c.(*socklike.Conn).Route()
	require.Equal(t, ctlapi.PathRDMA, route.Path)
	require.Contains(t, route.Reason, "direct mode refused (direct mode impossible: no path to host: direct mode needs an NTB link or the same host; b is reachable only over rdma")
	roundTrip(t, c, 9, 4096)
	require.NoError(t, c.Close())

	ln81, err := (&socklike.ListenConfig{Proxy: srv}).Listen(context.Background(), "tcp", ":81")
	require.NoError(t, err)
	defer ln81.Close()
	conformance(t, ln81, func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", "b:81") })
}

// Failover to RDMA and back: a leg on the NTB link moves to the RDMA path
// when the link goes down and returns when it is up, every byte once and
// in order; with no TCP fallback configured, RDMA is the only way on.
func TestFailoverRDMA(t *testing.T) {
	r := rdmaRack(t)
	_, client := echoRack(t, r)
	c, err := (&socklike.Dialer{Proxy: client}).Dial("tcp", "b:80")
	require.NoError(t, err)
	defer c.Close()
	streamThroughOutage(t, r, c, 32<<20, ctlapi.PathRDMA)
}
