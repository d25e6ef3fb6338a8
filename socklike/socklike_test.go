package socklike

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/net/nettest"

	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/ntb/ntbtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// endpoints attaches an Endpoint to each end of an in-memory link.
func endpoints(t testing.TB, cfg Config) (*Endpoint, *Endpoint) {
	t.Helper()
	da, db := ntbtest.NewPair(1 << 20)
	cfg.Logf = t.Logf
	a, err := Attach(da, cfg)
	require.NoError(t, err)
	b, err := Attach(db, cfg)
	require.NoError(t, err)
	t.Cleanup(func() {
		a.Close()
		b.Close()
		da.Close()
		db.Close()
	})
	return a, b
}

// pair dials b's listener on port from a through the public API.
func pair(t testing.TB, a, b *Endpoint, port string) (net.Conn, net.Conn) {
	t.Helper()
	lc := ListenConfig{Endpoint: b}
	ln, err := lc.Listen(context.Background(), "ntb", ":"+port)
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	d := Dialer{Endpoint: a, Timeout: 10 * time.Second}
	c, err := d.Dial("tcp", "peer:"+port)
	require.NoError(t, err)
	return c, <-accepted
}

func TestEcho(t *testing.T) {
	a, b := endpoints(t, Config{})
	c1, c2 := pair(t, a, b, "7")
	defer c1.Close()
	defer c2.Close()
	msg := []byte("hello over the fabric")
	go func() {
		buf := make([]byte, 64)
		n, _ := c2.Read(buf)
		c2.Write(buf[:n])
	}()
	_, err := c1.Write(msg)
	require.NoError(t, err)
	got := make([]byte, len(msg))
	_, err = io.ReadFull(c1, got)
	require.NoError(t, err)
	require.Equal(t, msg, got)

	for _, c := range []net.Conn{c1, c2} {
		r := c.(*Conn).Route()
		require.Equal(t, "ntb", r.Path)
		require.Equal(t, "embedded", r.Mode)
		require.NotEmpty(t, r.Reason)
	}
	require.Equal(t, 7, c1.RemoteAddr().(Addr).Port)
	require.Equal(t, 7, c2.LocalAddr().(Addr).Port)
	require.Equal(t, "ntb", c1.LocalAddr().Network())
}

// The public defaults and core models are the engine's.
func TestMatchesEngine(t *testing.T) {
	require.Equal(t, transport.DefaultSpinBudget, DefaultSpinBudget)
	require.Equal(t, transport.DefaultWindow, DefaultWindow)
	require.Equal(t, transport.DefaultMTU, DefaultMTU)
	for _, m := range []CoreModel{CoreInline, CoreShared, CoreSplit} {
		require.Equal(t, m.String(), transport.CoreModel(m).String())
	}
	require.Equal(t, "inline", CoreInline.String())
	require.Equal(t, "split", CoreSplit.String())
}

// Errors speak the standard library's language and carry the Conn's own
// addresses.
func TestErrors(t *testing.T) {
	a, b := endpoints(t, Config{})
	d := Dialer{Endpoint: a, Timeout: 10 * time.Second}
	_, err := d.Dial("tcp", "peer:9")
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	_, err = d.Dial("tcp", "peer")
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)

	c1, c2 := pair(t, a, b, "8")
	require.NoError(t, c1.SetReadDeadline(time.Now().Add(time.Millisecond)))
	_, err = c1.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout())
	require.ErrorAs(t, err, &oe)
	require.Equal(t, c1.LocalAddr(), oe.Source)
	require.Equal(t, c1.RemoteAddr(), oe.Addr)

	require.NoError(t, c2.(*Conn).CloseWrite())
	require.NoError(t, c1.SetReadDeadline(time.Time{}))
	_, err = c1.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)
	require.NoError(t, c1.Close())
	require.ErrorIs(t, c1.Close(), net.ErrClosed)
	require.NoError(t, c2.Close())

	lc := ListenConfig{Endpoint: b}
	ln, err := lc.Listen(context.Background(), "ntb", ":8")
	require.NoError(t, err)
	_, err = lc.Listen(context.Background(), "ntb", ":8")
	require.ErrorIs(t, err, syscall.EADDRINUSE)
	require.NoError(t, ln.Close())
	_, err = ln.Accept()
	require.ErrorIs(t, err, net.ErrClosed)
}

