package gateway

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/daemon/proxy"
	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/wire/hostauth/hostauthtest"
	"github.com/ntstack/ntstack/socklike"
)

// host is one side of a two-host rack in this process: its ntproxy and its
// gateway.
type host struct {
	cfg *config.Config
	gw  *Gateway
}

// newRack starts hosts a and b joined by an emulated link, a forwarding
// 127.0.0.1:0 to b:7000 and b exporting port 7000 to target. Both
// proxies run in the test process; under -race beside other packages on
// two CPUs a link monitor once missed the default 250 ms heartbeat
// timeout (TestCarry, CI at 876f930), and these tests are about carrying
// data, not detecting a dead link: the link allows 2 s.
//
// bConfig, if given, is appended to b's configuration.
func newRack(t testing.TB, mode, target string, bConfig ...string) (a, b host) {
	t.Helper()
	root := t.TempDir()
	fabric := filepath.Join("/dev/shm", fmt.Sprintf("ntstack-gwtest-%d-%d", os.Getpid(), rand.Uint32()))
	t.Cleanup(func() { os.RemoveAll(fabric) })
	keys := hostauthtest.Keys(t, "a", "b")
	start := func(name, peer, gw string) host {
		cfg, err := config.Parse(fmt.Appendf(nil, `host = %q
state_dir = %q
[auth]
key = %q
[proxy]
fabric_dir = %q
window = 4194304
app_window = 2097152
link_timeout = "2s"
[gateway]
mode = %q
%s
[[peers]]
host = %q
addresses = ["10.77.0.%d"]
link = "ab"
key = %q
`, name, filepath.Join(root, name), keys[name].Path, fabric, mode, gw, peer, peer[0], keys[peer].Pin))
		require.NoError(t, err)
		s, err := proxy.New(cfg, proxy.Options{Logf: t.Logf})
		require.NoError(t, err)
		served := make(chan error, 1)
		go func() { served <- s.ListenAndServe() }()
		var p *socklike.Proxy
		require.Eventually(t, func() bool {
			p, err = socklike.AttachProxy(cfg.Path(config.ProxySocket), socklike.Config{Sockets: true}) // as ntproxy attaches its gateway
			return err == nil
		}, 5*time.Second, 5*time.Millisecond)
		g, err := New(cfg, p, t.Logf)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- g.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			require.NoError(t, <-ran)
			p.Close()
			require.NoError(t, s.Close())
			require.NoError(t, <-served)
		})
		select {
		case <-g.Ready():
		case err := <-ran:
			ran <- nil // for the cleanup, which stops the proxy
			t.Fatalf("gateway of %s: %v", name, err)
		}
		return host{cfg: cfg, gw: g}
	}
	b = start("b", "a", fmt.Sprintf("[[gateway.export]]\nport = 7000\ntarget = %q\n%s", target, strings.Join(bConfig, "\n")))
	a = start("a", "b", "[[gateway.forward]]\nlisten = \"127.0.0.1:0\"\nto = \"b:7000\"")
	return a, b
}

// echoServer is a TCP server echoing each connection until EOF.
func echoServer(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
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
	}()
	return ln.Addr().String()
}

// A TCP client and a TCP server, neither aware of ntstack, talk through
// the gateways of two hosts: every byte echoed back in order, the client's
// half close reaching the server, the counters on both sides; in trunk
// mode every connection on the one trunk.
func TestCarry(t *testing.T) {
	for _, mode := range []string{config.GatewayTrunk, config.GatewayDirect, config.GatewayProxy} {
		t.Run(mode, func(t *testing.T) {
			a, b := newRack(t, mode, echoServer(t))
			fwd := a.gw.Stats()[0].Listen
			const size = 8 << 20
			payload := make([]byte, size)
			rng := rand.New(rand.NewPCG(1, 2))
			for i := range payload {
				payload[i] = byte(rng.Uint32())
			}
			for conn := range 3 {
				c, err := net.Dial("tcp", fwd)
				require.NoError(t, err)
				go func() {
					c.Write(payload)
					c.(*net.TCPConn).CloseWrite() // the echo server's EOF, then ours
				}()
				got, err := io.ReadAll(c)
				require.NoError(t, err, "connection %d", conn)
				require.True(t, bytes.Equal(payload, got), "connection %d: %d bytes echoed, want %d identical", conn, len(got), size)
				c.Close()
			}
			require.Eventually(t, func() bool { return a.gw.Stats()[0].Active == 0 && b.gw.Stats()[0].Active == 0 }, 5*time.Second, 10*time.Millisecond)
			fa, eb := a.gw.Stats()[0], b.gw.Stats()[0]
			require.Equal(t, int64(3), fa.Total)
			require.Equal(t, int64(3), eb.Total)
			require.Equal(t, uint64(3*size), fa.BytesIn)
			require.Equal(t, uint64(3*size), fa.BytesOut)
			require.Equal(t, uint64(3*size), eb.BytesIn)
			require.Equal(t, uint64(3*size), eb.BytesOut)
			require.Equal(t, mode, fa.Mode)
			trunked := int64(0)
			if mode == config.GatewayTrunk {
				trunked = 3
			}
			require.Equal(t, trunked, a.gw.services[0].trunked.Load())
		})
	}
}

