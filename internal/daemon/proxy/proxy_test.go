package proxy

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/appproto"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/internal/wire/hostauth/hostauthtest"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/socklike"
)

// rack is two hosts, a and b, joined by one emulated NTB link, each with
// its Server serving in this process.
type rack struct {
	a, b   *Server
	ca, cb *config.Config
	keys   map[string]hostauthtest.Key
}

func newRack(t *testing.T, acl string, proxyKeys ...string) *rack {
	t.Helper()
	return newRackWith(t, nil, acl, proxyKeys...)
}

// newRackWith is newRack with each Server's Options completed by opts
// (nil: Logf only).
func newRackWith(t testing.TB, opts func(cfg *config.Config, o *Options), acl string, proxyKeys ...string) *rack {
	t.Helper()
	root := t.TempDir()
	fabric := filepath.Join("/dev/shm", fmt.Sprintf("ntstack-proxytest-%d-%d", os.Getpid(), rand.Uint32()))
	t.Cleanup(func() { os.RemoveAll(fabric) })
	keys := hostauthtest.Keys(t, "a", "b")
	mk := func(host, peer string) *config.Config {
		doc := fmt.Sprintf(`host = %q
addresses = ["10.77.0.%d"]
state_dir = %q
[auth]
key = %q
[proxy]
fabric_dir = %q
window = 4194304
app_window = 2097152
link_timeout = "2s"
%s
[[peers]]
host = %q
addresses = ["10.77.0.%d"]
link = "ab"
key = %q
%s`, host, host[0], filepath.Join(root, host), keys[host].Path, fabric, strings.Join(proxyKeys, "\n"), peer, peer[0], keys[peer].Pin, acl)
		// {self} and {peer}: each host's own loopback address, 127.0.0.<its letter>.
		doc = strings.NewReplacer("{self}", fmt.Sprintf("127.0.0.%d", host[0]), "{peer}", fmt.Sprintf("127.0.0.%d", peer[0])).Replace(doc)
		c, err := config.Parse([]byte(doc))
		require.NoError(t, err)
		return c
	}
	r := &rack{ca: mk("a", "b"), cb: mk("b", "a"), keys: keys}
	for _, x := range []struct {
		cfg *config.Config
		s   **Server
	}{{r.ca, &r.a}, {r.cb, &r.b}} {
		o := Options{Logf: t.Logf}
		if opts != nil {
			opts(x.cfg, &o)
		}
		s, err := New(x.cfg, o)
		require.NoError(t, err)
		*x.s = s
		done := make(chan error, 1)
		go func() { done <- s.ListenAndServe() }()
		t.Cleanup(func() {
			require.NoError(t, s.Close())
			require.NoError(t, <-done)
		})
		waitSocket(t, x.cfg.Path(config.ProxySocket))
	}
	return r
}

func waitSocket(t testing.TB, path string) {
	t.Helper()
	require.Eventually(t, func() bool {
		c, err := net.Dial("unix", path)
		if err == nil {
			c.Close()
		}
		return err == nil
	}, 5*time.Second, 5*time.Millisecond, "socket %s", path)
}

func attach(t testing.TB, cfg *config.Config) *socklike.Proxy {
	t.Helper()
	return attachWith(t, cfg, socklike.Config{})
}

// attachWith is attach with the application's configuration sc.
func attachWith(t testing.TB, cfg *config.Config, sc socklike.Config) *socklike.Proxy {
	t.Helper()
	p, err := socklike.AttachProxy(cfg.Path(config.ProxySocket), sc)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

// echo serves ln, echoing every connection until EOF.
func echo(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			io.Copy(c, c)
			c.Close()
		}()
	}
}

func roundTrip(t *testing.T, c net.Conn, seed uint64, size int) {
	t.Helper()
	msg := make([]byte, size)
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range msg {
		msg[i] = byte(rng.Uint32())
	}
	errc := make(chan error, 1)
	go func() { _, err := c.Write(msg); errc <- err }()
	got := make([]byte, size)
	_, err := io.ReadFull(c, got)
	require.NoError(t, err)
	require.NoError(t, <-errc)
	require.True(t, bytes.Equal(msg, got), "echoed bytes differ")
}

