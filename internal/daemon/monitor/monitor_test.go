package monitor

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/internal/wire/hostauth"
)

func intp(v int) *int { return &v }

// rack is three Monitors on loopback:
//
//	a ── NTB link rack-a-b ── b        (both dial each other)
//	a ── no link, fallback ── c        (only c dials a)
//	a ── link rack-a-d, no fallback ── d (configured, never runs)
type rack struct {
	a, b, c  *node
	la, lb   net.Listener
	lc       net.Listener
	cfgB     *config.Config
	fallBack string
}

func newRack(t *testing.T) *rack {
	la, lb, lc, ld := listen(t), listen(t), listen(t), listen(t)
	dAddr := ld.Addr().String()
	require.NoError(t, ld.Close()) // d is down: its control port refuses
	r := &rack{la: la, lb: lb, lc: lc, fallBack: "127.0.0.1:7480"}

	a := baseConfig(t, "a")
	a.Peers = []config.Peer{
		{Host: "b", Control: lb.Addr().String(), Addresses: []string{"10.77.0.2"}, Link: "rack-a-b", Fallback: r.fallBack},
		{Host: "c", Addresses: []string{"10.77.0.3"}, Fallback: "127.0.0.1:7481"},
		{Host: "d", Control: dAddr, Link: "rack-a-d"},
	}
	a.ACL = []config.Rule{
		{Action: "deny", Direction: "out", UID: intp(1000), Host: "b", Port: 6379},
		{Action: "deny", Direction: "in", Host: "c", Port: 22},
	}
	b := baseConfig(t, "b")
	b.Peers = []config.Peer{{Host: "a", Control: la.Addr().String(), Link: "rack-a-b"}}
	c := baseConfig(t, "c")
	c.Peers = []config.Peer{{Host: "a", Control: la.Addr().String()}}
	for _, cfg := range []*config.Config{a, b, c} {
		require.NoError(t, cfg.Validate())
	}
	r.cfgB = b
	r.a = start(t, a, la)
	r.b = start(t, b, lb)
	r.c = start(t, c, lc)
	r.a.waitPeer(t, "b", true)
	r.a.waitPeer(t, "c", true)
	r.b.waitPeer(t, "a", true)
	r.c.waitPeer(t, "a", true)
	return r
}

