package partition

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/ntb/ntbtest"
	"github.com/ntstack/ntstack/ntb/shm"
)

// The handshake runs on events, not timers: over an emulated link whose
// ends beat once an hour, with an hour between hellos, a session is
// established as soon as the second end attaches — the arrival brings
// the link up at both ends, and every handshake step wakes the other
// side through its doorbell.
func TestHandshakeWithoutTimers(t *testing.T) {
	dir := filepath.Join("/dev/shm", fmt.Sprintf("ntstack-partition-test-%d", os.Getpid()))
	require.NoError(t, os.MkdirAll(dir, 0o700))
	t.Cleanup(func() { os.RemoveAll(dir) })
	o := shm.Options{Dir: dir, WindowSize: 1 << 20, HeartbeatInterval: time.Hour, HeartbeatTimeout: 2 * time.Hour, SilentTimeout: 3 * time.Hour}
	cfg := Config{HelloTimeout: time.Hour, Logf: t.Logf}
	sa, sb := make(sessions, 4), make(sessions, 4)

	da, err := shm.Open("l", o)
	require.NoError(t, err)
	defer da.Close()
	cfg.OnSession = func(s *Session) { sa <- s }
	la, err := Open(da, cfg)
	require.NoError(t, err)
	defer la.Close()

	db, err := shm.Open("l", o)
	require.NoError(t, err)
	defer db.Close()
	cfg.OnSession = func(s *Session) { sb <- s }
	lb, err := Open(db, cfg)
	require.NoError(t, err)
	defer lb.Close()

	wait := func(ch sessions) *Session {
		select {
		case s := <-ch:
			return s
		case <-time.After(ntbtest.LivenessTimeout):
			t.Fatal("no session established without timers")
			return nil
		}
	}
	a, b := wait(sa), wait(sb)
	require.Equal(t, a.Epoch, b.Epoch)
	exchange(t, a, b)
}

// BenchmarkSessionOpen is the time to open an embedded link: both ends of
// an emulated link attached, the link up at both, and the session
// handshake done at both.
func BenchmarkSessionOpen(b *testing.B) {
	dir := filepath.Join("/dev/shm", fmt.Sprintf("ntstack-partition-bench-%d", os.Getpid()))
	require.NoError(b, os.MkdirAll(dir, 0o700))
	b.Cleanup(func() { os.RemoveAll(dir) })
	o := shm.Options{Dir: dir, WindowSize: 1 << 20}
	for b.Loop() {
		sa, sb := make(sessions, 4), make(sessions, 4)
		da, err := shm.Open("l", o)
		require.NoError(b, err)
		la, err := Open(da, Config{OnSession: func(s *Session) { sa <- s }})
		require.NoError(b, err)
		db, err := shm.Open("l", o)
		require.NoError(b, err)
		lb, err := Open(db, Config{OnSession: func(s *Session) { sb <- s }})
		require.NoError(b, err)
		<-sa
		<-sb
		la.Close()
		lb.Close()
		da.Close()
		db.Close()
	}
}
