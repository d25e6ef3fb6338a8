//go:build verbs && cgo && linux

package rdmaguest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ntstack/ntstack/rdma"
)

// params returns the ntvm.* parameters, or skips outside a guest.
func params(t *testing.T) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		t.Skipf("no /proc/cmdline (%v): these tests run inside make vmtest's RDMA guests", err)
	}
	p := make(map[string]string)
	for _, f := range strings.Fields(string(b)) {
		if k, v, ok := strings.Cut(f, "="); ok && strings.HasPrefix(k, "ntvm.") {
			p[k] = v
		}
	}
	if p[ParamRole] == "" {
		t.Skip("no ntvm.role on /proc/cmdline: these tests run inside make vmtest's RDMA guests (package test/vm boots them)")
	}
	return p
}

func metric(kv ...any) {
	var b strings.Builder
	b.WriteString("NTVM-METRIC rdma")
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(&b, " %v=%v", kv[i], kv[i+1])
	}
	fmt.Println(b.String())
}

// message i: an 8-byte header (sequence number, payload length) and a
// payload from a PRNG seeded by i, 1 to 8 KiB, every 16th 60 KiB.
func message(i int) []byte {
	rng := rand.New(rand.NewPCG(uint64(i), 42))
	n := 1 + rng.IntN(8<<10)
	if i%16 == 15 {
		n = 60 << 10
	}
	b := make([]byte, 8+n)
	binary.LittleEndian.PutUint32(b, uint32(i))
	binary.LittleEndian.PutUint32(b[4:], uint32(n))
	for j := 8; j < len(b); j++ {
		b[j] = byte(rng.Uint32())
	}
	return b
}

// TestRDMAExchange: the server echoes one connection until its EOF; the
// client times round trips one at a time, then streams msgs messages
// pipelined while it reads and checks every echo byte for byte, and
// closes its write side; the server's echo ends with EOF.
func TestRDMAExchange(t *testing.T) {
	p := params(t)
	v := rdma.NewVerbs(rdma.Config{})
	defer v.Close()
	if err := v.Available(); err != nil {
		t.Fatalf("verbs provider in the guest: %v", err)
	}
	switch p[ParamRole] {
	case "server":
		serve(t, v)
	case "client":
		msgs, err := strconv.Atoi(p[ParamMsgs])
		if err != nil {
			t.Fatalf("%s=%q: %v", ParamMsgs, p[ParamMsgs], err)
		}
		client(t, v, p[ParamPeer], msgs)
	default:
		t.Fatalf("%s=%q", ParamRole, p[ParamRole])
	}
}

func serve(t *testing.T, v *rdma.Verbs) {
	ln, err := v.Listen(fmt.Sprintf(":%d", Port))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	t.Logf("accepted %v from %v", c.LocalAddr(), c.RemoteAddr())
	n, err := io.Copy(c, c)
	if err != nil {
		t.Fatalf("echo after %d bytes: %v", n, err)
	}
	if err := c.(rdma.Conn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	metric("role", "server", "echoed_bytes", n)
	// Wait for the client's goodbye, so the last echo is delivered
	// before this end closes.
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the echo: %v, want io.EOF", err)
	}
}

func client(t *testing.T, v *rdma.Verbs, peer string, msgs int) {
	var c net.Conn
	start := time.Now()
	for {
		var err error
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err = v.Dial(ctx, peer)
		cancel()
		if err == nil {
			break
		}
		if time.Since(start) > 60*time.Second || !notUpYet(err) {
			t.Fatalf("dial %s: %v", peer, err)
		}
		time.Sleep(200 * time.Millisecond) // the server is another guest: only a dial tells when it listens
	}
	defer c.Close()
	metric("role", "client", "connect_ms", time.Since(start).Milliseconds())

	// Round trips one at a time: the latency under TCG.
	const pings = 20
	rtts := make([]time.Duration, pings)
	buf := make([]byte, 64)
	for i := range pings {
		t0 := time.Now()
		if _, err := c.Write(buf); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			t.Fatal(err)
		}
		rtts[i] = time.Since(t0)
	}
	slices.Sort(rtts)
	metric("pingpong_64B_round_trips", pings, "p50_ms", ms(rtts[pings/2]), "max_ms", ms(rtts[pings-1]))

	pipelined(t, c, msgs, func() error { return c.(rdma.Conn).CloseWrite() })
}

// pipelined streams msgs messages on c, the writer running ahead of the
// echoes (bounded by the rings), checks every echo byte for byte, ends
// its direction with closeWrite and expects the echo's EOF.
func pipelined(t *testing.T, c net.Conn, msgs int, closeWrite func() error) {
	t0 := time.Now()
	werr := make(chan error, 1)
	total := 0
	for i := range msgs {
		total += len(message(i))
	}
	go func() {
		for i := range msgs {
			if _, err := c.Write(message(i)); err != nil {
				werr <- fmt.Errorf("write message %d: %w", i, err)
				return
			}
		}
		werr <- closeWrite()
	}()
	got := make([]byte, 0, 64<<10)
	for i := range msgs {
		want := message(i)
		got = got[:len(want)]
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatalf("read echo %d: %v", i, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("echo %d differs (sequence %d, length %d)", i, binary.LittleEndian.Uint32(got), binary.LittleEndian.Uint32(got[4:]))
		}
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if _, err := c.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("after the last echo: %v, want io.EOF", err)
	}
	el := time.Since(t0)
	metric("pipelined_msgs", msgs, "bytes_each_way", total, "seconds", fmt.Sprintf("%.2f", el.Seconds()),
		"msgs_per_s", fmt.Sprintf("%.0f", float64(msgs)/el.Seconds()), "MB_per_s", fmt.Sprintf("%.2f", float64(total)/el.Seconds()/1e6))
}

// notUpYet reports whether a dial failed because the server guest is
// still booting: no answer to ARP yet, or nobody listening yet.
func notUpYet(err error) bool {
	for _, e := range []error{syscall.ECONNREFUSED, syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.ETIMEDOUT, context.DeadlineExceeded} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f", float64(d)/float64(time.Millisecond)) }