func TestPeersAndResolve(t *testing.T) {
	r := newRack(t)

	// One session per pair, the one the smaller host dialed, seen alike
	// from both ends.
	waitfor.True(t, "one session a-b, dialed by a", func() bool { return r.a.dialer("b") == "a" && r.b.dialer("a") == "a" })
	require.Equal(t, "c", r.a.dialer("c"))

	pb := r.a.peer(t, "b")
	require.Equal(t, ProtocolVersion, pb.Version)
	require.Equal(t, "rack-a-b", pb.Link)
	require.Equal(t, 1<<20, pb.Window)
	require.Equal(t, 2, pb.Partitions)
	require.ElementsMatch(t, []string{"ntb", "tcp"}, pb.Caps)
	require.False(t, pb.LastSeen.IsZero())
	require.Contains(t, pb.Why, "up since")
	pd := r.a.peer(t, "d")
	require.False(t, pd.Up)
	require.Contains(t, pd.Why, "never up")

	for _, tc := range []struct {
		target         string
		path, link     string
		addr, reason   string
		wantHost       string
		code           ctlapi.Code
		messageContain string
	}{
		{target: "a", path: "shm", wantHost: "a", reason: "same host: shared memory, never the NTB"},
		{target: "10.77.0.a", path: "shm", wantHost: "a"},
		{target: "b", path: "ntb", link: "rack-a-b", wantHost: "b", reason: "rack peer b over NTB link rack-a-b"},
		{target: "10.77.0.2", path: "ntb", link: "rack-a-b", wantHost: "b"},
		{target: "c", path: "tcp", addr: "127.0.0.1:7481", wantHost: "c", reason: "no NTB link to c"},
		// d's control plane never came up: its NTB link is still the route,
		// which ntproxy passes over if the link is down (and d has no
		// other transport).
		{target: "d", path: "ntb", link: "rack-a-d", wantHost: "d", reason: "rack peer d over NTB link rack-a-d; peer d control plane not up yet"},
		{target: "zz", code: ctlapi.CodeUnknown, messageContain: `resolve zz: not this host`},
	} {
		t.Run(tc.target, func(t *testing.T) {
			rt, err := r.a.resolve(t, 0, tc.target, 6379)
			if tc.code != ctlapi.OK {
				require.Equal(t, tc.code, ctlapi.CodeOf(err), "err %v", err)
				require.Contains(t, err.Error(), tc.messageContain)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.path, rt.Path)
			require.Equal(t, tc.wantHost, rt.Host)
			require.Equal(t, tc.link, rt.Link)
			require.Equal(t, tc.addr, rt.Addr)
			require.Contains(t, rt.Reason, tc.reason)
		})
	}

	// The ACL, through the client: the rule, uid, host and port are named.
	_, err := r.a.resolve(t, 1000, "10.77.0.2", 6379)
	require.Equal(t, ctlapi.CodeDenied, ctlapi.CodeOf(err))
	require.Contains(t, err.Error(), "acl rule 0 denies uid 1000 -> b:6379")
	_, err = r.a.resolve(t, 1001, "b", 6379)
	require.NoError(t, err)
	_, err = r.a.resolve(t, 0, "b", 0)
	require.Equal(t, ctlapi.CodeBadRequest, ctlapi.CodeOf(err))

	// Admission of inbound connections.
	ctx := context.Background()
	require.NoError(t, r.a.client.Call(ctx, ctlapi.PathAdmit, ctlapi.AdmitRequest{Peer: "c", Port: 80}, nil))
	err = r.a.client.Call(ctx, ctlapi.PathAdmit, ctlapi.AdmitRequest{Peer: "c", Port: 22}, nil)
	require.Equal(t, ctlapi.CodeDenied, ctlapi.CodeOf(err))
	require.Contains(t, err.Error(), "acl rule 1 denies c -> a:22")
	err = r.a.client.Call(ctx, ctlapi.PathAdmit, ctlapi.AdmitRequest{Peer: "zz", Port: 22}, nil)
	require.Equal(t, ctlapi.CodeUnknown, ctlapi.CodeOf(err))

	// A malformed request is a bad request, not a crash.
	err = r.a.client.Call(ctx, ctlapi.PathResolve, map[string]any{"bogus": 1}, nil)
	require.Equal(t, ctlapi.CodeBadRequest, ctlapi.CodeOf(err))
	err = r.a.client.Call(ctx, "/v1/nothing", nil, nil)
	require.Equal(t, ctlapi.CodeBadRequest, ctlapi.CodeOf(err))
}

func TestPeerDownFallbackAndBack(t *testing.T) {
	r := newRack(t)
	rt, err := r.a.resolve(t, 0, "b", 80)
	require.NoError(t, err)
	require.Equal(t, "ntb", rt.Path)

	// b's ntmon stops: a marks it down (b says goodbye, so at once; within
	// the peer timeout in any case). The NTB link stays the route, the
	// reason saying the control plane is down, and the fallback its next
	// hop: ntproxy, which sees the link's own state, takes it if the link
	// is down too.
	require.NoError(t, r.b.m.Close())
	p := r.a.waitPeer(t, "b", false)
	require.Contains(t, p.Why, "down since")
	require.Contains(t, p.Why, "shutting down")
	rt, err = r.a.resolve(t, 0, "b", 80)
	require.NoError(t, err)
	require.Equal(t, "ntb", rt.Path)
	require.Contains(t, rt.Reason, "peer b control plane down since")
	require.Contains(t, rt.Hops, ctlapi.Hop{Path: "tcp", Addr: r.fallBack})

	// c has no fallback on its side: with a gone, it has no path.
	require.NoError(t, r.a.m.Close())
	r.c.waitPeer(t, "a", false)
	_, err = r.c.resolve(t, 0, "a", 80)
	require.Equal(t, ctlapi.CodeNoPath, ctlapi.CodeOf(err))
	require.Contains(t, err.Error(), "no path to a: no NTB link to a; no RDMA on this host: proxy.rdma.listen not configured; no TCP fallback configured for a")
}

