package gateway

import (
	"context"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// flakyListener is a TCP listener whose first Accepts fail as a process
// out of descriptors sees them fail.
type flakyListener struct {
	net.Listener
	mu    sync.Mutex
	fails int
}

func (l *flakyListener) Accept() (net.Conn, error) {
	l.mu.Lock()
	if l.fails > 0 {
		l.fails--
		l.mu.Unlock()
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	l.mu.Unlock()
	return l.Listener.Accept()
}

// A service's accept loop outlives accept errors: it backs off, logs and
// carries the next connection.
func TestServeSurvivesAcceptErrors(t *testing.T) {
	target, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer target.Close()
	go func() {
		for {
			c, err := target.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); io.Copy(c, c) }()
		}
	}()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ln := &flakyListener{Listener: inner, fails: 5}
	var mu sync.Mutex
	logged := 0
	g := &Gateway{cfg: &config.Config{}, conns: map[*carried]struct{}{}, logf: func(f string, a ...any) {
		mu.Lock()
		logged++
		mu.Unlock()
		t.Logf(f, a...)
	}}
	svc := &service{stat: ctlapi.GatewayStat{Kind: "export", Listen: ":7000", To: target.Addr().String()}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.serve(ctx, ln, svc) }()

	c, err := net.Dial("tcp", inner.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write([]byte("ping"))
	require.NoError(t, err)
	buf := make([]byte, 4)
	_, err = io.ReadFull(c, buf)
	require.NoError(t, err)
	require.Equal(t, "ping", string(buf))
	mu.Lock()
	require.GreaterOrEqual(t, logged, 3, "the accept errors are logged")
	mu.Unlock()

	cancel()
	inner.Close()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not end when its listener closed")
	}
	c.Close()
	g.wg.Wait()
}
