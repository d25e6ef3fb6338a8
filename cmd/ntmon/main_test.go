package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/daemon/monitor"
	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// stateDir is short: Unix socket paths are limited to 108 bytes.
func stateDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "ntmon")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// writeConfig writes a host config for host a with peer b (whose control
// port refuses) into dir and returns its path.
func writeConfig(t *testing.T, dir string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	peerAddr := ln.Addr().String()
	require.NoError(t, ln.Close())
	keyA := filepath.Join(dir, "a.key")
	_ = keygen(t, "a", keyA)
	pinB := keygen(t, "b", filepath.Join(dir, "b.key"))
	text := fmt.Sprintf(`host = "a"
state_dir = %q
[auth]
key = %q
[monitor]
listen = "127.0.0.1:0"
heartbeat = "50ms"
peer_timeout = "500ms"
[[peers]]
host = "b"
control = %q
link = "rack-a-b"
fallback = "127.0.0.1:7480"
key = %q
`, dir, keyA, peerAddr, pinB)
	p := filepath.Join(dir, "a.toml")
	require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
	return p
}

// keygen runs `ntmon keygen` for host into path and returns the pin it
// prints for the peers' configurations.
func keygen(t *testing.T, host, path string) string {
	t.Helper()
	var out, errb bytes.Buffer
	require.Equal(t, 0, run(context.Background(), []string{"keygen", "-host", host, "-out", path}, &out, &errb), errb.String())
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	m := regexp.MustCompile(`(?m)^  key = "(ed25519:[A-Za-z0-9+/=]+)"$`).FindStringSubmatch(out.String())
	require.NotNil(t, m, out.String())
	// A second run never overwrites the key.
	require.Equal(t, 1, run(context.Background(), []string{"keygen", "-host", host, "-out", path}, &out, &errb))
	return m[1]
}

// fakeProxy serves snap as ntproxy's admin API would.
func fakeProxy(t *testing.T, path string, snap ctlapi.Snapshot) {
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { ctlapi.Reply(w, snap, nil) })}
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

func TestDaemonAndStatus(t *testing.T) {
	dir := stateDir(t)
	cfgPath := writeConfig(t, dir)
	fakeProxy(t, filepath.Join(dir, config.AdminSocket), ctlapi.Snapshot{
		Host:  "a",
		Links: []ctlapi.LinkStat{{Name: "rack-a-b", Peer: "b", State: "up", Window: 1 << 20, Partitions: []ctlapi.PartitionStat{{Index: 0, Conns: 1, BytesTX: 100, BytesRX: 200}}}},
		Apps:  []ctlapi.AppStat{{ID: 7, PID: 1234, UID: 1000, Name: "kv", Conns: 1}},
		Conns: []ctlapi.ConnStat{{ID: 9, App: 7, Local: "a:49152", Remote: "b:6379", Dir: "out", Path: "ntb",
			Reason: "rack peer b over NTB link rack-a-b", Link: "rack-a-b", BytesTX: 100, BytesRX: 200}},
	})

	ctx, cancel := context.WithCancel(context.Background())
	var stderr syncBuffer
	exit := make(chan int, 1)
	go func() { exit <- run(ctx, []string{"-config", cfgPath}, &bytes.Buffer{}, &stderr) }()
	defer func() {
		cancel()
		select {
		case code := <-exit:
			require.Equal(t, 0, code, "stderr: %s", stderr.String())
		case <-time.After(15 * time.Second):
			t.Fatal("ntmon did not stop on cancel")
		}
	}()

	// Poll until the daemon answers.
	var out, errOut bytes.Buffer
	if !waitfor.Until(func() bool {
		out.Reset()
		errOut.Reset()
		return run(context.Background(), []string{"status", "-config", cfgPath}, &out, &errOut) == 0
	}) {
		t.Fatalf("status never worked: %s", errOut.String())
	}
	text := out.String()
	for _, want := range []string{"CONNECTIONS", "ID", "APP", "LOCAL", "REMOTE", "DIR", "PATH", "REASON", "BYTES-TX", "BYTES-RX",
		"kv[7]", "b:6379", "ntb(rack-a-b/0)", "rack peer b over NTB link rack-a-b", "PEERS", "never up"} {
		require.Contains(t, text, want)
	}

	out.Reset()
	require.Equal(t, 0, run(context.Background(), []string{"status", "-socket", filepath.Join(dir, config.MonitorSocket), "-json"}, &out, &errOut))
	var st ctlapi.Status
	require.NoError(t, json.Unmarshal(out.Bytes(), &st))
	require.Equal(t, "a", st.Host)
	require.Equal(t, "ntb", st.Proxy.Conns[0].Path)
}

func TestStatusUnreachable(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"status", "-socket", filepath.Join(stateDir(t), "nothing.sock")}, &out, &errOut)
	require.Equal(t, 1, code)
	require.Contains(t, errOut.String(), "daemon unavailable")
	require.Contains(t, errOut.String(), "is ntmon running?")
	require.Empty(t, out.String())
}

func TestUsage(t *testing.T) {
	var out, errOut bytes.Buffer
	require.Equal(t, 2, run(context.Background(), []string{"extra"}, &out, &errOut))
	require.Contains(t, errOut.String(), "usage: ntmon [-config FILE]")
	errOut.Reset()
	require.Equal(t, 2, run(context.Background(), []string{"status", "extra"}, &out, &errOut))
	require.Contains(t, errOut.String(), "usage: ntmon status")
	require.Equal(t, 0, run(context.Background(), []string{"version"}, &out, &errOut))
	require.Contains(t, out.String(), fmt.Sprintf("peer protocol %d", monitor.ProtocolVersion))
	errOut.Reset()
	require.Equal(t, 1, run(context.Background(), []string{"-config", "/nonexistent/ntstack.toml"}, &out, &errOut))
	require.Contains(t, errOut.String(), "load config")
}

// syncBuffer is a bytes.Buffer the daemon's logger and the test share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