func TestRackAndSameHost(t *testing.T) {
	r := newRack(t, "")
	srvB := attach(t, r.cb)
	ln, err := (&socklike.ListenConfig{Proxy: srvB}).Listen(context.Background(), "tcp", ":80")
	require.NoError(t, err)
	defer ln.Close()
	go echo(ln)
	srvA := attach(t, r.ca)
	lnA, err := (&socklike.ListenConfig{Proxy: srvA}).Listen(context.Background(), "tcp", ":0")
	require.NoError(t, err)
	defer lnA.Close()
	require.GreaterOrEqual(t, lnA.Addr().(socklike.Addr).Port, firstEphemeral)
	go echo(lnA)

	client := attach(t, r.ca)
	for _, target := range []struct{ addr, path string }{
		{"b:80", ctlapi.PathNTB},
		{"10.77.0.98:80", ctlapi.PathNTB}, // b's virtual address
		{fmt.Sprintf("a:%d", lnA.Addr().(socklike.Addr).Port), ctlapi.PathSHM},
	} {
		c, err := (&socklike.Dialer{Proxy: client}).Dial("tcp", target.addr)
		require.NoError(t, err, target.addr)
		route := c.(*socklike.Conn).Route()
		require.Equal(t, target.path, route.Path, target.addr)
		require.NotEmpty(t, route.Reason)
		for i, size := range []int{1, 64, 4096, 1 << 20, 3<<20 + 17} {
			roundTrip(t, c, uint64(i), size)
		}
		snap := r.a.Snapshot()
		require.Len(t, snap.Conns, 1)
		require.Equal(t, target.path, snap.Conns[0].Path)
		require.NoError(t, c.Close())
	}

	// Nobody listens on b:81; a's ACL-free rack refuses like TCP would.
	_, err = (&socklike.Dialer{Proxy: client}).Dial("tcp", "b:81")
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	_, err = (&socklike.Dialer{Proxy: client}).Dial("tcp", "nowhere:80")
	require.ErrorIs(t, err, socklike.ErrUnknownHost)
	_, err = (&socklike.ListenConfig{Proxy: srvB}).Listen(context.Background(), "tcp", ":80")
	require.ErrorIs(t, err, syscall.EADDRINUSE)
}

// An application that closes its connection right after its last Write,
// while its peer still writes to it: the peer reads everything it wrote,
// then EOF, and its own writes then fail, as over TCP. (In proxy mode the leg's write to the closed end
// fails once the end's CLOSE has come; that ended the leg, and with it
// the last bytes the pump had still to read, and the peer read a short
// stream and EOF.)
func TestClosedEndDeliversItsBytes(t *testing.T) {
	r := newRack(t, "")
	srv := attach(t, r.cb)
	client := attach(t, r.ca)
	want := make([]byte, 4<<20)
	rng := rand.New(rand.NewPCG(7, 1))
	for i := range want {
		want[i] = byte(rng.Uint32())
	}
	for _, pool := range []bool{false, true} {
		ln, err := (&socklike.ListenConfig{Proxy: srv, Pool: pool}).Listen(context.Background(), "tcp", ":0")
		require.NoError(t, err)
		addr := fmt.Sprintf("b:%d", ln.Addr().(socklike.Addr).Port)
		for round := range 4 {
			accepted := make(chan net.Conn, 1)
			go func() {
				if c, err := ln.Accept(); err == nil {
					accepted <- c
				}
			}()
			c, err := (&socklike.Dialer{Proxy: client, Pool: pool}).Dial("tcp", addr)
			require.NoError(t, err)
			peer := <-accepted
			stopped := make(chan error, 1)
			go func() {
				b := make([]byte, 4096)
				for {
					if _, err := peer.Write(b); err != nil {
						stopped <- err
						return
					}
				}
			}()
			werr := make(chan error, 1)
			go func() {
				_, err := c.Write(want)
				c.Close()
				werr <- err
			}()
			got, err := io.ReadAll(peer)
			require.NoError(t, err, "pool %v, round %d", pool, round)
			require.NoError(t, <-werr)
			require.Equal(t, len(want), len(got), "pool %v, round %d: bytes read", pool, round)
			require.True(t, bytes.Equal(want, got), "pool %v, round %d: the bytes differ", pool, round)
			select { // its leg ends, as a closed socket's reset ends TCP's
			case err := <-stopped:
				require.Error(t, err)
			case <-time.After(30 * time.Second):
				t.Fatalf("pool %v, round %d: the peer's writes to the closed end still succeed", pool, round)
			}
			peer.Close()
		}
		ln.Close()
	}
}

