package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/capture"
	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// fakeCapture serves capture.Path as ntproxy would: three frames of link
// "ab" and the statistics, or a JSON error for any other link.
func fakeCapture(t *testing.T, path string) {
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	h := func(w http.ResponseWriter, r *http.Request) {
		req, err := capture.ParseRequest(r.URL.Query())
		if err == nil && req.Link != "ab" {
			err = ctlapi.Errorf(ctlapi.CodeUnknown, "capture: no rack link or peer %q", req.Link)
		}
		if err != nil {
			ctlapi.Reply(w, nil, err)
			return
		}
		w.Header().Set("Content-Type", capture.ContentType)
		cw, err := capture.NewWriter(w, "ab", capture.DefaultSnap, "")
		for i, k := range []transport.FrameKind{transport.FrameOpen, transport.FrameAccept, transport.FrameClose} {
			p := make([]byte, 12*(1-i/2))
			if err == nil {
				err = cw.Write(&capture.Record{Time: time.Now(), Kind: k, Conn: 1, Local: 1, Link: "ab", Length: len(p), Payload: p}, 0)
			}
		}
		if err == nil {
			err = cw.Close(1)
		}
		if err != nil {
			t.Error(err) // not FailNow: this is the server's goroutine
		}
	}
	srv := &http.Server{Handler: http.HandlerFunc(h)}
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

func TestCapture(t *testing.T) {
	dir := stateDir(t)
	cfgPath := writeConfig(t, dir)
	fakeCapture(t, filepath.Join(dir, config.AdminSocket))
	out := filepath.Join(dir, "out.pcapng")
	lua := filepath.Join(dir, "ntstack.lua")

	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"capture", "-config", cfgPath, "-link", "ab", "-count", "3", "-w", out, "-lua", lua}, &stdout, &stderr)
	require.Equal(t, 0, code, "stderr: %s", stderr.String())
	require.Contains(t, stderr.String(), "3 frames of link ab written to "+out+" (1 dropped")
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	var sum capture.Summary
	require.NoError(t, capture.CopyBlocks(&bytes.Buffer{}, bytes.NewReader(b), &sum))
	require.Equal(t, uint64(3), sum.Packets)
	b, err = os.ReadFile(lua)
	require.NoError(t, err)
	require.Equal(t, capture.Dissector, b)

	// -w -: the stream on stdout.
	stdout.Reset()
	code = run(context.Background(), []string{"capture", "-socket", filepath.Join(dir, config.AdminSocket), "-link", "ab", "-w", "-"}, &stdout, &stderr)
	require.Equal(t, 0, code, "stderr: %s", stderr.String())
	sum = capture.Summary{}
	require.NoError(t, capture.CopyBlocks(&bytes.Buffer{}, &stdout, &sum))
	require.Equal(t, uint64(3), sum.Packets)

	// A refused capture: the daemon's error, exit 1, no file.
	stderr.Reset()
	missing := filepath.Join(dir, "missing.pcapng")
	code = run(context.Background(), []string{"capture", "-config", cfgPath, "-link", "zz", "-w", missing}, &stdout, &stderr)
	require.Equal(t, 1, code)
	require.Contains(t, stderr.String(), `unknown host: capture: no rack link or peer "zz"`)
	require.NoFileExists(t, missing)

	// No daemon.
	stderr.Reset()
	code = run(context.Background(), []string{"capture", "-socket", filepath.Join(dir, "none.sock"), "-link", "ab", "-w", missing}, &stdout, &stderr)
	require.Equal(t, 1, code)
	require.Contains(t, stderr.String(), "is ntproxy running")

	// Usage errors.
	for _, args := range [][]string{{}, {"-link", "ab"}, {"-w", out}, {"-link", "ab", "-w", out, "extra"}} {
		stderr.Reset()
		require.Equal(t, 2, run(context.Background(), append([]string{"capture"}, args...), &stdout, &stderr), "%v", args)
		require.Contains(t, stderr.String(), "usage: ntmon capture")
	}
}
