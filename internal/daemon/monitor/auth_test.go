package monitor

import (
	"context"
	"crypto/tls"
	"net"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/internal/wire/hostauth/hostauthtest"
)

// liveSession returns n's session with peer host, nil if none.
func (n *node) liveSession(host string) *session {
	n.m.mu.Lock()
	defer n.m.mu.Unlock()
	return n.m.peers[host].sess
}

// rdmaRoute resolves b over RDMA from n and returns the dial target.
func rdmaRoute(t *testing.T, n *node) string {
	t.Helper()
	var route ctlapi.Route
	require.NoError(t, n.client.Call(context.Background(), ctlapi.PathResolve, ctlapi.ResolveRequest{Target: "b", Port: 80, Transports: []string{"rdma"}}, &route))
	require.Equal(t, "rdma", route.Path)
	return route.Addr
}

// TestImpostorCannotJoin: hosts on the rack network that do not hold a
// configured peer's key cannot become that peer, whatever their HELLO
// says: the real session is never replaced, and the RDMA dial target the
// real peer announced stays.
func TestImpostorCannotJoin(t *testing.T) {
	la, lb := listen(t), listen(t)
	a := baseConfig(t, "a")
	a.Peers = []config.Peer{
		{Host: "b", Control: lb.Addr().String(), Link: "rack-a-b", Fallback: "127.0.0.1:7480"},
		{Host: "c", Fallback: "127.0.0.1:7481"},
	}
	b := baseConfig(t, "b")
	b.Peers = []config.Peer{{Host: "a", Control: la.Addr().String(), Link: "rack-a-b"}}
	na := startWith(t, a, la, Options{RDMA: RDMA{Addr: "192.0.2.1:7490"}})
	startWith(t, b, lb, Options{RDMA: RDMA{Addr: "192.0.2.2:7490"}})
	na.waitPeer(t, "b", true)
	require.NotNil(t, na.liveSession("b"))
	require.Equal(t, "192.0.2.2:7490", rdmaRoute(t, na))

	evil := Hello{Magic: Magic, Version: ProtocolVersion, Host: "b", Caps: []string{"ntb", "tcp", "rdma"}, RDMA: "198.51.100.66:7490",
		Links: []HelloLink{{Name: "rack-a-b", Peer: "a", Window: 1 << 20, Partitions: 2}}}
	selfSigned := hostauthtest.Keys(t, "b")["b"].Path // b's name, not b's key
	t.Run("plain TCP", func(t *testing.T) {
		c := rawPeer(t, la.Addr())
		require.NoError(t, WriteFrame(c, FrameHello, evil))
		closedByDaemon(t, c)
	})
	t.Run("no certificate", func(t *testing.T) {
		c := rawPeer(t, la.Addr())
		tc := tls.Client(c, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true})
		if tc.Handshake() == nil {
			_ = WriteFrame(tc, FrameHello, evil)
			_, err := ReadFrame(tc)
			require.Error(t, err)
		}
	})
	t.Run("wrong key for b", func(t *testing.T) { refusedTLS(t, la.Addr(), selfSigned) })
	t.Run("not a peer", func(t *testing.T) { refusedTLS(t, la.Addr(), testRack.Key(t, "mallory")) })
	t.Run("another peer's key", func(t *testing.T) {
		// c is a configured peer: its key opens the TLS session, but c
		// cannot claim to be b.
		c := tlsPeer(t, la.Addr(), testRack.Key(t, "c"))
		require.NoError(t, WriteFrame(c, FrameHello, evil))
		frames := readUntilClosed(t, c)
		require.Len(t, frames, 1)
		require.Equal(t, FrameError, frames[0].Type)
		var body ErrorBody
		require.NoError(t, DecodeBody(frames[0], &body))
		require.Contains(t, body.Message, `HELLO names "b" but the certificate proves c`)
	})

	// The live session is still one b's own key proved, and the RDMA
	// target is still b's. (It need not be the same session object: a and
	// b dial each other at start, and the session dialed by a replaces
	// one dialed by b whenever a's dial was already under way.)
	live := na.liveSession("b")
	require.NotNil(t, live)
	require.Equal(t, "b", live.proved, "the live session's certificate proves b")
	require.Equal(t, "192.0.2.2:7490", live.hello.RDMA)
	p := na.peer(t, "b")
	require.True(t, p.Up)
	require.Equal(t, "192.0.2.2:7490", p.RDMA)
	require.Equal(t, "192.0.2.2:7490", rdmaRoute(t, na))
}

// TestPinnedKeys: hosts with self-signed keys pinned in each other's
// configuration join; a host whose pin for its peer is wrong never gets a
// session with it, and says why.
func TestPinnedKeys(t *testing.T) {
	keys := hostauthtest.Keys(t, "a", "b", "b2")
	la, lb := listen(t), listen(t)
	pinned := func(host, peer string, ln net.Listener, pin string) *config.Config {
		c := baseConfig(t, host)
		c.Auth = config.Auth{Key: keys[host].Path}
		c.Peers = []config.Peer{{Host: peer, Control: ln.Addr().String(), Key: pin}}
		require.NoError(t, c.Validate())
		return c
	}
	na := start(t, pinned("a", "b", lb, keys["b"].Pin), la)
	start(t, pinned("b", "a", la, keys["a"].Pin), lb)
	na.waitPeer(t, "b", true)
	require.Contains(t, na.status(t).Security, "pinned host keys; key "+keys["a"].Pin)

	// A CA-signed certificate for b is no use where b's key is pinned,
	// nor is another self-signed key naming b.
	refusedTLS(t, la.Addr(), testRack.Key(t, "b"))
	refusedTLS(t, la.Addr(), keys["b2"].Path)
	require.True(t, na.peer(t, "b").Up)

	// x pins a wrong key for a: x's dialer refuses the server a is.
	lx := listen(t)
	x := baseConfig(t, "x")
	x.Auth = config.Auth{Key: testRack.Key(t, "x")}
	x.Peers = []config.Peer{{Host: "a", Control: la.Addr().String(), Key: keys["b"].Pin}}
	nx := start(t, x, lx)
	if !waitfor.Until(func() bool {
		return strings.Contains(nx.peer(t, "a").Why, "not authenticated") && strings.Contains(nx.peer(t, "a").Why, "not the one pinned")
	}) {
		t.Fatalf("x's status for a: %+v", nx.peer(t, "a"))
	}
}

// TestInsecureNeedsSaying: a host with no key does not start unless its
// configuration says insecure, and then its status says so loudly.
func TestInsecureNeedsSaying(t *testing.T) {
	cfg := baseConfig(t, "a")
	cfg.Auth = config.Auth{}
	_, err := New(cfg, Options{Logger: testLogger(t)})
	require.ErrorContains(t, err, "has no key (auth.key)")

	// Two insecure hosts still talk, unauthenticated, and say so.
	la, lb := listen(t), listen(t)
	cfg.Auth.Insecure = true
	cfg.Peers = []config.Peer{{Host: "b", Control: lb.Addr().String()}}
	b := baseConfig(t, "b")
	b.Auth = config.Auth{Insecure: true}
	b.Peers = []config.Peer{{Host: "a", Control: la.Addr().String()}}
	n := start(t, cfg, la)
	start(t, b, lb)
	n.waitPeer(t, "b", true)
	st := n.status(t)
	require.True(t, strings.HasPrefix(st.Security, "WARNING: INSECURE"), st.Security)
	var sb strings.Builder
	require.NoError(t, WriteStatus(&sb, &st))
	require.True(t, strings.HasPrefix(sb.String(), "WARNING: INSECURE"), sb.String())
}
