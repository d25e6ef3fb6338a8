package proxy

import (
	"context"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/socklike"
)

// A direct dial's application attaches its end of the link on the early
// grant, before the far side is asked; a far side that refuses fails the
// dial with its answer, and the grant, the link and its files go.
func TestDirectRefusedAfterGrant(t *testing.T) {
	r := newRack(t, "")
	srvB := attach(t, r.cb)
	ln, err := (&socklike.ListenConfig{Proxy: srvB}).Listen(context.Background(), "tcp", ":80")
	require.NoError(t, err)
	defer ln.Close()
	go echo(ln)
	client := attach(t, r.ca)
	memory := func(s *Server) (m int64) {
		for _, a := range s.Snapshot().Apps {
			m += a.Memory
		}
		return m
	}
	baseA, baseB := memory(r.a), memory(r.b)
	d := &socklike.Dialer{Proxy: client, Direct: true}
	for range 3 {
		_, err := d.DialContext(context.Background(), "tcp", "b:99") // nobody listens there
		require.ErrorIs(t, err, syscall.ECONNREFUSED)
		require.Contains(t, err.Error(), "nobody listens on b:99")
	}
	require.Eventually(t, func() bool {
		files, _ := filepath.Glob(filepath.Join(r.ca.Proxy.FabricDir, directPrefix+"*"))
		return memory(r.a) == baseA && memory(r.b) == baseB && len(r.a.Snapshot().Conns) == 0 && len(files) == 0
	}, 5*time.Second, 10*time.Millisecond, "a refused direct dial leaves no grant, connection or link file")
	// The same Dialer then dials a listener directly.
	c, err := d.DialContext(context.Background(), "tcp", "b:80")
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, "direct", c.(*socklike.Conn).Route().Mode)
	roundTrip(t, c, 1, 4096)
}
