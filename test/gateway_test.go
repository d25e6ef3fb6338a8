//go:build integration

package test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/tools/rack"
	"github.com/ntstack/ntstack/internal/tools/rackdemo"
)

// TestRackGateway drives unmodified programs through ntproxy's TCP
// gateway on a 2-host rack: redis-server and nginx on b; redis-cli,
// redis-benchmark and wrk on a, through a's forwards and b's exports (the
// NTB link between them), then straight over the rack's TCP network for
// comparison. Then redis-cli and curl, started in a cgroup that a's eBPF
// redirect watches, dial b's rack address itself and land on the gateway.
// The gateway's counters on both hosts prove the traffic crossed the
// fabric, and the redirect's that the connects were rewritten.
func TestRackGateway(t *testing.T) {
	cg := newCgroup(t)
	mode := os.Getenv("NTSTACK_GATEWAY_MODE")
	configure := rackdemo.GatewayConfigure("a", "b", mode)
	r := startRack(t, rack.Spec{Hosts: []string{"a", "b"}, Configure: func(c *config.Config) {
		configure(c)
		if c.Host == "a" {
			c.Gateway.RedirectCgroup = cg.Name()
		}
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Then: unmodified clients dialing b's rack address from inside the
	// cgroup.
	then := func(ctx context.Context) error {
		inCgroup := func(name string, args ...string) string {
			cmd := r.ExecContext(ctx, "a", name, args...)
			cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(cg.Fd())
			b, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s: %s", name, b)
			return strings.TrimSpace(string(b))
		}
		addr := r.Host("b").Address
		require.Equal(t, "carried", inCgroup("redis-cli", "-h", addr, "-p", strconv.Itoa(rackdemo.RedisRackPort), "GET", "ntstack:gateway"))
		url := fmt.Sprintf("http://%s:%d/4k", addr, rackdemo.HTTPRackPort)
		require.Equal(t, "4096", inCgroup("curl", "-sS", "-o", "/dev/null", "-w", "%{size_download}", url))
		return nil
	}
	rows, err := rackdemo.RunGateway(ctx, r, rackdemo.GatewayOptions{Client: "a", Server: "b", Requests: 10000, WrkTime: time.Second, Then: then})
	var out testWriter
	rackdemo.PrintGateway(&out, rows)
	t.Logf("\n%s", out)
	require.NoError(t, err)
	require.Len(t, rows, 8) // SET, GET, GET /4k, GET /1m; through the gateway and over TCP
	for _, row := range rows {
		require.Positive(t, row.Rate, "%s %s over %s", row.Tool, row.Test, row.Path)
	}

	trunked := mode == "" || mode == config.GatewayTrunk
	for host, kind := range map[string]string{"a": "forward", "b": "export"} {
		st, err := status(r.Host(host))
		require.NoError(t, err)
		require.NotNil(t, st.Proxy, "%s: ntproxy snapshot", host)
		require.Len(t, st.Proxy.Gateway, 2, "%s: gateway services", host)
		if trunked {
			// One trunk between the two gateways, opened by a's forwards.
			require.Len(t, st.Proxy.Trunks, 1, "%s: trunks", host)
			tr := st.Proxy.Trunks[0]
			require.Equal(t, map[string]string{"a": "opened", "b": "served"}[host], tr.Role, "%s: %+v", host, tr)
			require.Equal(t, "up", tr.State, "%s: %+v", host, tr)
			require.ElementsMatch(t, []int{rackdemo.RedisRackPort, rackdemo.HTTPRackPort}, tr.Ports, "%s: %+v", host, tr)
		}
		for _, g := range st.Proxy.Gateway {
			require.Equal(t, kind, g.Kind)
			// redis-cli and redis-benchmark's clients; wrk's clients.
			require.GreaterOrEqual(t, g.Total, int64(8), "%s %s %s", host, g.Kind, g.Listen)
			require.Zero(t, g.Failed, "%s %s %s: %s", host, g.Kind, g.Listen, g.LastError)
			require.Positive(t, g.BytesIn, "%s %s", host, g.Listen)
			require.Positive(t, g.BytesOut, "%s %s", host, g.Listen)
			if kind == "forward" {
				require.Equal(t, uint64(1), g.Redirects, "%s %s: connects redirected", host, g.Listen)
			}
		}
	}
}

// TestRackGatewayProcess: ntproxy serves its gateway from a child process
// that lives and dies with it. a's ntproxy killed alone (not its process
// group) takes its gateway process along; b's gateway process killed ends
// b's ntproxy, with the gateway process's status in its log.
func TestRackGatewayProcess(t *testing.T) {
	r := startRack(t, rack.Spec{Hosts: []string{"a", "b"}, Configure: rackdemo.GatewayConfigure("a", "b", "")})
	gwA, gwB := gatewayProcess(t, r, "a"), gatewayProcess(t, r, "b")

	require.NoError(t, syscall.Kill(r.Pid("a", "ntproxy"), syscall.SIGKILL))
	waitfor.True(t, "a's gateway process gone with a's ntproxy", func() bool { return exited(gwA) })

	require.NoError(t, syscall.Kill(gwB, syscall.SIGKILL))
	waitfor.True(t, "b's ntproxy ended with its gateway process", func() bool { return r.Pid("b", "ntproxy") == 0 })
	log, err := os.ReadFile(r.Host("b").LogPath("ntproxy"))
	require.NoError(t, err)
	t.Logf("b's ntproxy log ends:\n%s", lastLines(string(log), 4))
	require.Regexp(t, fmt.Sprintf(`ntproxy: gateway process \(pid %d\): signal: killed`, gwB), string(log))
}

// gatewayProcess returns the pid of the gateway process of host's ntproxy:
// its one child, `ntproxy -gateway`.
func gatewayProcess(t *testing.T, r *rack.Rack, host string) int {
	t.Helper()
	pid := r.Pid(host, "ntproxy")
	require.NotZero(t, pid, "%s's ntproxy runs", host)
	var kids []string
	waitfor.True(t, host+"'s gateway process started", func() bool {
		kids = nil
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		for _, task := range tasks {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/children", pid, task.Name()))
			kids = append(kids, strings.Fields(string(b))...)
		}
		return len(kids) > 0
	})
	require.Len(t, kids, 1, "%s's ntproxy's children", host)
	kid, err := strconv.Atoi(kids[0])
	require.NoError(t, err)
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", kid))
	require.NoError(t, err)
	require.Contains(t, strings.Split(string(cmdline), "\x00"), "-gateway", "%s's ntproxy's child %d", host, kid)
	return kid
}

// exited reports whether pid has exited (gone, or a zombie not yet reaped).
func exited(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(b), ')')
	return i < 0 || strings.HasPrefix(strings.TrimSpace(string(b[i+1:])), "Z")
}

// newCgroup creates a cgroup2 directory for the test's redirected clients
// and removes it when the test ends. The hierarchy is mounted again under
// a temporary directory: `ip netns exec`, which starts the rack's daemons,
// mounts a fresh /sys, without /sys/fs/cgroup.
func newCgroup(t *testing.T) *os.File {
	t.Helper()
	mnt := t.TempDir()
	if err := syscall.Mount("ntstack-test", mnt, "cgroup2", 0, ""); err != nil {
		t.Skipf("mount cgroup2 (the eBPF redirect attaches to a cgroup2 directory): %v", err)
	}
	path, err := os.MkdirTemp(mnt, "ntstack-test-")
	require.NoError(t, err)
	dir, err := os.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() {
		dir.Close()
		// Reaped clients may still be leaving the cgroup for a moment.
		require.Eventually(t, func() bool {
			err := os.Remove(path)
			return err == nil || !errors.Is(err, syscall.EBUSY)
		}, 5*time.Second, 10*time.Millisecond)
		require.NoError(t, syscall.Unmount(mnt, 0))
	})
	return dir
}
