package proxy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/capture"
	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/tools/workload"
	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/socklike"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Clone(b.buf.Bytes())
}

// packets decodes a capture with pcapgo and the gopacket layers.
func packets(t *testing.T, file []byte) []gopacket.Packet {
	t.Helper()
	if len(file) == 0 {
		return nil
	}
	r, err := pcapgo.NewNgReader(bytes.NewReader(file), pcapgo.DefaultNgReaderOptions)
	require.NoError(t, err)
	var out []gopacket.Packet
	src := gopacket.NewPacketSource(r, r.LinkType())
	for {
		p, err := src.NextPacket()
		if errors.Is(err, io.EOF) {
			return out
		}
		require.NoError(t, err)
		out = append(out, p)
	}
}

// kvRack is a rack whose host b serves the RESP KV on port 6379, and a
// go-redis client on host a that reaches it over the NTB link.
func kvRack(t *testing.T) (*rack, *redis.Client) {
	r := newRack(t, "")
	ln, err := (&socklike.ListenConfig{Proxy: attach(t, r.cb)}).Listen(context.Background(), "tcp", ":6379")
	require.NoError(t, err)
	kv := workload.NewKV()
	done := make(chan error, 1)
	go func() { done <- kv.Serve(ln) }()
	t.Cleanup(func() {
		require.NoError(t, kv.Close())
		require.NoError(t, <-done)
	})
	pa := attach(t, r.ca)
	rc := redis.NewClient(&redis.Options{
		Addr: "b:6379", Protocol: 2, PoolSize: 1, MaxRetries: -1, DialerRetries: 1,
		Dialer: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return (&socklike.Dialer{Proxy: pa}).DialContext(ctx, "tcp", addr)
		},
	})
	t.Cleanup(func() { rc.Close() })
	return r, rc
}

// startCapture runs capture.Fetch against a's admin socket in the
// background and waits until the stream has begun (the tap is on).
func startCapture(t *testing.T, r *rack, req capture.Request) (buf *syncBuffer, stop func() (capture.Summary, error)) {
	t.Helper()
	buf = &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	type result struct {
		sum capture.Summary
		err error
	}
	res := make(chan result, 1)
	go func() {
		sum, err := capture.Fetch(ctx, r.ca.Path(config.AdminSocket), req, buf)
		res <- result{sum, err}
	}()
	require.Eventually(t, func() bool { return len(buf.Bytes()) > 0 }, 5*time.Second, time.Millisecond, "capture stream did not start")
	var once sync.Once
	var out result
	stop = func() (capture.Summary, error) {
		once.Do(func() {
			cancel()
			out = <-res
		})
		return out.sum, out.err
	}
	t.Cleanup(func() { stop() })
	return buf, stop
}

// kvWorkload: a few SETs and GETs, one value large enough for the
// receiver to hand back credit, then the connection closes.
func kvWorkload(t *testing.T, rc *redis.Client) {
	ctx := context.Background()
	for i := range 5 {
		k := "key" + strconv.Itoa(i)
		require.NoError(t, rc.Set(ctx, k, "value"+strconv.Itoa(i), 0).Err())
		v, err := rc.Get(ctx, k).Result()
		require.NoError(t, err)
		require.Equal(t, "value"+strconv.Itoa(i), v)
	}
	// 2 MiB, over the link's 1 MiB window: credit flows back however
	// much of it the receiver holds back (socklike's shared window).
	big := strings.Repeat("0123456789abcdef", 128<<10)
	require.NoError(t, rc.Set(ctx, "big", big, 0).Err())
	v, err := rc.Get(ctx, "big").Result()
	require.NoError(t, err)
	require.Equal(t, big, v)
	require.NoError(t, rc.Close())
}