// An export whose server is down: the client's connection ends, and the
// export counts the failure and says why.
func TestTargetDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := ln.Addr().String()
	ln.Close()
	a, b := newRack(t, config.GatewayDirect, dead)
	c, err := net.Dial("tcp", a.gw.Stats()[0].Listen)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)
	st := b.gw.Stats()[0]
	require.Equal(t, int64(1), st.Failed)
	require.Contains(t, st.LastError, "connection refused")
}

// A reset on either side of a carried connection reaches the other side
// as a reset, not as an orderly end, in every mode: a server that aborts
// its connection makes the client's read fail with ECONNRESET, and a
// client that aborts makes the server's.
//
// A direct-mode connection begins on the proxied path and moves onto its
// direct link once that is up; the reset is carried from either, and
// direct-on-link resets only once both ends are on the link.
func TestResetCarried(t *testing.T) {
	for _, mode := range []string{config.GatewayTrunk, config.GatewayDirect, config.GatewayProxy} {
		t.Run(mode, func(t *testing.T) { testResetCarried(t, mode, false) })
	}
	t.Run(config.GatewayDirect+"-on-link", func(t *testing.T) { testResetCarried(t, config.GatewayDirect, true) })
}

// onLink waits until g carries one connection, on its direct link.
func onLink(t *testing.T, g *Gateway) {
	t.Helper()
	waitfor.True(t, "one carried connection, on its direct link", func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		if len(g.conns) != 1 {
			return false // the one before is still ending
		}
		for cc := range g.conns {
			c, ok := cc.fabric.(interface{ Route() socklike.Route })
			if !ok {
				return false
			}
			r := c.Route()
			return r.Mode == "direct" && !strings.HasPrefix(r.Reason, "on the proxied path until")
		}
		return false
	})
}

func testResetCarried(t *testing.T, mode string, link bool) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	a, b := newRack(t, mode, ln.Addr().String())
	carriedOnLink := func() {
		if link {
			onLink(t, a.gw)
			onLink(t, b.gw)
		}
	}
	fwd := a.gw.Stats()[0].Listen
	reset := func(c net.Conn) {
		c.(*net.TCPConn).SetLinger(0)
		c.Close()
	}
	readErr := func(c net.Conn) error {
		c.SetReadDeadline(time.Now().Add(30 * time.Second)) // a failure guard only
		_, err := io.ReadAll(c)
		return err
	}
	accept := func() net.Conn {
		s, err := ln.Accept()
		require.NoError(t, err)
		_, err = io.ReadFull(s, make([]byte, 1)) // the connection has crossed the fabric
		require.NoError(t, err)
		return s
	}

	c, err := net.Dial("tcp", fwd)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte{1})
	require.NoError(t, err)
	s := accept()
	carriedOnLink()
	reset(s)
	require.ErrorIs(t, readErr(c), syscall.ECONNRESET, "the server's reset reaches the client")

	c, err = net.Dial("tcp", fwd)
	require.NoError(t, err)
	_, err = c.Write([]byte{1})
	require.NoError(t, err)
	s = accept()
	defer s.Close()
	carriedOnLink()
	reset(c)
	require.ErrorIs(t, readErr(s), syscall.ECONNRESET, "the client's reset reaches the server")
}
