package hostauth_test

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/wire/hostauth"
	"github.com/ntstack/ntstack/internal/wire/hostauth/hostauthtest"
)

func load(t *testing.T, path string) tls.Certificate {
	t.Helper()
	c, err := hostauth.LoadKey(path)
	require.NoError(t, err)
	return c
}

// handshake runs client (dialing peer) against server over a pipe and
// returns the host the server saw proved, the client's error and the
// server's.
func handshake(t *testing.T, client *hostauth.Auth, peer string, server *hostauth.Auth) (proved string, cerr, serr error) {
	t.Helper()
	// A socket, not net.Pipe: a refusing side's alert must not wait for
	// the other to stop writing its flight.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	c1, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	c2, err := ln.Accept()
	require.NoError(t, err)
	defer c1.Close()
	defer c2.Close()
	deadline := time.Now().Add(10 * time.Second)
	_ = c1.SetDeadline(deadline)
	_ = c2.SetDeadline(deadline)
	done := make(chan struct{})
	go func() {
		defer close(done)
		var tc *tls.Conn
		tc, proved, serr = server.Server(c2)
		if serr == nil {
			// TLS 1.3: the client learns of a refusal at its first read.
			_, serr = tc.Write([]byte{1})
		} else {
			c2.Close()
		}
	}()
	tc, cerr := client.Client(c1, peer)
	if cerr == nil {
		_, cerr = tc.Read(make([]byte, 1))
	}
	c1.Close()
	<-done
	return proved, cerr, serr
}

func TestPinnedHandshake(t *testing.T) {
	keys := hostauthtest.Keys(t, "a", "b", "c")
	pins := func(peers ...string) map[string]string {
		m := map[string]string{}
		for _, p := range peers {
			m[p] = keys[p].Pin
		}
		return m
	}
	a, err := hostauth.New("a", load(t, keys["a"].Path), pins("b"), nil)
	require.NoError(t, err)
	b, err := hostauth.New("b", load(t, keys["b"].Path), pins("a", "c"), nil)
	require.NoError(t, err)
	require.Equal(t, keys["a"].Pin, a.Pin())

	proved, cerr, serr := handshake(t, b, "a", a)
	require.NoError(t, cerr)
	require.NoError(t, serr)
	require.Equal(t, "b", proved)

	// c is b's peer, not a's: a refuses it as a client...
	c, err := hostauth.New("c", load(t, keys["c"].Path), pins("a", "b"), nil)
	require.NoError(t, err)
	_, _, serr = handshake(t, c, "a", a)
	require.ErrorIs(t, serr, hostauth.ErrNotAuthenticated)
	// ...and b, dialing a but reaching c, refuses the server.
	_, cerr, _ = handshake(t, b, "a", c)
	require.ErrorIs(t, cerr, hostauth.ErrNotAuthenticated)

	// A key naming b that is not b's pinned key.
	fake := hostauthtest.Keys(t, "b")["b"]
	b2, err := hostauth.New("b", load(t, fake.Path), pins("a"), nil)
	require.NoError(t, err)
	_, _, serr = handshake(t, b2, "a", a)
	require.ErrorIs(t, serr, hostauth.ErrNotAuthenticated)
	require.ErrorContains(t, serr, "not the one pinned")
}

func TestCAHandshake(t *testing.T) {
	r, err := hostauthtest.NewRack("")
	require.NoError(t, err)
	defer r.Remove()
	ca, err := hostauth.LoadCA(r.CAFile)
	require.NoError(t, err)
	a, err := hostauth.New("a", load(t, r.Key(t, "a")), map[string]string{"b": ""}, ca)
	require.NoError(t, err)
	b, err := hostauth.New("b", load(t, r.Key(t, "b")), map[string]string{"a": ""}, ca)
	require.NoError(t, err)
	proved, cerr, serr := handshake(t, b, "a", a)
	require.NoError(t, cerr)
	require.NoError(t, serr)
	require.Equal(t, "b", proved)

	// Signed by the CA but not a configured peer.
	m, err := hostauth.New("mallory", load(t, r.Key(t, "mallory")), map[string]string{"a": ""}, ca)
	require.NoError(t, err)
	_, _, serr = handshake(t, m, "a", a)
	require.ErrorIs(t, serr, hostauth.ErrNotAuthenticated)

	// A self-signed key naming b.
	fake := hostauthtest.Keys(t, "b")["b"]
	b2, err := hostauth.New("b", load(t, fake.Path), map[string]string{"a": ""}, ca)
	require.NoError(t, err)
	_, _, serr = handshake(t, b2, "a", a)
	require.ErrorIs(t, serr, hostauth.ErrNotAuthenticated)
	var uae x509.UnknownAuthorityError
	require.True(t, errors.As(serr, &uae), "%v", serr)
}

func TestKeysAndPins(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "a.key")
	pin, err := hostauth.WriteKey(p, "a")
	require.NoError(t, err)
	fi, err := os.Stat(p)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	_, err = hostauth.WriteKey(p, "a")
	require.ErrorIs(t, err, os.ErrExist, "never overwrites a key")

	cert := load(t, p)
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	require.NoError(t, err)
	require.Equal(t, pin, hostauth.PinOf(leaf))
	ed, err := hostauth.ParsePin(pin)
	require.NoError(t, err)
	require.True(t, ed.Matches(leaf))
	other, err := hostauth.ParsePin(hostauthtest.Keys(t, "a")["a"].Pin)
	require.NoError(t, err)
	require.False(t, other.Matches(leaf))

	_, err = hostauth.New("b", cert, nil, nil)
	require.ErrorContains(t, err, "names a, not b")
	_, err = hostauth.New("a", cert, map[string]string{"b": ""}, nil)
	require.ErrorContains(t, err, "no key pinned and no rack CA")

	for _, bad := range []string{"", "ed25519:", "ed25519:AAAA", "sha256:!!", "rsa:AAAA"} {
		_, err := hostauth.ParsePin(bad)
		require.Error(t, err, bad)
	}
	require.NoError(t, os.Chmod(p, 0o640))
	_, err = hostauth.LoadKey(p)
	require.ErrorContains(t, err, "chmod 600")
}
