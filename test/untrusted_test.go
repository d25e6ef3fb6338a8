//go:build integration

package test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/daemon/monitor"
	"github.com/ntstack/ntstack/internal/tools/rack"
	"github.com/ntstack/ntstack/internal/wire/appproto"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/internal/wire/hostauth"
	"github.com/ntstack/ntstack/internal/wire/hostauth/hostauthtest"
	"github.com/ntstack/ntstack/socklike"
)

// TestRackUntrustedHost: m sits on the rack network, with a key of its
// own, but is no configured peer of a or b. From m's namespace it tries
// what the rack network allows: to join a's ntmon as b (in plain TCP, with
// its own key, with a key naming b), and to resume a live a→b connection
// on b's TCP fallback, guessing tokens. Everything is refused; a keeps the
// one session with b it had, and the connection keeps carrying bytes.
func TestRackUntrustedHost(t *testing.T) {
	r := startRack(t, rack.Spec{
		Hosts:   []string{"a", "b", "m"},
		OffRack: []string{"m"},
		Configure: func(c *config.Config) {
			// m knows a and b; they do not know m.
			if c.Host != "m" {
				c.Peers = slices.DeleteFunc(c.Peers, func(p config.Peer) bool { return p.Host == "m" })
			} else {
				c.Peers = nil
			}
		},
	})
	a, b, m := r.Host("a"), r.Host("b"), r.Host("m")

	// The victim: a's application to b's echo, over the TCP fallback.
	srv := attachTo(t, b)
	ln, err := (&socklike.ListenConfig{Proxy: srv}).Listen(context.Background(), "tcp", ":7000")
	require.NoError(t, err)
	defer ln.Close()
	go serveEcho(ln)
	cli := attachTo(t, a)
	victim, err := (&socklike.Dialer{Proxy: cli, Transports: []string{ctlapi.PathTCP}}).Dial("tcp", "b:7000")
	require.NoError(t, err)
	defer victim.Close()
	require.Equal(t, ctlapi.PathTCP, victim.(*socklike.Conn).Route().Path)
	require.NoError(t, echoCheck(victim, 1, 1<<20))

	peerUps := func() int {
		log, err := os.ReadFile(a.LogPath("ntmon"))
		require.NoError(t, err)
		n := 0
		for _, l := range strings.Split(string(log), "\n") {
			if strings.Contains(l, `msg="peer up"`) && strings.Contains(l, "peer=b") {
				n++
			}
		}
		return n
	}
	ups := peerUps()
	require.GreaterOrEqual(t, ups, 1)

	mKey, err := hostauth.LoadKey(m.KeyPath)
	require.NoError(t, err)
	fakeB := hostauthtest.Keys(t, "b")["b"]
	fakeBKey, err := hostauth.LoadKey(fakeB.Path)
	require.NoError(t, err)
	hello := monitor.Hello{Magic: monitor.Magic, Version: monitor.ProtocolVersion, Host: "b", Caps: []string{"ntb", "tcp", "rdma"}, RDMA: "192.0.2.66:7490"}
	control := netip.AddrPortFrom(a.IP, rack.ControlPort).String()
	fallback := netip.AddrPortFrom(b.IP, rack.FallbackPort).String()
	refused := func(c net.Conn, write func(net.Conn) error, read func(net.Conn) error) {
		err := write(c)
		if err == nil {
			err = read(c)
		}
		var ne net.Error
		require.False(t, errors.As(err, &ne) && ne.Timeout(), "not closed by the daemon: %v", err)
		require.Error(t, err)
	}
	sayHello := func(c net.Conn) error { return monitor.WriteFrame(c, monitor.FrameHello, hello) }
	readFrame := func(c net.Conn) error { _, err := monitor.ReadFrame(c); return err }

	require.NoError(t, r.Enter("m", func() error {
		dial := func(addr string, cert *tls.Certificate) net.Conn {
			c, err := net.DialTimeout("tcp", addr, 10*time.Second)
			require.NoError(t, err)
			require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
			if cert == nil {
				return c
			}
			return tls.Client(c, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true, Certificates: []tls.Certificate{*cert}})
		}
		for _, cert := range []*tls.Certificate{nil, &mKey, &fakeBKey} {
			c := dial(control, cert)
			refused(c, sayHello, readFrame)
			c.Close()
		}
		// Resume guesses: tokens are small numbers, the secret is not.
		for token := uint64(1); token <= 20; token++ {
			for _, cert := range []*tls.Certificate{nil, &mKey, &fakeBKey} {
				c := dial(fallback, cert)
				refused(c, func(c net.Conn) error {
					return appproto.WriteFrame(c, appproto.RackOpen{From: "a", Resume: token, Secret: make([]byte, 32)})
				}, func(c net.Conn) error {
					var reply appproto.DialReply
					if err := appproto.ReadFrame(c, &reply); err != nil {
						return err
					}
					return fmt.Errorf("answered: %+v", reply)
				})
				c.Close()
			}
		}
		return nil
	}))

	// a's session with b is the one it had; b's RDMA target is b's own.
	require.Equal(t, ups, peerUps(), "a's session with b was replaced")
	st, err := status(a)
	require.NoError(t, err)
	for _, p := range st.Peers {
		require.True(t, p.Up, "%s down: %s", p.Host, p.Why)
		require.NotEqual(t, "192.0.2.66:7490", p.RDMA)
	}
	// The victim never moved and carries on, byte for byte.
	for k, n := range []int{1, 4096, 1 << 20} {
		require.NoError(t, echoCheck(victim, uint64(10+k), n))
	}
	require.Equal(t, ctlapi.PathTCP, victim.(*socklike.Conn).Route().Path)
	require.Zero(t, snapshot(t, b).PathSwitches)
	require.NoError(t, victim.(interface{ CloseWrite() error }).CloseWrite())
	_, err = io.Copy(io.Discard, victim)
	require.NoError(t, err)
}
