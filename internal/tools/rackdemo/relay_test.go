package rackdemo

import (
	"context"
	"io"
	"net"
	"testing"
)

// Two relays in a row carry a connection both ways, and a client's
// half-close reaches the server through both.
func TestRelayTwoHops(t *testing.T) {
	srv, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() {
		c, err := srv.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c) // until the client's half-close
		c.Write(append([]byte("echo:"), b...))
	}()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	defer func() {
		cancel()
		for range 2 {
			if err := <-done; err != nil {
				t.Error(err)
			}
		}
	}()
	to := srv.Addr().String()
	var front string
	for range 2 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func(to string) { done <- Relay(ctx, ln, to) }(to)
		to, front = ln.Addr().String(), ln.Addr().String()
	}
	c, err := net.Dial("tcp", front)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ntstack")); err != nil {
		t.Fatal(err)
	}
	c.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "echo:ntstack" {
		t.Fatalf("read %q, %v through two relays; want %q", got, err, "echo:ntstack")
	}
}

func TestParseWrkRequests(t *testing.T) {
	out := []byte(`Running 1s test @ http://127.0.0.1:18080/4k
  Latency Distribution
     50%  120.00us
     99%  1.20ms
  12345 requests in 1.00s, 50.00MB read
Requests/sec:  12345.00
`)
	row, n, err := parseWrk(out)
	if err != nil || n != 12345 || row.Rate != 12345 || row.P50.Microseconds() != 120 {
		t.Fatalf("parseWrk: %+v, %d requests, %v", row, n, err)
	}
}
