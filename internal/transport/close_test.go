package transport

import (
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/ntb/ntbtest"
)

// heldDevice is a device whose Close, which an owning Endpoint's Close
// calls once its pollers have ended, waits for release.
type heldDevice struct {
	*ntbtest.Device
	entered chan struct{} // closed when Close is entered
	release chan struct{} // Close goes on once this closes
	closed  atomic.Bool   // the device is closed
}

func (d *heldDevice) Close() error {
	close(d.entered)
	<-d.release
	err := d.Device.Close()
	d.closed.Store(true)
	return err
}

// blockedInClose reports whether a goroutine waits on a channel in
// Endpoint.Close itself (not in a call Close made).
func blockedInClose() bool {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	for _, g := range strings.Split(string(buf), "\n\n") {
		lines := strings.Split(g, "\n")
		if len(lines) > 1 && strings.Contains(lines[0], "[chan receive") &&
			strings.HasPrefix(lines[1], "github.com/ntstack/ntstack/internal/transport.(*Endpoint).Close(") {
			return true
		}
	}
	return false
}

// Two Closes at once: the second, started while the first is under way,
// returns only once the endpoint is fully closed, as the first does — its
// pollers ended and its device closed — and returns nil.
func TestConcurrentClose(t *testing.T) {
	da, db := ntbtest.NewPair(64 << 10)
	dev := &heldDevice{Device: db, entered: make(chan struct{}), release: make(chan struct{})}
	ea, err := Attach(da, Config{Logf: t.Logf})
	require.NoError(t, err)
	defer da.Close()
	defer ea.Close()
	eb, err := Attach(dev, Config{Logf: t.Logf})
	require.NoError(t, err)
	eb.TakeDevice()
	ln, err := eb.Listen(7)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := ea.DialContext(ctx, 7)
	require.NoError(t, err)
	defer c.Close()
	s, err := ln.Accept()
	require.NoError(t, err)
	defer s.Close()

	type result struct {
		err       error
		devClosed bool
	}
	closeOne := func(out chan<- result) {
		err := eb.Close()
		out <- result{err, dev.closed.Load()}
	}
	first, second := make(chan result, 1), make(chan result, 1)
	go closeOne(first)
	<-dev.entered // the first Close has ended the pollers and closes the device
	go closeOne(second)
	waitfor.True(t, "the second Close waits in Close", func() bool {
		select {
		case r := <-second:
			t.Fatalf("the second Close returned (%v) while the first was still closing the device", r.err)
		default:
		}
		return blockedInClose()
	})
	close(dev.release)
	r1, r2 := <-first, <-second
	require.NoError(t, r1.err)
	require.True(t, r1.devClosed, "the first Close returned before its device closed")
	require.NoError(t, r2.err, "a Close after the first returns nil")
	require.True(t, r2.devClosed, "the second Close returned before the device closed")
	require.NoError(t, eb.Close(), "a Close after both")
	_, err = s.Write([]byte{1})
	require.Error(t, err, "a connection of the closed endpoint")
}