// Priority classes, with Config.QoS, each take their own partition.
func TestSetPriority(t *testing.T) {
	a, b := endpoints(t, Config{QoS: true, Partitions: 8, Window: 64 << 10})
	c1, c2 := pair(t, a, b, "5")
	defer c1.Close()
	defer c2.Close()
	require.NoError(t, c1.(*Conn).SetPriority(3))
	require.Error(t, c1.(*Conn).SetPriority(8))
	go c2.Write([]byte("x"))
	_, err := io.ReadFull(c1, make([]byte, 1))
	require.NoError(t, err)
}

// The standard library's net.Conn conformance suite, through the public
// types.
func TestNettest(t *testing.T) {
	a, b := endpoints(t, Config{})
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
		c1, c2 := pair(t, a, b, "80")
		return c1, c2, func() { c1.Close(); c2.Close() }, nil
	})
}

// Attached mode without $NTSTACK_PROXY fails with an explanation, not a
// panic.
func TestNoProxy(t *testing.T) {
	if os.Getenv(EnvProxy) != "" {
		t.Skipf("$%s is set in this environment: the default proxy would be dialed", EnvProxy)
	}
	var d Dialer
	_, err := d.Dial("tcp", "b:80")
	require.ErrorContains(t, err, EnvProxy)
	_, err = Listen("tcp", ":80")
	require.ErrorContains(t, err, EnvProxy)
}

// Abort resets the connection: the peer reads what came before, then
// fails with ECONNRESET in a *net.OpError, not io.EOF.
func TestAbortResets(t *testing.T) {
	a, b := endpoints(t, Config{})
	c1, c2 := pair(t, a, b, "7101")
	defer c1.Close()
	_, err := c2.Write([]byte("hi"))
	require.NoError(t, err)
	require.NoError(t, c2.(*Conn).Abort())
	got, err := io.ReadAll(c1)
	require.Equal(t, "hi", string(got))
	var oe *net.OpError
	require.ErrorAs(t, err, &oe)
	require.ErrorIs(t, err, syscall.ECONNRESET)
}

// A peer that closes its end of the link, or dies, resets the connection
// as TCP would: ECONNRESET in a *net.OpError, the message saying which.
func TestPeerGoneResets(t *testing.T) {
	for _, tc := range []struct {
		name string
		act  func(*ntbtest.Device)
		why  string
	}{
		{"close", func(d *ntbtest.Device) { d.Close() }, "peer endpoint closed"},
		{"kill", (*ntbtest.Device).Kill, "peer process exited"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			da, db := ntbtest.NewPair(1 << 20)
			a, err := Attach(da, Config{Logf: t.Logf})
			require.NoError(t, err)
			b, err := Attach(db, Config{Logf: t.Logf})
			require.NoError(t, err)
			t.Cleanup(func() { a.Close(); b.Close(); da.Close(); db.Close() })
			c1, c2 := pair(t, a, b, "7100")
			defer c2.Close()
			_, err = c2.Write([]byte("hi"))
			require.NoError(t, err)
			buf := make([]byte, 2)
			_, err = io.ReadFull(c1, buf)
			require.NoError(t, err, "the connection works before")
			tc.act(db)
			_, err = c1.Read(buf)
			var oe *net.OpError
			require.ErrorAs(t, err, &oe)
			require.ErrorIs(t, err, syscall.ECONNRESET)
			require.ErrorIs(t, err, ErrLinkDown)
			require.Contains(t, err.Error(), "connection reset by peer: "+tc.why)
		})
	}
}
