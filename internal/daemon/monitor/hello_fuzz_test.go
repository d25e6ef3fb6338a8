package monitor

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
)

// The HELLO and the session's frames come from any host that reaches the
// control port. These targets decode their bodies (FuzzDecodeFrame covers
// the framing) and run the whole handshake and session over them.

// bodyRoundTrip decodes f's body as a T with decode and, if it is
// accepted, checks that it encodes and decodes back to the same value.
func bodyRoundTrip[T any](t *testing.T, f Frame, decode func(Frame) (T, error)) {
	v, err := decode(f)
	if err != nil {
		if !errors.Is(err, ErrFrame) {
			t.Fatalf("%v body error %v does not wrap ErrFrame", f.Type, err)
		}
		return
	}
	b, err := AppendFrame(nil, f.Type, v)
	if err != nil {
		return // escaping made it longer than the frame cap
	}
	g, _, err := DecodeFrame(b)
	if err != nil {
		t.Fatalf("re-decode frame of %+v: %v", v, err)
	}
	again, err := decode(g)
	if err != nil {
		t.Fatalf("re-decode %+v: %v", v, err)
	}
	if !reflect.DeepEqual(v, again) {
		t.Fatalf("round trip changed %+v into %+v", v, again)
	}
}

func decodeAs[T any](f Frame) (T, error) {
	var v T
	err := DecodeBody(f, &v)
	return v, err
}

// fuzzConfig is host a with peers b (over NTB link l0) and c (no link).
func fuzzConfig(tb testing.TB) *config.Config {
	dir, err := os.MkdirTemp("", "ntmon")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	return &config.Config{
		Host: "a", StateDir: dir,
		Peers: []config.Peer{{Host: "b", Link: "l0"}, {Host: "c"}},
		Proxy: config.Proxy{Window: 1 << 20, Partitions: 2},
		Auth:  config.Auth{Key: testRack.Key(tb, "a"), CA: testRack.CAFile},
	}
}

// FuzzHello feeds HELLO, HEARTBEAT, ERROR and BYE bodies to their decoders:
// errors wrap ErrFrame, an accepted body round-trips, an accepted HELLO
// keeps within the limits, and the checks that decide whether to talk to
// its sender (checkHello, linkProblem) accept only a configured peer.
func FuzzHello(f *testing.F) {
	good := Hello{Magic: Magic, Version: ProtocolVersion, Host: "b", Caps: []string{"ntb", "tcp", "rdma"},
		Links: []HelloLink{{Name: "l0", Peer: "a", Window: 1 << 20, Partitions: 2}}, Addresses: []string{"10.0.0.2"},
		RDMA: "10.1.0.2:7472"}
	for _, v := range []any{
		good,
		Hello{Magic: Magic, Version: ProtocolVersion, Host: "c", RDMAWhy: "no device"},
		Hello{Magic: Magic, Version: ProtocolVersion + 1, Host: "b"},
		Hello{Magic: "http", Host: "a"},
		Hello{Magic: Magic, Version: ProtocolVersion, Host: "b", Links: []HelloLink{{Name: "l0", Peer: "x", Window: -1}}},
		Heartbeat{Seq: 1 << 63},
		ErrorBody{Message: "duplicate session", Reason: reasonDuplicate},
	} {
		b, err := AppendFrame(nil, FrameHello, v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(uint8(0), b[frameHeader+1:])
		f.Add(uint8(3), b[frameHeader+1:]) // proved b, not dialed
	}
	for _, s := range []string{``, ` `, `[]`, `{}`, `{} {}`, `{"caps":null,"links":[null]}`, `{"rdma":"nocolon"}`,
		`{"host":"\ud800"}`, `{"seq":-1}`, `{"message":1}`, `{"version":1e400}`} {
		f.Add(uint8(1), []byte(s))
	}
	m, err := New(fuzzConfig(f), Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { m.Close() })
	f.Fuzz(func(t *testing.T, dial uint8, body []byte) {
		// The connection was dialed to a peer or not, and its certificate
		// proved a configured peer (TLS admits no other) or nothing.
		dialed := []string{"", "b", "c"}[int(dial)%3]
		proved := []string{"", "b", "c"}[int(dial/3)%3]
		bodyRoundTrip(t, Frame{Type: FrameHello, Body: body}, DecodeHello)
		bodyRoundTrip(t, Frame{Type: FrameHeartbeat, Body: body}, decodeAs[Heartbeat])
		bodyRoundTrip(t, Frame{Type: FrameError, Body: body}, decodeAs[ErrorBody])
		bodyRoundTrip(t, Frame{Type: FrameBye, Body: body}, decodeAs[ErrorBody])
		h, err := DecodeHello(Frame{Type: FrameHello, Body: body})
		if err != nil {
			return
		}
		if len(h.Caps) > maxHelloItems || len(h.Links) > maxHelloItems || len(h.Addresses) > maxHelloItems ||
			len(h.Host) > maxNameLen || len(h.RDMAWhy) > maxWhyLen {
			t.Fatalf("hello over limits accepted: %+v", h)
		}
		for _, l := range h.Links {
			if l.Window < 0 || l.Partitions < 0 {
				t.Fatalf("negative link accepted: %+v", l)
			}
		}
		p, configured := m.peers[h.Host]
		want := h.Magic == Magic && h.Version == ProtocolVersion && configured && (dialed == "" || h.Host == dialed) &&
			h.Host == proved // the identity is the certificate's, never the HELLO's
		if err := m.checkHello(h, dialed, proved); (err == nil) != want {
			t.Fatalf("checkHello(%+v, dialed %q, proved %q) = %v", h, dialed, proved, err)
		}
		if configured && m.linkProblem(p.cfg, h) == "" && p.cfg.Link != "" {
			i := slicesIndex(h.Links, p.cfg.Link)
			if i < 0 || h.Links[i].Peer != "a" || h.Links[i].Window != m.cfg.Proxy.Window || h.Links[i].Partitions != m.cfg.Proxy.Partitions {
				t.Fatalf("link %s usable with %+v", p.cfg.Link, h)
			}
		}
	})
}

func slicesIndex(links []HelloLink, name string) int {
	for i, l := range links {
		if l.Name == name {
			return i
		}
	}
	return -1
}

// memConn is a peer connection whose far end has sent in and closed:
// reads return in, then io.EOF; writes are kept. Deadlines never fire
// (reads never block).
type memConn struct {
	mu sync.Mutex
	// mu protects the following fields.
	in  []byte
	out bytes.Buffer
}

func (c *memConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.in) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.in)
	c.in = c.in[n:]
	return n, nil
}