// The RDMA capability exchange: each HELLO carries the host's RDMA
// listener or why it has none; a route takes RDMA only when both hosts
// have it, after the NTB and before TCP, and says why.
func TestRDMACapability(t *testing.T) {
	la, lb, lc := listen(t), listen(t), listen(t)
	a := baseConfig(t, "a")
	a.Peers = []config.Peer{
		{Host: "b", Control: lb.Addr().String(), Link: "rack-a-b", Fallback: "127.0.0.1:7480"},
		{Host: "c", Control: lc.Addr().String(), Fallback: "127.0.0.1:7481"},
	}
	b := baseConfig(t, "b")
	b.Peers = []config.Peer{{Host: "a", Control: la.Addr().String(), Link: "rack-a-b"}}
	c := baseConfig(t, "c")
	c.Peers = []config.Peer{{Host: "a", Control: la.Addr().String()}}
	na := startWith(t, a, la, Options{RDMA: RDMA{Addr: "192.0.2.1:7490"}})
	startWith(t, b, lb, Options{RDMA: RDMA{Addr: "192.0.2.2:7490"}})
	nc := startWith(t, c, lc, Options{RDMA: RDMA{Why: "verbs provider: no RDMA device"}})
	pb, pc := na.waitPeer(t, "b", true), na.waitPeer(t, "c", true)
	nc.waitPeer(t, "a", true)

	require.Equal(t, "192.0.2.2:7490", pb.RDMA)
	require.Contains(t, pb.Caps, "rdma")
	require.Equal(t, "none: verbs provider: no RDMA device", pc.RDMA)
	require.NotContains(t, pc.Caps, "rdma")
	require.Equal(t, "192.0.2.1:7490", na.status(t).RDMA)

	// b: the NTB link first, RDMA and TCP behind it for failover.
	rt, err := na.resolve(t, 0, "b", 80)
	require.NoError(t, err)
	require.Equal(t, "ntb", rt.Path)
	require.Equal(t, []ctlapi.Hop{{Path: "ntb", Addr: "rack-a-b"}, {Path: "rdma", Addr: "192.0.2.2:7490"}, {Path: "tcp", Addr: "127.0.0.1:7480"}}, rt.Hops)
	// Over RDMA when the connection asks for it before the NTB.
	var route ctlapi.Route
	require.NoError(t, na.client.Call(context.Background(), ctlapi.PathResolve, ctlapi.ResolveRequest{Target: "b", Port: 80, Transports: []string{"rdma", "ntb"}}, &route))
	require.Equal(t, "rdma", route.Path)
	require.Equal(t, "192.0.2.2:7490", route.Addr)
	require.Equal(t, "rdma first in the order [rdma ntb]: RDMA 192.0.2.2:7490", route.Reason)

	// c has no RDMA device: TCP, saying why.
	rt, err = na.resolve(t, 0, "c", 80)
	require.NoError(t, err)
	require.Equal(t, "tcp", rt.Path)
	require.Equal(t, "no NTB link to c; no RDMA on c: verbs provider: no RDMA device: TCP fallback 127.0.0.1:7481", rt.Reason)
	// And from c, with none here.
	_, err = nc.resolve(t, 0, "a", 80)
	require.Equal(t, ctlapi.CodeNoPath, ctlapi.CodeOf(err))
	require.Contains(t, err.Error(), "no path to a: no NTB link to a; no RDMA on this host: verbs provider: no RDMA device; no TCP fallback configured for a")
}

func TestPeerReturns(t *testing.T) {
	r := newRack(t)
	addr := r.lb.Addr().String()
	require.NoError(t, r.b.m.Close())
	r.a.waitPeer(t, "b", false)

	// b comes back on the same address with a fresh state directory: a's
	// dialer finds it, and the NTB path is chosen again.
	ln, err := net.Listen("tcp", addr)
	require.NoError(t, err)
	cfg := *r.cfgB
	cfg.StateDir = stateDir(t)
	start(t, &cfg, ln)
	r.a.waitPeer(t, "b", true)
	rt, err := r.a.resolve(t, 0, "b", 80)
	require.NoError(t, err)
	require.Equal(t, "ntb", rt.Path)
}

