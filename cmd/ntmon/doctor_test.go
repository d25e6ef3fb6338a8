package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/daemon/doctor"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// fakeMonitor serves st as ntmon's status API on path.
func fakeMonitor(t *testing.T, path string, st ctlapi.Status) {
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { ctlapi.Reply(w, st, nil) })}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
}

// withDoctorRoot points ntmon doctor at an empty tree: no /sys, /proc or
// /dev, which yields warnings and skips but no failure.
func withDoctorRoot(t *testing.T) {
	old := doctorRoot
	doctorRoot = t.TempDir()
	t.Cleanup(func() { doctorRoot = old })
}

func TestDoctor(t *testing.T) {
	withDoctorRoot(t)
	dir := stateDir(t)
	cfgPath := writeConfig(t, dir)
	sock := dir + "/" + config.MonitorSocket
	peer := ctlapi.PeerStatus{Host: "b", Control: "127.0.0.1:1", Up: true, Why: "up since 11:19:45", Link: "rack-a-b"}
	link := ctlapi.LinkStat{Name: "rack-a-b", Peer: "b", State: "up", Window: 16 << 20}

	t.Run("up", func(t *testing.T) {
		fakeMonitor(t, sock, ctlapi.Status{Host: "a", Peers: []ctlapi.PeerStatus{peer},
			Proxy: &ctlapi.Snapshot{Links: []ctlapi.LinkStat{link}}})
		var out, errOut bytes.Buffer
		code := run(context.Background(), []string{"doctor", "-config", cfgPath}, &out, &errOut)
		require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out.String(), errOut.String())
		require.Contains(t, out.String(), "PASS    peer b up")
		require.Contains(t, out.String(), "PASS    NTB link rack-a-b to b up")
		require.Contains(t, out.String(), " 0 failed, ")
	})
	t.Run("peer down", func(t *testing.T) {
		down, downLink := peer, link
		down.Up, down.Why = false, "down since 11:20:01: dial 127.0.0.1:1: connection refused"
		downLink.State = "down"
		fakeMonitor(t, sock, ctlapi.Status{Host: "a", Peers: []ctlapi.PeerStatus{down},
			Proxy: &ctlapi.Snapshot{Links: []ctlapi.LinkStat{downLink}}})
		var out, errOut bytes.Buffer
		code := run(context.Background(), []string{"doctor", "-config", cfgPath, "-json"}, &out, &errOut)
		require.Equal(t, 1, code, errOut.String())
		var rs []doctor.Result
		require.NoError(t, json.Unmarshal(out.Bytes(), &rs))
		var failed []string
		for _, r := range rs {
			if r.Status == doctor.Fail {
				failed = append(failed, r.Name+": "+r.Detail)
			}
		}
		require.Equal(t, []string{
			"peer b: peer b down (control 127.0.0.1:1): " + down.Why,
			"link rack-a-b: NTB link rack-a-b to b down: " + down.Why,
		}, failed)
	})
	t.Run("ntmon not running", func(t *testing.T) {
		var out, errOut bytes.Buffer
		code := run(context.Background(), []string{"doctor", "-config", cfgPath}, &out, &errOut)
		require.Equal(t, 1, code)
		require.Contains(t, out.String(), "FAIL    ntmon not running at "+sock)
		require.Contains(t, out.String(), "fix: systemctl start ntmon")
	})
}

func TestDoctorUsage(t *testing.T) {
	withDoctorRoot(t)
	var out, errOut bytes.Buffer
	require.Equal(t, 2, run(context.Background(), []string{"doctor", "extra"}, &out, &errOut))
	require.Contains(t, errOut.String(), "usage: ntmon doctor")
	errOut.Reset()
	require.Equal(t, 1, run(context.Background(), []string{"doctor", "-config", "/nonexistent/host.toml"}, &out, &errOut))
	require.Contains(t, errOut.String(), "ntmon doctor: load config:")
}