func (c *memConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.out.Write(p)
}

func (c *memConn) Close() error                     { return nil }
func (c *memConn) LocalAddr() net.Addr              { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7400} }
func (c *memConn) RemoteAddr() net.Addr             { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 40000} }
func (c *memConn) SetDeadline(time.Time) error      { return nil }
func (c *memConn) SetReadDeadline(time.Time) error  { return nil }
func (c *memConn) SetWriteDeadline(time.Time) error { return nil }

// FuzzPeerSession runs a peer connection — the HELLO exchange, then the
// session — over bytes a host on the control port sent: inbound
// (dial 0) or dialed by this host to peer b or c. A session is established
// only when the first frame is a HELLO from that configured peer (or, for
// an inbound connection, from any configured peer other than this host),
// it ends when the bytes do, and what this host wrote is well-formed
// frames only.
func FuzzPeerSession(f *testing.F) {
	frame := func(t FrameType, v any) []byte {
		b, err := AppendFrame(nil, t, v)
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	hello := func(host string) []byte {
		return frame(FrameHello, Hello{Magic: Magic, Version: ProtocolVersion, Host: host, Caps: []string{"ntb"},
			Links: []HelloLink{{Name: "l0", Peer: "a", Window: 1 << 20, Partitions: 2}}})
	}
	hb := frame(FrameHeartbeat, Heartbeat{Seq: 1})
	f.Add(uint8(0), cat(hello("b"), hb, hb, frame(FrameBye, ErrorBody{Message: "shutting down"})))
	f.Add(uint8(1), cat(hello("b"), hb, frame(FrameError, ErrorBody{Message: "no"})))
	f.Add(uint8(2), cat(hello("c"), hb, frame(FrameHello, Hello{})))
	f.Add(uint8(1), hello("c"))  // dialed b, c answers
	f.Add(uint8(0), hello("a"))  // this host's own name
	f.Add(uint8(0), hello("zz")) // not a peer
	f.Add(uint8(0), frame(FrameError, ErrorBody{Message: "duplicate", Reason: reasonDuplicate}))
	f.Add(uint8(0), cat(hello("b"), rawFrame(FrameHeartbeat, `{"seq":"x"}`)))
	f.Add(uint8(0), cat(hello("b"), rawFrame(FrameHeartbeat, `{"seq":1} trailing`)))
	f.Add(uint8(0), []byte{0xff, 0xff, 0xff, 0xff, 1})
	// The session's bytes as they arrive inside TLS: the peer protocol
	// under the handshake is the same with or without a key, so the
	// monitor runs insecure here (FuzzHello covers the identity rule).
	cfg := fuzzConfig(f)
	cfg.Auth = config.Auth{Insecure: true}
	m, err := New(cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { m.Close() })
	f.Fuzz(func(t *testing.T, dial uint8, data []byte) {
		dialed := []string{"", "b", "c"}[int(dial)%3]
		c := &memConn{in: data}
		up := m.serveConn(c, dialed, nil)

		fr, _, ferr := DecodeFrame(data)
		h, herr := DecodeHello(fr)
		_, configured := m.peers[h.Host]
		want := ferr == nil && herr == nil && h.Magic == Magic && h.Version == ProtocolVersion &&
			configured && (dialed == "" || h.Host == dialed)
		if up != want {
			t.Fatalf("session established %v, want %v (dialed %q, first frame %v %q)", up, want, dialed, fr.Type, fr.Body)
		}
		m.mu.Lock()
		for host, p := range m.peers {
			if p.sess != nil {
				m.mu.Unlock()
				t.Fatalf("peer %s keeps a session after its connection ended", host)
			}
		}
		tracked := len(m.conns)
		m.mu.Unlock()
		if tracked != 0 {
			t.Fatalf("%d connections still tracked", tracked)
		}
		for out := c.out.Bytes(); len(out) > 0; {
			g, n, err := DecodeFrame(out)
			if err != nil {
				t.Fatalf("wrote a malformed frame: %v", err)
			}
			if g.Type == FrameHello {
				if _, err := DecodeHello(g); err != nil {
					t.Fatalf("wrote a HELLO its peers refuse: %v", err)
				}
			}
			out = out[n:]
		}
	})
}