func TestACL(t *testing.T) {
	r := newRack(t, `
[[acl]]
action = "deny"
direction = "out"
host = "b"
port = 6379
[[acl]]
action = "deny"
direction = "in"
port = 7000
`)
	srvB := attach(t, r.cb)
	for _, port := range []string{":6379", ":7000"} {
		ln, err := (&socklike.ListenConfig{Proxy: srvB}).Listen(context.Background(), "tcp", port)
		require.NoError(t, err)
		defer ln.Close()
		go echo(ln)
	}
	client := attach(t, r.ca)
	_, err := (&socklike.Dialer{Proxy: client}).Dial("tcp", "b:6379")
	require.ErrorIs(t, err, socklike.ErrDenied)
	require.ErrorContains(t, err, "acl rule 0 denies uid")
	_, err = (&socklike.Dialer{Proxy: client}).Dial("tcp", "b:7000")
	require.ErrorIs(t, err, socklike.ErrDenied, "b's inbound rule")
	require.ErrorContains(t, err, "denies a -> b:7000")
}

// An application that goes away loses its connections, listeners and
// memory at the proxy.
func TestDetachReclaims(t *testing.T) {
	r := newRack(t, "")
	srvB := attach(t, r.cb)
	ln, err := (&socklike.ListenConfig{Proxy: srvB}).Listen(context.Background(), "tcp", ":80")
	require.NoError(t, err)
	go echo(ln)
	client, err := socklike.AttachProxy(r.ca.Path(config.ProxySocket), socklike.Config{})
	require.NoError(t, err)
	var conns []net.Conn
	for range 4 {
		c, err := (&socklike.Dialer{Proxy: client}).Dial("tcp", "b:80")
		require.NoError(t, err)
		roundTrip(t, c, 1, 1000)
		conns = append(conns, c)
	}
	require.Len(t, r.a.Snapshot().Conns, 4)
	require.Len(t, r.b.Snapshot().Conns, 4)
	require.NoError(t, client.Close())
	_, err = conns[0].Read(make([]byte, 1))
	require.Error(t, err)
	require.Eventually(t, func() bool {
		sa, sb := r.a.Snapshot(), r.b.Snapshot()
		return len(sa.Apps) == 0 && len(sa.Conns) == 0 && len(sb.Conns) == 0
	}, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, ln.Close())
	require.Eventually(t, func() bool { return len(r.b.Snapshot().Listeners) == 0 }, 5*time.Second, 10*time.Millisecond)
}