func TestSilentPeerTimesOut(t *testing.T) {
	la := listen(t)
	a := baseConfig(t, "a")
	a.Peers = []config.Peer{{Host: "d", Link: "rack-a-d", Fallback: "127.0.0.1:1"}}
	na := start(t, a, la)

	// d says HELLO, then nothing: up, then down after the peer timeout.
	c := tlsPeer(t, la.Addr(), testRack.Key(t, "d"))
	require.NoError(t, WriteFrame(c, FrameHello, Hello{Magic: Magic, Version: ProtocolVersion, Host: "d", Caps: []string{"ntb"},
		Links: []HelloLink{{Name: "rack-a-d", Peer: "a", Window: 1 << 20, Partitions: 2}}}))
	f, err := ReadFrame(c)
	require.NoError(t, err)
	require.Equal(t, FrameHello, f.Type)
	na.waitPeer(t, "d", true)
	rt, err := na.resolve(t, 0, "d", 80)
	require.NoError(t, err)
	require.Equal(t, "ntb", rt.Path)

	p := na.waitPeer(t, "d", false)
	require.Contains(t, p.Why, "silent for")
	rt, err = na.resolve(t, 0, "d", 80)
	require.NoError(t, err)
	require.Equal(t, "ntb", rt.Path, "the link's own state decides (ntproxy)")
	require.Contains(t, rt.Reason, "silent for")
	require.Contains(t, rt.Hops, ctlapi.Hop{Path: "tcp", Addr: "127.0.0.1:1"})
	// a heartbeated while it waited, then hung up.
	frames := readUntilClosed(t, c)
	require.NotEmpty(t, frames)
	require.Equal(t, FrameHeartbeat, frames[0].Type)
}

func TestLinkMismatch(t *testing.T) {
	la := listen(t)
	a := baseConfig(t, "a")
	a.Peers = []config.Peer{{Host: "d", Link: "rack-a-d", Fallback: "127.0.0.1:1"}}
	na := start(t, a, la)

	c := tlsPeer(t, la.Addr(), testRack.Key(t, "d"))
	require.NoError(t, WriteFrame(c, FrameHello, Hello{Magic: Magic, Version: ProtocolVersion, Host: "d", Caps: []string{"ntb"},
		Links: []HelloLink{{Name: "rack-a-d", Peer: "a", Window: 1 << 20, Partitions: 4}}}))
	p := na.waitPeer(t, "d", true)
	require.Contains(t, p.Why, "link rack-a-d: d has 4 partitions, a has 2")
	rt, err := na.resolve(t, 0, "d", 80)
	require.NoError(t, err)
	require.Equal(t, "tcp", rt.Path)
	require.Contains(t, rt.Reason, "NTB link unusable")
}

func TestRefusedHellos(t *testing.T) {
	la := listen(t)
	a := baseConfig(t, "a")
	a.Peers = []config.Peer{{Host: "d", Link: "rack-a-d"}}
	na := start(t, a, la)

	for _, tc := range []struct {
		name  string
		hello Hello
		want  string
	}{
		{"version", Hello{Magic: Magic, Version: 99, Host: "d"}, "peer d speaks ntmon protocol 99, this host (a) speaks 1"},
		{"magic", Hello{Magic: "redis", Version: 1, Host: "d"}, `not an ntmon: HELLO magic "redis"`},
		{"stranger", Hello{Magic: Magic, Version: 1, Host: "zz"}, `HELLO names "zz" but the certificate proves d`},
		{"impostor", Hello{Magic: Magic, Version: 1, Host: "a"}, `HELLO names "a" but the certificate proves d`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tlsPeer(t, la.Addr(), testRack.Key(t, "d"))
			require.NoError(t, WriteFrame(c, FrameHello, tc.hello))
			frames := readUntilClosed(t, c)
			require.Len(t, frames, 1)
			require.Equal(t, FrameError, frames[0].Type)
			var body ErrorBody
			require.NoError(t, DecodeBody(frames[0], &body))
			require.Contains(t, body.Message, tc.want)
		})
	}
	// The version refusal concerned a configured peer: its status says so.
	waitfor.True(t, "d's status to say refused", func() bool {
		return strings.Contains(na.peer(t, "d").Why, "refused")
	})

	// And a's own dialer, refused the same way, shows the peer's reason.
	lb := listen(t)
	bKey, err := hostauth.LoadKey(testRack.Key(t, "b"))
	require.NoError(t, err)
	go func() {
		raw, err := lb.Accept()
		if err != nil {
			return
		}
		c := tls.Server(raw, &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{bKey}, ClientAuth: tls.RequireAnyClientCert})
		defer c.Close()
		if _, err := ReadFrame(c); err == nil {
			_ = WriteFrame(c, FrameError, ErrorBody{Message: "peer a speaks ntmon protocol 1, this host (b) speaks 2"})
		}
	}()
	b := baseConfig(t, "x")
	b.Peers = []config.Peer{{Host: "b", Control: lb.Addr().String()}}
	nb := start(t, b, nil)
	waitfor.True(t, "b's status to give its refusal", func() bool {
		return strings.Contains(nb.peer(t, "b").Why, "b refused the session: peer a speaks ntmon protocol 1, this host (b) speaks 2")
	})
	require.NoError(t, lb.Close())
}

