package proxy

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/socklike"
)

// quota.memory bounds the memory links and direct links of one user's
// applications together: an attach or a direct dial over it is refused
// with a quota error naming the key, and the memory comes back with the
// connection.
func TestUIDMemoryQuota(t *testing.T) {
	const appWindow, directWindow = 2 << 20, 1 << 20
	quota := 2*linkBytes(appWindow) + linkBytes(directWindow)
	r := newRackWith(t, func(cfg *config.Config, o *Options) {
		o.Logf = t.Logf
		if cfg.Host == "a" {
			cfg.Quota.UID = []config.UIDQuota{{UID: os.Getuid(), Memory: quota}}
		}
	}, "", "direct_window = 1048576")
	srv := attach(t, r.cb)
	ln, err := (&socklike.ListenConfig{Proxy: srv}).Listen(context.Background(), "tcp", ":80")
	require.NoError(t, err)
	defer ln.Close()
	go echo(ln)
	ln2, err := (&socklike.ListenConfig{Proxy: srv}).Listen(context.Background(), "tcp", ":81")
	require.NoError(t, err)
	defer ln2.Close()
	go echo(ln2)

	app1 := attachWith(t, r.ca, socklike.Config{DirectIdle: -1}) // a link closes with its connection
	direct := &socklike.Dialer{Proxy: app1, Direct: true}
	c, err := direct.Dial("tcp", "b:80")
	require.NoError(t, err)
	require.Equal(t, "direct", c.(*socklike.Conn).Route().Mode)
	roundTrip(t, c, 1, 1000)
	app2 := attach(t, r.ca) // exactly the quota now
	_ = app2
	// Over the quota a direct dial that needs a link of its own (another
	// address) settles for the proxies and says why.
	pc, err := direct.Dial("tcp", "b:81")
	require.NoError(t, err)
	route := pc.(*socklike.Conn).Route()
	require.Equal(t, "proxy", route.Mode)
	require.Contains(t, route.Reason, "quota.memory")
	pc.Close()
	_, err = socklike.AttachProxy(r.ca.Path(config.ProxySocket), socklike.Config{})
	require.ErrorContains(t, err, "quota.memory")

	// The direct link's memory comes back once its lease ends.
	c.Close()
	require.Eventually(t, func() bool {
		c, err := direct.Dial("tcp", "b:80")
		if err != nil {
			return false
		}
		defer c.Close()
		if c.(*socklike.Conn).Route().Mode != "direct" {
			return false
		}
		roundTrip(t, c, 2, 1000)
		return true
	}, 20*time.Second, 10*time.Millisecond)
	var mem int64
	for _, a := range r.a.Snapshot().Apps {
		mem += a.Memory
	}
	require.LessOrEqual(t, mem, quota)
}

// StaticControl gives ports below 1024 to root or CAP_NET_BIND_SERVICE
// only, as ntmon does.
func TestStaticControlPrivilegedPorts(t *testing.T) {
	sc := &StaticControl{Config: &config.Config{Host: "a"}}
	gone := exec.Command("true")
	require.NoError(t, gone.Run())
	_, err := sc.Reserve(context.Background(), ctlapi.ListenRequest{UID: 65534, PID: gone.Process.Pid, Port: 22})
	require.Equal(t, ctlapi.CodeDenied, ctlapi.CodeOf(err))
	p, err := sc.Reserve(context.Background(), ctlapi.ListenRequest{UID: 0, PID: 1, Port: 22})
	require.NoError(t, err)
	require.Equal(t, 22, p)
	p, err = sc.Reserve(context.Background(), ctlapi.ListenRequest{UID: 65534, PID: gone.Process.Pid, Port: 1024})
	require.NoError(t, err)
	require.Equal(t, 1024, p)
}