// A peer application that goes without closing its connections (a crash,
// or a detach with connections open): a Read blocked at the other end
// fails with an error matching syscall.ECONNRESET, as TCP's does after a
// reset, not with a clean io.EOF — its stream may lack bytes — in proxy
// and in shared-pool mode.
func TestPeerGoneResets(t *testing.T) {
	r := newRack(t, "")
	client := attach(t, r.ca)
	for _, pool := range []bool{false, true} {
		srv, err := socklike.AttachProxy(r.cb.Path(config.ProxySocket), socklike.Config{})
		require.NoError(t, err)
		ln, err := (&socklike.ListenConfig{Proxy: srv, Pool: pool}).Listen(context.Background(), "tcp", ":0")
		require.NoError(t, err)
		accepted := make(chan net.Conn, 1)
		go func() {
			if c, err := ln.Accept(); err == nil {
				accepted <- c
			}
		}()
		c, err := (&socklike.Dialer{Proxy: client, Pool: pool}).Dial("tcp", fmt.Sprintf("b:%d", ln.Addr().(socklike.Addr).Port))
		require.NoError(t, err)
		peer := <-accepted
		_, err = peer.Write([]byte("x"))
		require.NoError(t, err)
		got := make([]byte, 1)
		_, err = io.ReadFull(c, got)
		require.NoError(t, err)
		read := make(chan error, 1)
		go func() { _, err := c.Read(got); read <- err }()
		require.NoError(t, srv.Close()) // peer is never closed
		err = <-read
		require.ErrorIs(t, err, syscall.ECONNRESET, "pool %v: a Read after the peer went: %v", pool, err)
		c.Close()
		ln.Close()
	}
}

// Malformed and wrong-version hellos get an answer and a closed socket; the
// proxy keeps serving.
func TestBadHello(t *testing.T) {
	r := newRack(t, "")
	path := r.ca.Path(config.ProxySocket)
	for _, hello := range [][]byte{
		[]byte("GET / HTTP/1.0\r\n\r\n"),
		appproto.Hello{Version: 99, Name: "future"}.Encode(),
	} {
		c, err := net.Dial("unix", path)
		require.NoError(t, err)
		_, err = c.Write(hello)
		require.NoError(t, err)
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, appproto.MaxDatagram)
		n, err := c.Read(buf)
		require.NoError(t, err)
		w, err := appproto.DecodeWelcome(buf[:n])
		require.NoError(t, err)
		require.NotEqual(t, ctlapi.OK, w.Code)
		_, err = c.Read(buf)
		require.ErrorIs(t, err, io.EOF)
		c.Close()
	}
	_ = attach(t, r.ca)
}

// The proxied connection passes the standard library's conformance suite.
func TestNettest(t *testing.T) {
	r := newRack(t, "")
	srvB := attach(t, r.cb)
	client := attach(t, r.ca)
	ln, err := (&socklike.ListenConfig{Proxy: srvB}).Listen(context.Background(), "tcp", ":0")
	require.NoError(t, err)
	defer ln.Close()
	addr := fmt.Sprintf("b:%d", ln.Addr().(socklike.Addr).Port)
	conformance(t, ln, func(ctx context.Context) (net.Conn, error) {
		return (&socklike.Dialer{Proxy: client}).DialContext(ctx, "tcp", addr)
	})
}

// conformance runs nettest.TestConn on pairs of a dial and ln's accept.
func conformance(t *testing.T, ln net.Listener, dial func(context.Context) (net.Conn, error)) {
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		accepted := make(chan net.Conn, 1)
		go func() {
			c, err := ln.Accept()
			if err == nil {
				accepted <- c
			}
		}()
		c1, err := dial(ctx)
		if err != nil {
			return nil, nil, nil, err
		}
		select {
		case c2 := <-accepted:
			return c1, c2, func() { c1.Close(); c2.Close() }, nil
		case <-ctx.Done():
			c1.Close()
			return nil, nil, nil, errors.New("accept timed out")
		}
	})
}