func TestGarbageOnPeerPort(t *testing.T) {
	r := newRack(t)
	for _, junk := range [][]byte{
		[]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
		{0, 0, 0, 0},
		binary.LittleEndian.AppendUint32(nil, 3), // short, then silence... and EOF
		append(binary.LittleEndian.AppendUint32(nil, 4), byte(FrameHello), 'x', 'y', 'z'),
		append(binary.LittleEndian.AppendUint32(nil, 3), 42, '{', '}'),
	} {
		// Plain bytes on the peer port fail the TLS handshake.
		c := rawPeer(t, r.la.Addr())
		_, err := c.Write(junk)
		require.NoError(t, err)
		// The daemon may have hung up already: that is the point.
		_ = c.(*net.TCPConn).CloseWrite()
		closedByDaemon(t, c)

		// The same bytes from an authenticated peer are a protocol error.
		c = tlsPeer(t, r.la.Addr(), testRack.Key(t, "d"))
		_, err = c.Write(junk)
		require.NoError(t, err)
		_ = c.(*tls.Conn).CloseWrite()
		frames := readUntilClosed(t, c)
		for _, f := range frames {
			require.Equal(t, FrameError, f.Type)
		}
	}
	// The daemon still serves, and b's session never noticed.
	require.True(t, r.a.peer(t, "b").Up)
	rt, err := r.a.resolve(t, 0, "b", 80)
	require.NoError(t, err)
	require.Equal(t, "ntb", rt.Path)
}

func TestGarbageAfterHello(t *testing.T) {
	la := listen(t)
	a := baseConfig(t, "a")
	a.Peers = []config.Peer{{Host: "d"}}
	na := start(t, a, la)
	c := tlsPeer(t, la.Addr(), testRack.Key(t, "d"))
	require.NoError(t, WriteFrame(c, FrameHello, Hello{Magic: Magic, Version: ProtocolVersion, Host: "d"}))
	na.waitPeer(t, "d", true)
	_, err := c.Write(append(binary.LittleEndian.AppendUint32(nil, 4), byte(FrameHeartbeat), 'x', 'y', 'z'))
	require.NoError(t, err)
	p := na.waitPeer(t, "d", false)
	require.Contains(t, p.Why, "protocol error")
	frames := readUntilClosed(t, c)
	require.Equal(t, FrameError, frames[len(frames)-1].Type)
}

func TestPorts(t *testing.T) {
	n := start(t, baseConfig(t, "a"), nil)
	ctx := context.Background()
	listenOn := func(pid, port int) (int, error) {
		var rep ctlapi.ListenReply
		err := n.client.Call(ctx, ctlapi.PathListen, ctlapi.ListenRequest{UID: 1000, PID: pid, Port: port}, &rep)
		return rep.Port, err
	}
	// The holder must be a live process: a dead holder's reservation is
	// taken over (it was left behind by a killed ntproxy).
	me := os.Getpid()
	p, err := listenOn(me, 8080)
	require.NoError(t, err)
	require.Equal(t, 8080, p)
	_, err = listenOn(200, 8080)
	require.Equal(t, ctlapi.CodePortInUse, ctlapi.CodeOf(err))
	require.Contains(t, err.Error(), fmt.Sprintf("port 8080: held by pid %d", me))
	// The holder itself asking again (re-registering after an ntproxy
	// restart) keeps its port.
	p, err = listenOn(me, 8080)
	require.NoError(t, err)
	require.Equal(t, 8080, p)

	p1, err := listenOn(me, 0)
	require.NoError(t, err)
	p2, err := listenOn(me, 0)
	require.NoError(t, err)
	require.GreaterOrEqual(t, p1, EphemeralFirst)
	require.LessOrEqual(t, p2, EphemeralLast)
	require.NotEqual(t, p1, p2)

	st := n.status(t)
	require.Equal(t, []ctlapi.ListenEntry{{Port: 8080, UID: 1000, PID: me}, {Port: p1, UID: 1000, PID: me}, {Port: p2, UID: 1000, PID: me}}, st.Listening)

	err = n.client.Call(ctx, ctlapi.PathUnlisten, ctlapi.ListenRequest{PID: 200, Port: 8080}, nil)
	require.Equal(t, ctlapi.CodeDenied, ctlapi.CodeOf(err))
	require.NoError(t, n.client.Call(ctx, ctlapi.PathUnlisten, ctlapi.ListenRequest{PID: me, Port: 8080}, nil))
	err = n.client.Call(ctx, ctlapi.PathUnlisten, ctlapi.ListenRequest{PID: me, Port: 8080}, nil)
	require.Equal(t, ctlapi.CodeBadRequest, ctlapi.CodeOf(err))
	p, err = listenOn(200, 8080)
	require.NoError(t, err)
	require.Equal(t, 8080, p)
	_, err = listenOn(200, 70000)
	require.Equal(t, ctlapi.CodeBadRequest, ctlapi.CodeOf(err))

	// A reservation whose holder has exited is taken over.
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	_, err = listenOn(dead.Process.Pid, 9090)
	require.NoError(t, err)
	p, err = listenOn(300, 9090)
	require.NoError(t, err)
	require.Equal(t, 9090, p)
}

