package rdma

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/ntstack/ntstack/internal/wire/hostauth"
	"github.com/ntstack/ntstack/internal/wire/hostauth/hostauthtest"
)

// authOf is host's Auth trusting peers' keys.
func authOf(t *testing.T, keys map[string]hostauthtest.Key, host string, peers ...string) *hostauth.Auth {
	t.Helper()
	cert, err := hostauth.LoadKey(keys[host].Path)
	if err != nil {
		t.Fatal(err)
	}
	pins := map[string]string{}
	for _, p := range peers {
		pins[p] = keys[p].Pin
	}
	a, err := hostauth.New(host, cert, pins, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestAuthenticatedBootstrap: with Config.Auth both ends of a connection
// learn the peer host from the bootstrap's TLS session; a dialer without
// the right key, or without TLS, gets no connection, and a dialer that
// reaches a listener holding another key than the host it dials refuses
// it before any hello (so a wrong dial target cannot take the
// connection).
func TestAuthenticatedBootstrap(t *testing.T) {
	checkGoroutines(t)
	keys := hostauthtest.Keys(t, "a", "b", "mallory")
	impostorB := hostauthtest.Keys(t, "b")
	keys["b?"] = impostorB["b"]
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	ln, err := NewTCP(Config{Auth: authOf(t, keys, "b", "a")}).Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	addr := ln.Addr().String()

	a := NewTCP(Config{Auth: authOf(t, keys, "a", "b")})
	c, err := a.DialHost(ctx, addr, "b")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := <-accepted
	defer s.Close()
	if got := c.(Conn).Peer(); got != "b" {
		t.Fatalf("dialer's peer %q, want b", got)
	}
	if got := s.(Conn).Peer(); got != "a" {
		t.Fatalf("listener's peer %q, want a", got)
	}
	if _, err := c.Write([]byte("hello")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := s.Read(buf); err != nil || string(buf) != "hello" {
		t.Fatalf("read %q, %v", buf, err)
	}
	if _, err := a.Dial(ctx, addr); !errors.Is(err, errNeedHost) {
		t.Fatalf("Dial with Auth: %v, want errNeedHost", err)
	}

	// Refused: a stranger, the name a with another key, no TLS at all.
	for name, p := range map[string]*TCP{
		"stranger": NewTCP(Config{Auth: authOf(t, map[string]hostauthtest.Key{"mallory": keys["mallory"], "b": keys["b"]}, "mallory", "b")}),
		"plain":    NewTCP(Config{HandshakeTimeout: 5 * time.Second}),
	} {
		c, err := p.DialHost(ctx, addr, "b")
		if err == nil {
			// TLS 1.3: the client's handshake ends before the server
			// checks it; the refusal shows at the first read.
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err = c.Read(make([]byte, 1))
			c.Close()
		}
		var ne net.Error
		if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
			t.Fatalf("%s: dial got through: %v", name, err)
		}
	}
	select {
	case c := <-accepted:
		t.Fatalf("an unauthenticated dialer was accepted, peer %q", c.(Conn).Peer())
	default:
	}

	// b's address answered by a listener with another key naming b.
	fake, err := NewTCP(Config{Auth: authOf(t, map[string]hostauthtest.Key{"b": keys["b?"], "a": keys["a"]}, "b", "a")}).Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	_, err = a.DialHost(ctx, fake.Addr().String(), "b")
	if !errors.Is(err, hostauth.ErrNotAuthenticated) {
		t.Fatalf("dial to an impostor: %v, want ErrNotAuthenticated", err)
	}
}
