package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"

	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/ntbtest"
	"github.com/ntstack/ntstack/ntb/shm"
)

var linkSeq atomic.Int64

// fabricDir is a fresh directory under /dev/shm for one test's links.
func fabricDir(t testing.TB) string {
	t.Helper()
	dir := filepath.Join("/dev/shm", fmt.Sprintf("ntstack-test-%d-%d", os.Getpid(), linkSeq.Add(1)))
	require.NoError(t, os.MkdirAll(dir, 0o700))
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// backends run a test over the in-memory pair and the emulated fabric.
var backends = map[string]func(t testing.TB) (ntb.Device, ntb.Device){
	"ntbtest": func(t testing.TB) (ntb.Device, ntb.Device) {
		a, b := ntbtest.NewPair(1 << 20)
		t.Cleanup(func() { a.Close(); b.Close() })
		return a, b
	},
	"shm": func(t testing.TB) (ntb.Device, ntb.Device) {
		o := shm.Options{Dir: fabricDir(t), WindowSize: 1 << 20}
		a, err := shm.Open("l", o)
		require.NoError(t, err)
		b, err := shm.Open("l", o)
		require.NoError(t, err)
		t.Cleanup(func() { a.Close(); b.Close() })
		return a, b
	},
}

func endpoints(t testing.TB, backend string, cfg Config) (*Endpoint, *Endpoint) {
	t.Helper()
	da, db := backends[backend](t)
	return attachPair(t, da, db, cfg)
}

// attachPair attaches an endpoint to each of da and db with cfg, logging
// to t unless cfg says otherwise, and closes them when t ends.
func attachPair(t testing.TB, da, db ntb.Device, cfg Config) (*Endpoint, *Endpoint) {
	t.Helper()
	if cfg.Logf == nil {
		cfg.Logf = t.Logf
	}
	a, err := Attach(da, cfg)
	require.NoError(t, err)
	b, err := Attach(db, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// connPair dials b's listener from a.
func connPair(t testing.TB, a, b *Endpoint, port int) (*Conn, *Conn) {
	t.Helper()
	ln, err := b.Listen(port)
	require.NoError(t, err)
	defer ln.Close()
	accepted := make(chan *Conn, 1)
	go func() {
		c, err := ln.AcceptConn()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c1, err := a.DialContext(ctx, port)
	require.NoError(t, err)
	return c1, <-accepted
}

func forEachBackend(t *testing.T, f func(t *testing.T, backend string)) {
	for _, name := range []string{"ntbtest", "shm"} {
		t.Run(name, func(t *testing.T) { f(t, name) })
	}
}

func TestEcho(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		a, b := endpoints(t, backend, Config{})
		c1, c2 := connPair(t, a, b, 7)
		defer c1.Close()
		defer c2.Close()
		msg := []byte("hello over the bridge")
		_, err := c1.Write(msg)
		require.NoError(t, err)
		got := make([]byte, len(msg))
		_, err = io.ReadFull(c2, got)
		require.NoError(t, err)
		require.Equal(t, msg, got)

		// Larger than the MTU and the window: segmented and flow-controlled.
		big := bytes.Repeat([]byte("0123456789abcdef"), 300000)
		go func() {
			_, err := c2.Write(big)
			if err == nil {
				err = c2.CloseWrite()
			}
			if err != nil {
				t.Error(err)
			}
		}()
		all, err := io.ReadAll(c1)
		require.NoError(t, err)
		require.True(t, bytes.Equal(big, all), "got %d bytes, want %d", len(all), len(big))
	})
}

func TestRefused(t *testing.T) {
	a, _ := endpoints(t, "ntbtest", Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := a.DialContext(ctx, 99)
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	var op *net.OpError
	require.ErrorAs(t, err, &op)
}

func TestCloseSemantics(t *testing.T) {
	a, b := endpoints(t, "ntbtest", Config{})
	c1, c2 := connPair(t, a, b, 8)
	_, err := c1.Write([]byte("last words"))
	require.NoError(t, err)
	require.NoError(t, c1.Close())
	require.ErrorIs(t, c1.Close(), net.ErrClosed)
	_, err = c1.Read(make([]byte, 1))
	require.ErrorIs(t, err, net.ErrClosed)
	got, err := io.ReadAll(c2)
	require.NoError(t, err, "data written before Close arrives, then EOF")
	require.Equal(t, "last words", string(got))
	_, err = c2.Write([]byte("x"))
	require.ErrorIs(t, err, syscall.EPIPE)
	require.NoError(t, c2.Close())
}

func TestNettest(t *testing.T) {
	forEachBackend(t, func(t *testing.T, backend string) {
		a, b := endpoints(t, backend, Config{})
		port := 1000
		nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
			port++
			c1, c2 := connPair(t, a, b, port)
			return c1, c2, func() { c1.Close(); c2.Close() }, nil
		})
	})
}

func TestDeadlineError(t *testing.T) {
	a, b := endpoints(t, "ntbtest", Config{})
	c1, _ := connPair(t, a, b, 11)
	c1.SetReadDeadline(time.Now().Add(10 * time.Millisecond))
	_, err := c1.Read(make([]byte, 1))
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	var ne net.Error
	require.True(t, errors.As(err, &ne) && ne.Timeout())
}

// A Read parked with no deadline waits on its notify channel alone (see
// park): Close, and a deadline set while it waits, must still wake it.
func TestParkedReadWakes(t *testing.T) {
	a, b := endpoints(t, "ntbtest", Config{SpinBudget: -1}) // park at once
	c1, _ := connPair(t, a, b, 12)
	c3, _ := connPair(t, a, b, 13)
	readErr := func(c *Conn) <-chan error {
		ch := make(chan error, 1)
		go func() {
			_, err := c.Read(make([]byte, 1))
			ch <- err
		}()
		require.Eventually(t, func() bool { return c.sleepers.Load() > 0 }, 5*time.Second, time.Millisecond, "the Read should park")
		return ch
	}
	wait := func(ch <-chan error) error {
		select {
		case err := <-ch:
			return err
		case <-time.After(5 * time.Second):
			t.Fatal("the parked Read was not woken")
			return nil
		}
	}

	closed := readErr(c1)
	require.NoError(t, c1.Close())
	require.ErrorIs(t, wait(closed), net.ErrClosed)

	timedOut := readErr(c3)
	require.NoError(t, c3.SetReadDeadline(time.Now().Add(10*time.Millisecond)))
	require.ErrorIs(t, wait(timedOut), os.ErrDeadlineExceeded)
}

func TestSpinYieldConfig(t *testing.T) {
	var cfg Config
	require.NoError(t, cfg.setDefaults())
	require.Equal(t, DefaultSpinYield, cfg.SpinYield)
	cfg = Config{SpinYield: -1}
	require.ErrorContains(t, cfg.setDefaults(), "spin yield")
}

// idlerDevice counts the Idle calls an endpoint makes on its device.
type idlerDevice struct {
	ntb.Device
	idle atomic.Int32
}

func (d *idlerDevice) Idle(on bool) {
	if on {
		d.idle.Add(1)
	} else {
		d.idle.Add(-1)
	}
}

// TestPollerTellsDeviceIdle checks that the poller, asleep on the doorbell,
// tells the device it is idle only while it has nothing to send: the
// fabric then checks the link less often (shm.Device.Idle), which must
// not slow its noticing a dead peer mid-transfer.
func TestPollerTellsDeviceIdle(t *testing.T) {
	da, db := ntbtest.NewPair(1 << 20)
	t.Cleanup(func() { da.Close(); db.Close() })
	dev := &idlerDevice{Device: da}
	a, b := attachPair(t, dev, db, Config{})
	ca, cb := connPair(t, a, b, 1)
	go ca.Read(make([]byte, 1)) // a blocked Read: waiting, not sending
	require.Eventually(t, func() bool { return dev.idle.Load() == 1 }, 10*time.Second, time.Millisecond,
		"an endpoint with nothing to send, asleep on the doorbell, is idle")

	// A writer with more than the window to send, to a reader that does
	// not read: it parks for credit, and the poller sleeps on.
	wrote := make(chan error, 1)
	go func() { _, err := ca.Write(make([]byte, 4<<20)); wrote <- err }()
	require.Eventually(t, func() bool { return a.writersOut.Load() > 0 }, 10*time.Second, time.Millisecond,
		"the writer should park for credit")
	// Watch for a wrong announcement a while.
	for range 50 {
		require.Zero(t, dev.idle.Load(), "an endpoint with bytes to send is not idle")
		time.Sleep(time.Millisecond)
	}
	go io.Copy(io.Discard, cb)
	require.NoError(t, <-wrote)
}

// TestSporadicWaitsSpinShort checks that a connection whose Read waited
// longer than busySpin keeps the short spin budget for its next waits (a
// longer spin would not have bridged the gap), while a fresh one may spin
// long.
func TestSporadicWaitsSpinShort(t *testing.T) {
	da, db := ntbtest.NewPair(1 << 20)
	t.Cleanup(func() { da.Close(); db.Close() })
	a, b := attachPair(t, da, db, Config{})
	ca, cb := connPair(t, a, b, 1)
	require.False(t, cb.sporadic.Load(), "a fresh connection")
	go func() {
		// Once the reader has parked, its wait is made to outlast
		// busySpin: the length of the wait is what is under test.
		for deadline := time.Now().Add(10 * time.Second); cb.sleepers.Load() == 0 && time.Now().Before(deadline); {
			runtime.Gosched()
		}
		time.Sleep(10 * busySpin)
		ca.Write([]byte{1})
	}()
	_, err := io.ReadFull(cb, make([]byte, 1))
	require.NoError(t, err)
	require.True(t, cb.sporadic.Load(), "a Read that waited %v parked past busySpin", 10*busySpin)
	sp := spinner{ep: b, short: cb.sporadic.Load()}
	require.True(t, sp.spin())
	require.Equal(t, int64(b.cfg.SpinBudget), sp.budget, "its next wait spins SpinBudget, not busySpin")
	sp.stop()
}

// TestSpinConnsBound checks Config.SpinConns: a call spins while the
// endpoint has at most that many connections open, and parks at once
// beyond it; an endpoint without the bound spins with any number.
func TestSpinConnsBound(t *testing.T) {
	for _, bound := range []int{0, 1} {
		a, b := endpoints(t, "ntbtest", Config{SpinConns: bound})
		_, cb := connPair(t, a, b, 1)
		sp := spinner{ep: b, c: cb}
		require.True(t, sp.spin(), "one connection open, bound %d", bound)
		sp.stop()
		_, cb2 := connPair(t, a, b, 2)
		sp = spinner{ep: b, c: cb2}
		require.Equal(t, bound == 0, sp.spin(), "two connections open, bound %d", bound)
		sp.stop()
	}
}

// Abort: the peer reads what came before, then an error matching
// syscall.ECONNRESET (not io.EOF, and not a link failure: the link
// serves on); its writes fail; both ends free the connection.
func TestAbortReadsAsReset(t *testing.T) {
	a, b := endpoints(t, "ntbtest", Config{})
	c1, c2 := connPair(t, a, b, 9)
	_, err := c1.Write([]byte("abc"))
	require.NoError(t, err)
	require.NoError(t, c1.Abort())
	require.ErrorIs(t, c1.Abort(), net.ErrClosed)
	got := make([]byte, 3)
	_, err = io.ReadFull(c2, got)
	require.NoError(t, err)
	require.Equal(t, "abc", string(got))
	_, err = c2.Read(got)
	require.ErrorIs(t, err, syscall.ECONNRESET)
	require.NotErrorIs(t, err, ErrLinkDown)
	require.Contains(t, err.Error(), "aborted")
	_, err = c2.Write([]byte("x"))
	require.Error(t, err)
	require.NoError(t, c2.Close())
	require.Eventually(t, func() bool { return a.Conns() == 0 && b.Conns() == 0 }, 30*time.Second, time.Millisecond, "the aborted connection is freed at both ends")
	// The link is fine: a new pair talks over it.
	d1, d2 := connPair(t, a, b, 9)
	defer d1.Close()
	defer d2.Close()
	_, err = d1.Write([]byte("y"))
	require.NoError(t, err)
	_, err = io.ReadFull(d2, got[:1])
	require.NoError(t, err)
}