func TestPortExhaustion(t *testing.T) {
	pt := newPortTable()
	for range EphemeralLast - EphemeralFirst + 1 {
		_, err := pt.reserve(ctlapi.ListenRequest{PID: 1})
		require.NoError(t, err)
	}
	_, err := pt.reserve(ctlapi.ListenRequest{PID: 1})
	require.Equal(t, ctlapi.CodeQuota, ctlapi.CodeOf(err))
	require.NoError(t, pt.release(ctlapi.ListenRequest{Port: 50000}, anyUID))
	p, err := pt.reserve(ctlapi.ListenRequest{PID: 2})
	require.NoError(t, err)
	require.Equal(t, 50000, p)
}

func TestStatusAndMetrics(t *testing.T) {
	la := listen(t)
	a := baseConfig(t, "a")
	a.Peers = []config.Peer{{Host: "b", Link: "rack-a-b", Fallback: "127.0.0.1:7480"}}

	n := start(t, a, la)
	st := n.status(t)
	require.Nil(t, st.Proxy)
	require.Contains(t, st.ProxyErr, "ntproxy snapshot")
	require.Equal(t, "a", st.Host)
	require.Equal(t, "test", st.Version)

	fakeProxy(t, a, cannedSnapshot("a"))
	st = n.status(t)
	require.Empty(t, st.ProxyErr)
	require.NotNil(t, st.Proxy)
	require.Len(t, st.Proxy.Conns, 3)

	resp, err := http.Get("http://" + n.m.MetricsAddr().String() + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, resp.Body.Close())
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	text := string(body)
	for _, want := range []string{
		`ntstack_monitor_info{host="a",protocol="1",version="test"} 1`,
		`ntstack_peer_up{peer="b"} 0`,
		`ntstack_proxy_up{host="a"} 1`,
		`ntstack_link_up{link="rack-a-b",peer="b"} 1`,
		`ntstack_partition_tx_bytes_total{link="rack-a-b",partition="0"} 1234`,
		`ntstack_partition_rx_messages_total{link="rack-a-b",partition="0"} 20`,
		`ntstack_partition_conns{link="rack-a-b",partition="1"} 0`,
		`ntstack_conn_tx_bytes_total{app="redis-cli",id="1",mode="pool",path="ntb",remote="b:6379"} 1234`,
		`ntstack_conn_rx_bytes_total{app="nginx",id="3",mode="proxy",path="tcp",remote="c:50000"} 44`,
		`ntstack_conn_queue_bytes{app="redis-cli",id="1",mode="pool",path="ntb",remote="b:6379"} 64`,
		`ntstack_conn_drops_total{app="redis-cli",id="1",mode="pool",path="ntb",remote="b:6379"} 0`,
		`go_goroutines`,
	} {
		require.Contains(t, text, want)
	}
}