// Direct mode: the proxies grant a link of its own and step off the data
// path; the grant ends with the connection.
func TestDirect(t *testing.T) {
	r := newRack(t, "")
	srvB := attach(t, r.cb)
	ln, err := (&socklike.ListenConfig{Proxy: srvB}).Listen(context.Background(), "tcp", ":80")
	require.NoError(t, err)
	defer ln.Close()
	go echo(ln)
	srvA := attach(t, r.ca)
	lnA, err := (&socklike.ListenConfig{Proxy: srvA}).Listen(context.Background(), "tcp", ":81")
	require.NoError(t, err)
	defer lnA.Close()
	go echo(lnA)
	client := attachWith(t, r.ca, socklike.Config{DirectIdle: -1}) // a link closes with its connection
	memory := func(s *Server) (m int64) {
		for _, a := range s.Snapshot().Apps {
			m += a.Memory
		}
		return m
	}
	baseA, baseB := memory(r.a), memory(r.b)
	for _, target := range []string{"b:80", "a:81"} {
		c, err := (&socklike.Dialer{Proxy: client, Direct: true}).DialContext(context.Background(), "tcp", target)
		require.NoError(t, err, target)
		require.Equal(t, "direct", c.(*socklike.Conn).Route().Mode)
		require.Contains(t, c.(*socklike.Conn).Route().Reason, "direct")
		for i, size := range []int{1, 4096, 1 << 20} {
			roundTrip(t, c, uint64(i), size)
		}
		require.Greater(t, memory(r.a), baseA, "the grant is charged")
		conns := r.a.Snapshot().Conns
		require.NotEmpty(t, conns)
		require.Zero(t, conns[0].BytesTX, "no byte crosses the proxy")
		require.NoError(t, c.Close())
		require.Eventually(t, func() bool {
			return memory(r.a) == baseA && memory(r.b) == baseB && len(r.a.Snapshot().Conns) == 0 && len(r.b.Snapshot().Conns) == 0
		}, 5*time.Second, 10*time.Millisecond, "%s: the grant outlived the connection", target)
		files, _ := filepath.Glob(filepath.Join(r.ca.Proxy.FabricDir, directPrefix+"*"))
		require.Empty(t, files, "direct link files are removed")
	}

	// The standard library's conformance suite over a direct connection.
	lnN, err := (&socklike.ListenConfig{Proxy: srvB}).Listen(context.Background(), "tcp", ":82")
	require.NoError(t, err)
	defer lnN.Close()
	d := &socklike.Dialer{Proxy: client, Direct: true}
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
		accepted := make(chan net.Conn, 1)
		go func() {
			if c, err := lnN.Accept(); err == nil {
				accepted <- c
			}
		}()
		c1, err := d.Dial("tcp", "b:82")
		if err != nil {
			return nil, nil, nil, err
		}
		select {
		case c2 := <-accepted:
			return c1, c2, func() { c1.Close(); c2.Close() }, nil
		case <-time.After(10 * time.Second):
			c1.Close()
			return nil, nil, nil, errors.New("accept timed out")
		}
	})
}

func TestDirectQuota(t *testing.T) {
	window := 1 << 20
	r := newRack(t, "", fmt.Sprintf("direct_window = %d\ndirect_quota = %d", window, linkBytes(window))) // room for one
	srvB := attach(t, r.cb)
	ln, err := (&socklike.ListenConfig{Proxy: srvB}).Listen(context.Background(), "tcp", ":80")
	require.NoError(t, err)
	defer ln.Close()
	go echo(ln)
	ln2, err := (&socklike.ListenConfig{Proxy: srvB}).Listen(context.Background(), "tcp", ":81")
	require.NoError(t, err)
	defer ln2.Close()
	go echo(ln2)
	client := attach(t, r.ca)
	c, err := (&socklike.Dialer{Proxy: client, Direct: true}).DialContext(context.Background(), "tcp", "b:80")
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, "direct", c.(*socklike.Conn).Route().Mode)
	roundTrip(t, c, 1, 1000)
	onLink(t, c.(*socklike.Conn))

	// With the quota used up, a Dialer asking for direct mode to another
	// address (a dial to b:80 again would be a connection on the live
	// link) settles for the proxies, and says so.
	d := &socklike.Dialer{Proxy: client, Direct: true}
	pc, err := d.Dial("tcp", "b:81")
	require.NoError(t, err)
	defer pc.Close()
	route := pc.(*socklike.Conn).Route()
	require.Equal(t, ctlapi.PathNTB, route.Path)
	require.Equal(t, "proxy", route.Mode)
	require.Contains(t, route.Reason, "direct_quota")
	require.Contains(t, route.Reason, "direct mode refused (quota exceeded: direct links of app")
	require.Contains(t, route.Reason, "; through the proxies: rack peer b over NTB link ab")
	roundTrip(t, pc, 2, 1<<20)
	// The proxied path c began on closes once both ends have left it.
	waitfor.True(t, "the lease and the proxied connection only", func() bool { return len(r.a.Snapshot().Conns) == 2 })
}

