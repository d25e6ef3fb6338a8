//go:build integration

package test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/tools/rack"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/socklike"
)

// echoTraffic runs seeded echo rounds on c until stop is called, which
// returns the rounds done and the first error.
type echoTraffic struct {
	rounds atomic.Int64
	stopc  chan struct{}
	done   chan error
}

func startEchoTraffic(c net.Conn) *echoTraffic {
	e := &echoTraffic{stopc: make(chan struct{}), done: make(chan error, 1)}
	go func() {
		for i := uint64(0); ; i++ {
			select {
			case <-e.stopc:
				e.done <- nil
				return
			default:
			}
			if err := echoCheck(c, i, 64<<10); err != nil {
				e.done <- fmt.Errorf("echo round %d: %w", i, err)
				return
			}
			e.rounds.Add(1)
		}
	}()
	return e
}

// progress waits until n more rounds went through, failing on an error.
func (e *echoTraffic) progress(t *testing.T, n int64, what string) {
	t.Helper()
	want := e.rounds.Load() + n
	var err error
	stopped := false
	progressed := waitfor.Until(func() bool {
		select {
		case err = <-e.done:
			stopped = true
			return true
		default:
		}
		return e.rounds.Load() >= want
	})
	require.NoError(t, err, "traffic %s", what)
	require.False(t, stopped, "traffic stopped %s", what)
	require.True(t, progressed, "no traffic %s for %v", what, waitfor.Timeout)
}

func (e *echoTraffic) stop() error {
	close(e.stopc)
	return <-e.done
}

// linkMemfd is the descriptor through which pid maps link's memory, as
// any process allowed to open its descriptors reaches it.
func linkMemfd(t *testing.T, pid int, link string) string {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range ents {
		target, err := os.Readlink(filepath.Join(dir, e.Name()))
		if err == nil && strings.HasPrefix(target, "/memfd:ntstack-"+link+" ") {
			return filepath.Join(dir, e.Name())
		}
	}
	t.Fatalf("pid %d maps no memfd of link %s", pid, link)
	return ""
}

// logHas reports whether h's daemon log has a line with every one of subs.
func logHas(h *rack.Host, daemon string, subs ...string) bool {
	b, err := os.ReadFile(h.LogPath(daemon))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			return true
		}
	}
	return false
}

// logLines are the lines of h's daemon log that hold sub.
func logLines(h *rack.Host, daemon, sub string) []string {
	b, _ := os.ReadFile(h.LogPath(daemon))
	var lines []string
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, sub) {
			lines = append(lines, line)
		}
	}
	return lines
}

func linkState(t *testing.T, h *rack.Host) string {
	t.Helper()
	s := snapshot(t, h)
	if len(s.Links) != 1 {
		return fmt.Sprintf("%d links", len(s.Links))
	}
	return s.Links[0].State
}

// TestRackLinkFileTampering: the link between a and b cannot be truncated
// under the proxies — not at its path, which holds no memory, nor through
// /proc, where its memory is a sealed memfd — and its files removed during
// traffic are put back and logged, with both daemons up and the traffic
// flowing. A proxy that restarts after the removal finds its peer's
// memory: the link comes back up and new connections take it.
func TestRackLinkFileTampering(t *testing.T) {
	r := startRack(t, rack.Spec{Hosts: []string{"a", "b"}})
	a, b := r.Host("a"), r.Host("b")
	link := a.Config.Peers[0].Link
	path := filepath.Join(r.FabricDir(), link)
	srv := attachTo(t, b)
	ln, err := (&socklike.ListenConfig{Proxy: srv}).Listen(context.Background(), "tcp", ":7200")
	require.NoError(t, err)
	defer ln.Close()
	go serveEcho(ln)
	cli := attachTo(t, a)
	c, err := (&socklike.Dialer{Proxy: cli}).Dial("tcp", "b:7200")
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, ctlapi.PathNTB, c.(*socklike.Conn).Route().Path)
	traffic := startEchoTraffic(c)
	traffic.progress(t, 10, "before the tampering")
	pids := map[string]int{"a": r.Pid("a", "ntproxy"), "b": r.Pid("b", "ntproxy")}

	// Truncation: the file at the link's path is a lock file; the memory
	// refuses, on both hosts.
	require.NoError(t, os.Truncate(path, 0))
	for _, h := range []string{"a", "b"} {
		fd := linkMemfd(t, pids[h], link)
		f, err := os.OpenFile(fd, os.O_RDWR, 0)
		require.NoError(t, err)
		err = f.Truncate(0)
		f.Close()
		require.ErrorIs(t, err, syscall.EPERM, "truncating %s's link memory (%s)", h, fd)
	}
	traffic.progress(t, 20, "after the truncation attempts")

	// Removal: every file of the link, during traffic.
	require.NoError(t, shm.Remove(r.FabricDir(), link))
	for _, h := range []*rack.Host{a, b} {
		require.Eventually(t, func() bool { return logHas(h, "ntproxy", "link "+link, "link socket", "removed; serving") },
			10*time.Second, 10*time.Millisecond, "%s's ntproxy logs the removal", h.Name)
	}
	traffic.progress(t, 20, "after the removal")
	require.NoError(t, traffic.stop())
	for h, pid := range pids {
		require.Equal(t, pid, r.Pid(h, "ntproxy"), "%s's ntproxy still runs, the same process", h)
	}
	require.Equal(t, "up", linkState(t, a))
	require.Equal(t, "up", linkState(t, b))
	c.Close()
	for _, h := range []*rack.Host{a, b} {
		t.Logf("%s's ntproxy:\n%s", h.Name, strings.Join(logLines(h, "ntproxy", "link "+link+": "+link), "\n"))
	}

	// b's ntproxy restarts: it meets a's over the files a put back.
	require.NoError(t, r.Restart("b", "ntproxy"))
	require.Eventually(t, func() bool { return linkState(t, a) == "up" && linkState(t, b) == "up" },
		20*time.Second, 10*time.Millisecond, "the link comes back up after b's ntproxy restarts")
	require.True(t, logHas(b, "ntproxy", "attached to the link memory side 0 serves"), "b's restarted ntproxy joins a's memory")
	srv2 := attachTo(t, b)
	ln2, err := (&socklike.ListenConfig{Proxy: srv2}).Listen(context.Background(), "tcp", ":7201")
	require.NoError(t, err)
	defer ln2.Close()
	go serveEcho(ln2)
	require.Eventually(t, func() bool {
		c, err := (&socklike.Dialer{Proxy: cli}).Dial("tcp", "b:7201")
		if err != nil {
			return false
		}
		defer c.Close()
		return c.(*socklike.Conn).Route().Path == ctlapi.PathNTB && echoCheck(c, 99, 64<<10) == nil
	}, 20*time.Second, 10*time.Millisecond, "new connections take the link again")
}