func TestWriteStatus(t *testing.T) {
	snap := cannedSnapshot("a")
	snap.Trunks = []ctlapi.TrunkStat{
		{Peer: "b", Role: "opened", State: "up", Link: "gwtrunk-a-01", Ports: []int{6379, 8080}, Conns: 50},
		{Peer: "c", Role: "opened", State: "failed", Error: "trunk to c: no exports"},
	}
	st := &ctlapi.Status{
		Host: "a", Version: "test", RDMA: "192.0.2.1:7490",
		Peers: []ctlapi.PeerStatus{
			{Host: "b", Control: "127.0.0.1:7470", Up: true, Why: "up since 10:00:00, session dialed by this host", Version: 1, Link: "rack-a-b", Window: 1 << 20, Partitions: 2, Caps: []string{"ntb", "tcp", "rdma"}, RDMA: "192.0.2.2:7490"},
			{Host: "c", Up: false, Why: "down since 10:00:01: silent for 2s (peer_timeout)"},
		},
		Listening: []ctlapi.ListenEntry{{Port: 80, UID: 0, PID: 4343}, {Port: 8080, UID: 1000, PID: 99}},
		Proxy:     &snap,
	}
	var sb strings.Builder
	require.NoError(t, WriteStatus(&sb, st))
	t.Log("\n" + sb.String())
	out := squeeze(sb.String())
	for _, want := range []string{
		"LINKS\nNAME PEER STATE WINDOW PARTITIONS\nrack-a-b b up 1MiB 2\n",
		"PARTITIONS\nLINK PARTITION CONNS BYTES-TX BYTES-RX MSGS-TX MSGS-RX\nrack-a-b 0 1 1234 5678 10 20\nrack-a-b 1 0 0 0 0 0\n",
		"host a, ntmon test, peer protocol 1\nrdma: 192.0.2.1:7490\n",
		"PEERS\nHOST CONTROL STATE LINK PROTOCOL CAPS RDMA LAST-SEEN WHY\n",
		"b 127.0.0.1:7470 up rack-a-b 1 ntb,tcp,rdma 192.0.2.2:7490 never up since 10:00:00, session dialed by this host\n",
		"c - down - - - none never down since 10:00:01: silent for 2s (peer_timeout)\n",
		"LISTENERS\nPORT UID PID APP BACKLOG\n80 0 4343 nginx[2] 128\n8080 1000 99 - -\n",
		"APPLICATIONS\nID NAME PID UID CONNS MEMORY\n1 redis-cli 4242 1000 2 1MiB\n",
		"CONNECTIONS\nID APP LOCAL REMOTE DIR PATH MODE REASON BYTES-TX BYTES-RX\n",
		"1 redis-cli[1] a:49152 b:6379 out ntb(rack-a-b/0) pool rack peer b over NTB link rack-a-b; shared pool 1234 5678\n",
		"2 redis-cli[1] a:49153 a:80 out shm proxy same host: shared memory, never the NTB 11 22\n",
		"3 nginx[2] a:80 c:50000 in tcp proxy no NTB link to c: TCP fallback 127.0.0.1:7481 33 44\n",
		"TRUNKS\nPEER ROLE STATE LINK PORTS CONNS ERROR\nb opened up gwtrunk-a-01 6379,8080 50 -\nc opened failed - - 0 trunk to c: no exports\n",
	} {
		require.Contains(t, out, want)
	}

	// Without ntproxy the tables still print, saying why they are empty.
	st.Proxy, st.ProxyErr = nil, "ntproxy snapshot: daemon unavailable: dial unix: no such file"
	sb.Reset()
	require.NoError(t, WriteStatus(&sb, st))
	require.Contains(t, sb.String(), "ntproxy: not reachable (ntproxy snapshot: daemon unavailable")
	require.Contains(t, sb.String(), "unknown (no ntproxy)")
}

func TestSocketHandling(t *testing.T) {
	cfg := baseConfig(t, "a")
	// A stale socket file from a dead ntmon is replaced.
	ln, err := net.Listen("unix", cfg.Path(config.MonitorSocket))
	require.NoError(t, err)
	ln.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, ln.Close())
	n := start(t, cfg, nil)
	fi, err := os.Stat(n.m.SocketPath())
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o666), fi.Mode().Perm())

	// A live one is not taken over.
	_, err = New(cfg, Options{Logger: testLogger(t)})
	require.ErrorContains(t, err, "another ntmon is serving it")

	// Close removes the socket; a second Close is harmless.
	require.NoError(t, n.m.Close())
	require.NoError(t, n.m.Close())
	_, err = os.Stat(cfg.Path(config.MonitorSocket))
	require.True(t, os.IsNotExist(err))
	require.Error(t, n.m.Start())
}