// A direct link that does not fit the quota left at direct_window gets a
// smaller window instead of the proxies, down to minDirectWindow.
func TestDirectWindowShrinksToQuota(t *testing.T) {
	window := 1 << 20
	quota := linkBytes(window) + linkBytes(window/2) // one full, one half
	r := newRack(t, "", fmt.Sprintf("direct_window = %d\ndirect_quota = %d", window, quota))
	srvB := attach(t, r.cb)
	ln, err := (&socklike.ListenConfig{Proxy: srvB}).Listen(context.Background(), "tcp", ":80")
	require.NoError(t, err)
	defer ln.Close()
	go echo(ln)
	for _, port := range []string{":81", ":82"} {
		ln, err := (&socklike.ListenConfig{Proxy: srvB}).Listen(context.Background(), "tcp", port)
		require.NoError(t, err)
		defer ln.Close()
		go echo(ln)
	}
	client := attach(t, r.ca)
	d := &socklike.Dialer{Proxy: client, Direct: true}
	for i, want := range []string{"direct", "direct", "proxy"} {
		c, err := d.Dial("tcp", fmt.Sprintf("b:%d", 80+i)) // a link each: a dial to the same address shares one
		require.NoError(t, err)
		defer c.Close()
		require.Equal(t, want, c.(*socklike.Conn).Route().Mode, "connection %d", i)
		roundTrip(t, c, uint64(i), 100<<10)
	}
}

// Garbage on the service ports of an application's memory link: each bad
// request gets its connection closed; the application and the proxy carry
// on.
func TestBadRequests(t *testing.T) {
	r := newRack(t, "")
	uc, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: r.ca.Path(config.ProxySocket), Net: "unix"})
	require.NoError(t, err)
	defer uc.Close()
	_, err = uc.Write(appproto.Hello{Version: appproto.Version, Name: "raw"}.Encode())
	require.NoError(t, err)
	buf := make([]byte, appproto.MaxDatagram)
	n, f, err := proc.RecvFile(uc, buf, "link")
	require.NoError(t, err)
	require.NotNil(t, f)
	defer f.Close()
	w, err := appproto.DecodeWelcome(buf[:n])
	require.NoError(t, err)
	dev, err := shm.OpenFile(f, "raw", shm.Options{WindowSize: int(w.Window), Side: shm.Side1})
	require.NoError(t, err)
	defer dev.Close()
	ep, err := transport.Attach(dev, transport.Config{})
	require.NoError(t, err)
	defer ep.Close()

	rng := rand.New(rand.NewPCG(7, 7))
	for i := range 40 {
		port := []int{appproto.PortDial, appproto.PortListen}[i%2]
		c, err := ep.Dial(port)
		require.NoError(t, err)
		junk := make([]byte, 1+rng.IntN(300))
		for j := range junk {
			junk[j] = byte(rng.Uint32())
		}
		if i%4 < 2 { // a well-framed but wrong body
			junk = append([]byte{byte(len(junk)), 0, 0, 0}, junk...)
		}
		c.Write(junk)
		c.CloseWrite() // a frame cut short ends at EOF, not at the proxy's timeout
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = io.ReadAll(c) // a reply with an error code, or nothing; then EOF
		require.NoError(t, err, "request %d: the proxy must close the connection", i)
		c.Close()
	}
	// Still serving this application, and others.
	c, err := ep.Dial(appproto.PortDial)
	require.NoError(t, err)
	require.NoError(t, appproto.WriteFrame(c, appproto.DialRequest{Target: "nowhere", Port: 1}))
	var reply appproto.DialReply
	require.NoError(t, appproto.ReadFrame(c, &reply))
	require.Equal(t, ctlapi.CodeUnknown, reply.Code)
	_ = attach(t, r.ca)
}