// TestRackRouteFollowsLink: with the NTB link down and the control session
// up, a new dial takes the TCP fallback within a second and says why; with
// the control session cut and the NTB link up, it still takes the NTB.
func TestRackRouteFollowsLink(t *testing.T) {
	r := startRack(t, rack.Spec{Hosts: []string{"a", "b"}, Configure: func(c *config.Config) {
		c.Monitor.PeerTimeout.Duration = time.Second
	}})
	a, b := r.Host("a"), r.Host("b")
	link := a.Config.Peers[0].Link
	srv := attachTo(t, b)
	ln, err := (&socklike.ListenConfig{Proxy: srv}).Listen(context.Background(), "tcp", ":7300")
	require.NoError(t, err)
	defer ln.Close()
	go serveEcho(ln)
	cli := attachTo(t, a)
	dial := func() (socklike.Route, time.Duration, error) {
		start := time.Now()
		c, err := (&socklike.Dialer{Proxy: cli}).Dial("tcp", "b:7300")
		took := time.Since(start)
		if err != nil {
			return socklike.Route{}, took, err
		}
		defer c.Close()
		return c.(*socklike.Conn).Route(), took, echoCheck(c, 1, 4096)
	}
	rt, _, err := dial()
	require.NoError(t, err)
	require.Equal(t, ctlapi.PathNTB, rt.Path)

	// The NTB link down, the control session up.
	admin := ctlapi.NewClient(a.Config.Path(config.AdminSocket))
	defer admin.Close()
	require.NoError(t, admin.Call(context.Background(), ctlapi.PathFault, ctlapi.FaultRequest{Link: link, Down: true}, nil))
	require.Eventually(t, func() bool { return linkState(t, a) == "down" }, 10*time.Second, time.Millisecond)
	rt, took, err := dial()
	require.NoError(t, err)
	t.Logf("dial with the link down: %v over %s: %s", took, rt.Path, rt.Reason)
	require.Equal(t, ctlapi.PathTCP, rt.Path)
	require.Contains(t, rt.Reason, "NTB link "+link+" down (forced down)")
	require.Less(t, took, time.Second, "a dial with the NTB link down must take the fallback within 1 s (requirement)")
	st, err := status(a)
	require.NoError(t, err)
	require.True(t, st.Peers[0].Up, "the control session stayed up")
	require.True(t, logHas(a, "ntproxy", "NTB link "+link+" down (forced down): TCP"), "a's ntproxy logs the fallback and why")

	require.NoError(t, admin.Call(context.Background(), ctlapi.PathFault, ctlapi.FaultRequest{Link: link, Down: false}, nil))
	require.Eventually(t, func() bool { return linkState(t, a) == "up" && linkState(t, b) == "up" }, 10*time.Second, time.Millisecond)

	// The control session cut (a's packets to and from the control port
	// refused), the NTB link up.
	port := strconv.Itoa(rack.ControlPort)
	for _, dir := range []string{"dport", "sport"} {
		if out, err := r.Exec("a", "ip", "rule", "add", "ipproto", "tcp", dir, port, "prohibit").CombinedOutput(); err != nil {
			t.Skipf("this kernel or ip refuses policy rules with port selectors (Linux 4.17+), which cut the control session alone: %v: %s", err, out)
		}
	}
	require.Eventually(t, func() bool {
		st, err := status(a)
		return err == nil && !st.Peers[0].Up
	}, 20*time.Second, 10*time.Millisecond, "a's control session to b never went down")
	rt, took, err = dial()
	require.NoError(t, err)
	t.Logf("dial with the control session cut: %v over %s: %s", took, rt.Path, rt.Reason)
	require.Equal(t, ctlapi.PathNTB, rt.Path, "the NTB link is up: the route keeps it")
	require.Contains(t, rt.Reason, "control plane down since")
}
