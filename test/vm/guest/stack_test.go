package guest

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"testing"
	"time"

	"golang.org/x/net/nettest"

	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/ivshmem"
	"github.com/ntstack/ntstack/ntb/ntbtest"
	"github.com/ntstack/ntstack/vfio"
)

// The stack scenarios: socklike over ivshmem.NewDevice over the PCI port,
// the whole stack on the real device path.
const (
	stackPort   = 4242
	stackSeed   = 20240601
	maxMsgSize  = 1024 // payload bytes; each message has a 4-byte length first
	lenPrefix   = 4
	linkTimeout = 30 * time.Second
)

// attach wraps port in an ntb.Device taking side and an Endpoint over it,
// both closed at the end of the test (the Device closes the port).
func attach(t *testing.T, port ivshmem.Port, side ivshmem.Side) (*ivshmem.Device, *transport.Endpoint) {
	t.Helper()
	dev, err := ivshmem.NewDevice(port, ivshmem.DeviceConfig{Side: side})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := dev.Close(); err != nil {
			t.Errorf("close device: %v", err)
		}
	})
	ep, err := transport.Attach(dev, transport.Config{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ep.Close(); err != nil {
			t.Errorf("close endpoint: %v", err)
		}
	})
	return dev, ep
}

// message returns message i of the stream: a seeded length and payload,
// the same in every guest.
func message(i int) []byte {
	r := rand.New(rand.NewPCG(stackSeed, uint64(i)))
	b := make([]byte, 1+r.IntN(maxMsgSize))
	for j := range b {
		b[j] = byte(r.Uint32())
	}
	return b
}

func writeMessage(w io.Writer, msg []byte) error {
	var hdr [lenPrefix]byte
	binary.LittleEndian.PutUint32(hdr[:], uint32(len(msg)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(msg)
	return err
}

// readMessage reads one message into buf and checks it against message(i).
func readMessage(r io.Reader, buf []byte, i int) error {
	var hdr [lenPrefix]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return fmt.Errorf("message %d: length: %w", i, err)
	}
	want := message(i)
	n := binary.LittleEndian.Uint32(hdr[:])
	if n != uint32(len(want)) {
		return fmt.Errorf("message %d: length %d, want %d", i, n, len(want))
	}
	got := buf[:n]
	if _, err := io.ReadFull(r, got); err != nil {
		return fmt.Errorf("message %d: payload: %w", i, err)
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("message %d: payload differs from byte %d on", i, firstDiff(got, want))
	}
	return nil
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestStack runs in two guests: the holder of side 0 listens and echoes
// every message, the holder of side 1 dials, streams the messages while a
// second goroutine reads and checks the echoes, and both check io.EOF at
// the end.
func TestStack(t *testing.T) {
	p := params(t)
	msgs := intParam(t, p, ParamMsgs)
	port := openPort(t, onlyDevice(t))
	dev, ep := attach(t, port, ivshmem.AnySide)
	t.Logf("peer id %d holds side %d of %s", port.ID(), dev.Port(), dev.Name())
	ctx, cancel := context.WithTimeout(t.Context(), 120*time.Second)
	defer cancel()
	start := time.Now()
	if dev.Port() == 0 {
		echo(ctx, t, dev, ep, msgs)
	} else {
		stream(ctx, t, ep, msgs)
	}
	elapsed := time.Since(start)
	if dev.Port() == 1 {
		var total int
		for i := range msgs {
			total += lenPrefix + len(message(i))
		}
		metric("stack", "messages", msgs, "bytes_each_way", total,
			"elapsed", elapsed.Round(time.Millisecond),
			"msgs_per_s", int(float64(msgs)/elapsed.Seconds()))
	}
}

func echo(ctx context.Context, t *testing.T, dev *ivshmem.Device, ep *transport.Endpoint, msgs int) {
	ln, err := ep.Listen(stackPort)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	c, err := ln.AcceptConn()
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	defer c.Close()
	stopConn := context.AfterFunc(ctx, func() { c.Close() })
	defer stopConn()
	buf := make([]byte, maxMsgSize)
	for i := range msgs {
		if err := readMessage(c, buf, i); err != nil {
			t.Fatal(err)
		}
		if err := writeMessage(c, message(i)); err != nil {
			t.Fatalf("echo message %d: %v", i, err)
		}
	}
	if n, err := c.Read(buf); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("after %d messages: read %d bytes, %v; want io.EOF", msgs, n, err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	// Linger until the streamer, having read our EOF, hangs up: tearing
	// our Device down first would race our FIN against the link going
	// down. The Endpoint owns the LinkEvents channel, so the wait is on
	// LinkChanged, taken before each look.
	for {
		changed := dev.LinkChanged()
		if dev.Link() != ntb.LinkUp {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the streamer never hung up")
		case <-changed:
		}
	}
}

func stream(ctx context.Context, t *testing.T, ep *transport.Endpoint, msgs int) {
	c, err := ep.DialContext(ctx, stackPort) // waits for the link to come up
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	defer c.Close()
	stopConn := context.AfterFunc(ctx, func() { c.Close() })
	defer stopConn()
	wrote := make(chan error, 1)
	go func() {
		for i := range msgs {
			if err := writeMessage(c, message(i)); err != nil {
				wrote <- fmt.Errorf("write message %d: %w", i, err)
				return
			}
		}
		wrote <- c.CloseWrite()
	}()
	buf := make([]byte, maxMsgSize)
	for i := range msgs {
		if err := readMessage(c, buf, i); err != nil {
			t.Fatalf("echo: %v", err)
		}
	}
	if n, err := c.Read(buf); n != 0 || !errors.Is(err, io.EOF) {
		t.Fatalf("after %d echoes: read %d bytes, %v; want io.EOF", msgs, n, err)
	}
	if err := <-wrote; err != nil {
		t.Fatal(err)
	}
}

// TestConn runs golang.org/x/net/nettest.TestConn over the real device
// path: one guest with two ivshmem devices on one server, each opened
// through VFIO, one Device per side, an Endpoint on each, and every pipe
// dialed from one Endpoint to a listener on the other.
func TestConn(t *testing.T) {
	params(t)
	addrs, err := ivshmem.FindPCI(vfio.Host{})
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 2 {
		t.Fatalf("ivshmem devices %v, want two", addrs)
	}
	_, a := attach(t, openPort(t, addrs[0]), ivshmem.Side0)
	devB, b := attach(t, openPort(t, addrs[1]), ivshmem.Side1)
	ntbtest.WaitLink(t, devB, ntb.LinkUp, linkTimeout)
	port := stackPort
	start := time.Now()
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
		port++
		ln, err := b.Listen(port)
		if err != nil {
			return nil, nil, nil, err
		}
		defer ln.Close()
		accepted := make(chan *transport.Conn, 1)
		go func() {
			c, err := ln.AcceptConn()
			if err != nil {
				t.Errorf("accept: %v", err)
			}
			accepted <- c
		}()
		ctx, cancel := context.WithTimeout(context.Background(), linkTimeout)
		defer cancel()
		c1, err := a.DialContext(ctx, port)
		if err != nil {
			return nil, nil, nil, err
		}
		c2 := <-accepted
		if c2 == nil {
			c1.Close()
			return nil, nil, nil, errors.New("accept failed")
		}
		return c1, c2, func() { c1.Close(); c2.Close() }, nil
	})
	metric("conn", "nettest_elapsed", time.Since(start).Round(time.Millisecond))
}