// Failover: the NTB link goes down under a stream and comes back; the
// stream carries on over TCP and returns to the link, every byte in order.
func TestFailover(t *testing.T) {
	port := 20000 + rand.IntN(20000)
	r := newRack(t, fmt.Sprintf(`fallback = "{peer}:%d"`, port), fmt.Sprintf(`fallback = "{self}:%d"`, port))
	_, client := echoRack(t, r)
	c, err := (&socklike.Dialer{Proxy: client}).Dial("tcp", "b:80")
	require.NoError(t, err)
	defer c.Close()
	streamThroughOutage(t, r, c, 48<<20, ctlapi.PathTCP)
}

// echoRack serves an echo on b:80 and returns b's server application and
// a's client application.
func echoRack(t testing.TB, r *rack) (srv, client *socklike.Proxy) {
	srv = attach(t, r.cb)
	ln, err := (&socklike.ListenConfig{Proxy: srv}).Listen(context.Background(), "tcp", ":80")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go echo(ln)
	return srv, attach(t, r.ca)
}

// streamThroughOutage streams total bytes on c, an NTB connection from a
// to b's echo, and checks the echo byte for byte. Meanwhile it pulls the
// link a quarter through, waits until a's proxy shows the connection on
// fallback, restores the link once half the bytes are back, and waits
// until the connection is on the NTB again; the writer holds its last
// quarter until then, so the stream sees both moves.
func streamThroughOutage(t *testing.T, r *rack, c net.Conn, total int, fallback string) {
	t.Helper()
	require.Equal(t, ctlapi.PathNTB, c.(interface{ Route() socklike.Route }).Route().Path)
	dev := r.a.links["b"].ep.Device().(*shm.Device)
	var read atomic.Int64
	back := make(chan struct{}) // closed once the connection is on the NTB again
	outage := make(chan error, 1)
	go func() {
		wait := func(what string, cond func() bool) error {
			if !waitfor.Until(cond) {
				return errors.New("timed out waiting for " + what)
			}
			return nil
		}
		path := func() string {
			if s := r.a.Snapshot(); len(s.Conns) == 1 {
				return s.Conns[0].Path
			}
			return ""
		}
		err := wait("a quarter of the stream", func() bool { return read.Load() > int64(total)/4 })
		if err == nil {
			dev.ForceLinkDown()
			err = wait("the move to "+fallback, func() bool { return path() == fallback })
		}
		if err == nil {
			err = wait("half the stream", func() bool { return read.Load() > int64(total)/2 })
		}
		if err == nil {
			dev.ForceLinkUp()
			err = wait("the move back to the NTB", func() bool { return path() == ctlapi.PathNTB })
		}
		if err != nil {
			c.Close() // unblock the reader and the writer
		} else {
			close(back)
		}
		outage <- err
	}()
	sum := sha256.New()
	written := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(uint64(total), 3))
		buf := make([]byte, 32<<10)
		for n := 0; n < total; n += len(buf) {
			if n == total*3/4 {
				<-back
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
		written <- c.(interface{ CloseWrite() error }).CloseWrite()
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
	require.NoError(t, <-outage, "to %s and back", fallback)
	require.ErrorIs(t, rerr, io.EOF)
	require.NoError(t, <-written)
	require.Equal(t, int64(total), read.Load())
	require.Equal(t, sum.Sum(nil), got.Sum(nil), "every byte, in order, once")
	require.GreaterOrEqual(t, r.a.Snapshot().PathSwitches, uint64(2), "to %s and back, counted", fallback)
	require.Eventually(t, func() bool { return len(r.a.Snapshot().Conns) == 0 }, 5*time.Second, 10*time.Millisecond)
}

// A Close that comes before ListenAndServe serves ends it as a later
// Close does: nil, not the error of a listener found closed.
func TestListenAndServeAfterClose(t *testing.T) {
	cfg, err := config.Parse(fmt.Appendf(nil, "host = \"a\"\nstate_dir = %q\n[auth]\ninsecure = true\n", t.TempDir()))
	require.NoError(t, err)
	s, err := New(cfg, Options{Logf: t.Logf})
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, s.ListenAndServe())
}