func TestRunAndNoLeaks(t *testing.T) {
	la, lb := listen(t), listen(t)
	a := baseConfig(t, "a")
	a.Peers = []config.Peer{{Host: "b", Control: lb.Addr().String(), Link: "rack-a-b"}}
	b := baseConfig(t, "b")
	b.Peers = []config.Peer{{Host: "a", Control: la.Addr().String(), Link: "rack-a-b"}}
	ma, err := New(a, Options{Logger: testLogger(t), PeerListener: la})
	require.NoError(t, err)
	mb, err := New(b, Options{Logger: testLogger(t), PeerListener: lb})
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 2)
	go func() { errc <- ma.Run(ctx) }()
	go func() { errc <- mb.Run(ctx) }()
	na := &node{m: ma, cfg: a, client: ctlapi.NewClient(ma.SocketPath())}
	na.waitPeer(t, "b", true)
	// A half-open inbound handshake and a scrape are in flight at the end.
	c := rawPeer(t, la.Addr())
	resp, err := http.Get("http://" + ma.MetricsAddr().String() + "/metrics")
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	require.NoError(t, resp.Body.Close())
	http.DefaultClient.CloseIdleConnections()
	na.client.Close()

	cancel()
	require.NoError(t, <-errc)
	require.NoError(t, <-errc)
	_ = c.Close()
	checkNoLeaks(t)
}

func TestNewErrors(t *testing.T) {
	cfg := baseConfig(t, "a")
	cfg.Monitor.PeerTimeout.Duration = cfg.Monitor.Heartbeat.Duration
	ln := listen(t)
	_, err := New(cfg, Options{PeerListener: ln})
	require.ErrorContains(t, err, "must exceed heartbeat")
	// New closed the listener it was given.
	_, err = ln.Accept()
	require.ErrorIs(t, err, net.ErrClosed)

	cfg = baseConfig(t, "a")
	cfg.Monitor.Listen = "127.0.0.1:bad"
	_, err = New(cfg, Options{})
	require.ErrorContains(t, err, "listen for peers")

	cfg = baseConfig(t, "a")
	require.NoError(t, os.MkdirAll(cfg.StateDir, 0o755))
	writeFile(t, cfg.StateDir, config.MonitorSocket, "not a socket")
	_, err = New(cfg, Options{})
	require.ErrorContains(t, err, "exists and is not a socket")
}

// squeeze collapses each line's runs of spaces, so that table checks do
// not depend on column widths.
func squeeze(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = strings.Join(strings.Fields(l), " ")
	}
	return strings.Join(lines, "\n")
}

// TestRegisterTieBreak drives the one-session-per-pair rule directly: the
// session dialed by the smaller host name wins whichever came first, and a
// newer session from the same dialer replaces an older one (the dialer
// found its old one dead).
func TestRegisterTieBreak(t *testing.T) {
	for _, self := range []string{"a", "b"} {
		t.Run(self, func(t *testing.T) {
			other := map[string]string{"a": "b", "b": "a"}[self]
			cfg := baseConfig(t, self)
			cfg.Peers = []config.Peer{{Host: other}}
			m, err := New(cfg, Options{Logger: testLogger(t)})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, m.Close()) })
			sess := func(dialer string) *session {
				c1, c2 := net.Pipe()
				t.Cleanup(func() { _ = c1.Close(); _ = c2.Close() })
				return &session{m: m, conn: c1, outbound: dialer == self, host: other, dialer: dialer, done: make(chan struct{})}
			}
			byA, byB, byA2 := sess("a"), sess("b"), sess("a")

			old, err := m.register(byB)
			require.NoError(t, err)
			require.Nil(t, old)
			old, err = m.register(byA) // preferred: replaces
			require.NoError(t, err)
			require.Same(t, byB, old)
			_, err = m.register(sess("b")) // not preferred: refused
			require.ErrorContains(t, err, "duplicate session")
			old, err = m.register(byA2) // same dialer, newer: replaces
			require.NoError(t, err)
			require.Same(t, byA, old)
			require.Equal(t, "a", (&node{m: m}).dialer(other))
		})
	}
}
