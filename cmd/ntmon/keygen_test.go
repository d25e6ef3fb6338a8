package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
)

// TestKeygenCA: a rack CA from keygen -new-ca signs host keys (keygen
// -ca) that hosts trust through auth.ca without pins; a self-signed key
// naming the same host is not trusted.
func TestKeygenCA(t *testing.T) {
	dir := t.TempDir()
	run1 := func(args ...string) {
		t.Helper()
		var out, errb bytes.Buffer
		require.Equal(t, 0, run(context.Background(), append([]string{"keygen"}, args...), &out, &errb), errb.String())
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	run1("-new-ca", "-out", p("ca.key"), "-cert", p("ca.pem"))
	run1("-host", "a", "-ca", p("ca.key"), "-out", p("a.key"))
	run1("-host", "b", "-ca", p("ca.key"), "-out", p("b.key"))
	run1("-host", "b", "-out", p("b-self.key"))

	cfg := func(host, peer, key string) *config.Config {
		return &config.Config{Host: host, Auth: config.Auth{Key: key, CA: p("ca.pem")}, Peers: []config.Peer{{Host: peer}}}
	}
	a, err := cfg("a", "b", p("a.key")).HostAuth()
	require.NoError(t, err)
	for key, ok := range map[string]bool{p("b.key"): true, p("b-self.key"): false} {
		b, err := cfg("b", "a", key).HostAuth()
		require.NoError(t, err)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		errc := make(chan error, 1)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				errc <- err
				return
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			_, host, err := a.Server(c)
			if err == nil && host != "b" {
				err = fmt.Errorf("proved %q, want b", host)
			}
			errc <- err
		}()
		c, err := net.Dial("tcp", ln.Addr().String())
		require.NoError(t, err)
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		_, cerr := b.Client(c, "a")
		require.NoError(t, cerr) // the client's side ends before the server checks it
		serr := <-errc
		c.Close()
		ln.Close()
		if ok {
			require.NoError(t, serr, key)
		} else {
			require.Error(t, serr, key)
		}
	}
	// The CA key is refused as a host key where a host's is expected.
	var out, errb bytes.Buffer
	require.Equal(t, 1, run(context.Background(), []string{"keygen", "-host", "c", "-ca", p("a.key"), "-out", p("c.key")}, &out, &errb))
	require.Contains(t, errb.String(), "not an ed25519 CA")
}