// TestCaptureKV captures a KV workload across the rack link through the
// admin socket, decodes it with the gopacket layers, and opens it in
// tshark with ntstack.lua: the decoded headers show the connection's whole
// life and the RESP commands inside the leg frames.
func TestCaptureKV(t *testing.T) {
	r, rc := kvRack(t)
	buf, stop := startCapture(t, r, capture.Request{Link: "b", Snap: 256})
	kvWorkload(t, rc)

	// The CLOSE of both ends, then stop the capture as ntmon's ^C would.
	closes := func() (tx, rx bool) {
		for _, p := range packets(t, buf.Bytes()) {
			if n := p.Layer(capture.LayerTypeNTStack).(*capture.NTStack); n.Kind == transport.FrameClose && n.Local != 0 {
				tx = tx || n.Dir == transport.TapTX
				rx = rx || n.Dir == transport.TapRX
			}
		}
		return tx, rx
	}
	require.Eventually(t, func() bool { tx, rx := closes(); return tx && rx }, 10*time.Second, 10*time.Millisecond)
	sum, err := stop()
	require.NoError(t, err)
	require.False(t, sum.Complete, "stopped by the client: no statistics")
	file := buf.Bytes()

	// gopacket: every frame decodes; the leg layer exposes the RESP bytes.
	pkts := packets(t, file)
	require.Equal(t, int(sum.Packets), len(pkts))
	kinds := map[transport.FrameKind]int{}
	var resp bytes.Buffer
	for _, p := range pkts {
		require.Nil(t, p.ErrorLayer(), "%v", p)
		n := p.Layer(capture.LayerTypeNTStack).(*capture.NTStack)
		require.Equal(t, capture.LinkID("ab"), n.Link)
		require.NotZero(t, n.Flags&capture.FlagLeg)
		require.False(t, n.Malformed, "%v", p)
		kinds[n.Kind]++
		if leg, ok := p.Layer(capture.LayerTypeNTStackLeg).(*capture.NTStackLeg); ok && leg.Type == capture.LegData {
			resp.Write(leg.Payload)
		}
	}
	for _, k := range []transport.FrameKind{transport.FrameOpen, transport.FrameAccept, transport.FrameData, transport.FrameCredit, transport.FrameClose} {
		require.NotZero(t, kinds[k], "no %v frame in %v", k, kinds)
	}
	for _, want := range []string{
		"*3\r\n$3\r\nset\r\n$4\r\nkey0\r\n$6\r\nvalue0\r\n", // go-redis sends commands in lower case
		"*2\r\n$3\r\nget\r\n$4\r\nkey4\r\n$6\r\nvalue4\r\n", // a GET and its reply
	} {
		require.True(t, strings.Contains(resp.String(), want), "no %q in the leg payloads (%d bytes)", want, resp.Len())
	}

	// tshark with the dissector shows the same.
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed (make rackdeps installs it)")
	}
	dir := t.TempDir()
	path, lua := filepath.Join(dir, "kv.pcapng"), filepath.Join(dir, "ntstack.lua")
	require.NoError(t, os.WriteFile(path, file, 0o644))
	require.NoError(t, capture.WriteDissector(lua))
	cmd := exec.Command(tshark, "-n", "-r", path, "-X", "lua_script:"+lua,
		"-T", "fields", "-E", "separator=|", "-e", "ntstack.dirname", "-e", "ntstack.kindname", "-e", "ntstack.conn",
		"-e", "ntstack.leg.type", "-e", "ntstack.text")
	cmd.Env = append(os.Environ(), "HOME="+dir) // a scratch profile
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "tshark: %s", stderr.String())
	require.NotContains(t, stderr.String(), "Lua: Error")
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Len(t, lines, len(pkts))
	seen := map[string]bool{}
	var sets int
	for _, l := range lines {
		f := strings.Split(l, "|")
		require.Len(t, f, 5, l)
		seen[f[1]] = true
		if f[1] == "DATA" && f[3] == "1" && strings.Contains(f[4], "set") {
			sets++
		}
	}
	for _, k := range []string{"OPEN", "ACCEPT", "DATA", "CREDIT", "CLOSE"} {
		require.True(t, seen[k], "tshark shows no %s frame:\n%s", k, out)
	}
	require.GreaterOrEqual(t, sets, 5, "tshark shows the SET commands:\n%s", out)
}

// TestCaptureConnCount captures one connection's frames up to a count: the
// daemon ends the stream with its statistics, and only that connection's
// frames are in it. Bad requests answer with their codes.
func TestCaptureConnCount(t *testing.T) {
	r, rc := kvRack(t)
	ctx := context.Background()
	require.NoError(t, rc.Ping(ctx).Err())
	var id uint32
	for _, c := range r.a.Snapshot().Conns {
		if c.Path == ctlapi.PathNTB {
			_, port, err := net.SplitHostPort(c.Local)
			require.NoError(t, err)
			v, err := strconv.ParseUint(port, 10, 32)
			require.NoError(t, err)
			id = uint32(v) // a dialer's local port is its socklike id
		}
	}
	require.NotZero(t, id)
	// Another connection's traffic must stay out of the capture.
	other := attach(t, r.ca)
	oc, err := (&socklike.Dialer{Proxy: other}).Dial("tcp", "b:6379")
	require.NoError(t, err)
	defer oc.Close()

	buf := &syncBuffer{}
	done := make(chan error, 1)
	var sum capture.Summary
	go func() {
		var err error
		sum, err = capture.Fetch(ctx, r.ca.Path(config.AdminSocket), capture.Request{Link: "ab", Conn: id, Count: 6}, buf)
		done <- err
	}()
	require.Eventually(t, func() bool { return len(buf.Bytes()) > 0 }, 5*time.Second, time.Millisecond)
loop:
	for i := 0; ; i++ {
		select {
		case err := <-done:
			require.NoError(t, err)
			require.True(t, sum.Complete)
			require.Equal(t, uint64(6), sum.Packets)
			require.Zero(t, sum.Dropped)
			pkts := packets(t, buf.Bytes())
			require.Len(t, pkts, 6)
			for _, p := range pkts {
				require.Equal(t, id, p.Layer(capture.LayerTypeNTStack).(*capture.NTStack).Local)
			}
			break loop
		default:
		}
		_, err := oc.Write([]byte("*1\r\n$4\r\nPING\r\n")) // not captured
		require.NoError(t, err)
		require.NoError(t, rc.Set(ctx, "k", strconv.Itoa(i), 0).Err())
		require.Less(t, i, 1000, "the capture did not end")
	}
	for _, c := range []struct {
		req  capture.Request
		code ctlapi.Code
	}{
		{capture.Request{Link: "nowhere"}, ctlapi.CodeUnknown},
		{capture.Request{Link: "b", Snap: 1}, ctlapi.CodeBadRequest},
		{capture.Request{}, ctlapi.CodeBadRequest},
	} {
		_, err := capture.Fetch(ctx, r.ca.Path(config.AdminSocket), c.req, io.Discard)
		require.Equal(t, c.code, ctlapi.CodeOf(err), "%+v: %v", c.req, err)
	}
}
