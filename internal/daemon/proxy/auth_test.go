package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/wire/appproto"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/internal/wire/hostauth"
	"github.com/ntstack/ntstack/internal/wire/hostauth/hostauthtest"
	"github.com/ntstack/ntstack/rdma"
	"github.com/ntstack/ntstack/socklike"
)

// fallbackRack is newRack with the TCP fallback on both hosts, at
// 127.0.0.<letter>:port; opts, if set, adjusts each host's config.
func fallbackRack(t testing.TB, opts func(cfg *config.Config, o *Options)) (*rack, int) {
	port := 20000 + mrand.IntN(20000)
	return newRackWith(t, opts, fmt.Sprintf(`fallback = "{peer}:%d"`, port), fmt.Sprintf(`fallback = "{self}:%d"`, port)), port
}

// legToken returns the token of b's one leg from a.
func legToken(t *testing.T, s *Server) uint64 {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var tokens []uint64
	for k := range s.legs {
		if k.from == "a" {
			tokens = append(tokens, k.token)
		}
	}
	require.Len(t, tokens, 1)
	return tokens[0]
}

// tlsAs dials addr over TLS with the key in keyFile, checking nothing of
// the server (an attacker's client). The handshake error, if any, is
// returned with a nil connection.
func tlsAs(t *testing.T, addr, keyFile string) (*tls.Conn, error) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	cfg := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
	if keyFile != "" {
		cert, err := hostauth.LoadKey(keyFile)
		require.NoError(t, err)
		cfg.Certificates = []tls.Certificate{cert}
	}
	tc := tls.Client(c, cfg)
	if err := tc.Handshake(); err != nil {
		return nil, err
	}
	return tc, nil
}

// openRefused sends open on c and checks that no DialReply with OK comes
// back: the connection is closed unanswered (want == 0) or refused with
// want.
func openRefused(t *testing.T, c net.Conn, open appproto.RackOpen, want ctlapi.Code) {
	t.Helper()
	err := appproto.WriteFrame(c, open)
	var reply appproto.DialReply
	if err == nil {
		err = appproto.ReadFrame(c, &reply)
	}
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "the proxy neither answered nor closed: %v", err)
	if want == 0 {
		require.Error(t, err, "an unauthenticated open got an answer: %+v", reply)
		return
	}
	require.NoError(t, err)
	require.Equal(t, want, reply.Code, "%+v", reply)
}

func secret(t *testing.T) []byte {
	b := make([]byte, legSecretLen)
	_, err := rand.Read(b)
	require.NoError(t, err)
	return b
}

// TestTakeoverRefused: a host on the rack network cannot resume, read or
// inject into a live leg over the TCP fallback — not without a key, not
// with the wrong key, not with the right host's key and a guessed secret
// — and a refused attempt leaves the victim connection carrying bytes
// as before.
func TestTakeoverRefused(t *testing.T) {
	r, port := fallbackRack(t, nil)
	_, client := echoRack(t, r)
	victims := map[string]net.Conn{}
	for _, path := range []string{ctlapi.PathTCP, ctlapi.PathNTB} {
		c, err := (&socklike.Dialer{Proxy: client, Transports: []string{path}}).Dial("tcp", "b:80")
		require.NoError(t, err)
		defer c.Close()
		require.Equal(t, path, c.(*socklike.Conn).Route().Path)
		roundTrip(t, c, 1, 64<<10)
		victims[path] = c
	}
	r.b.mu.Lock()
	var tokens []uint64
	for k := range r.b.legs {
		tokens = append(tokens, k.token)
	}
	r.b.mu.Unlock()
	require.Len(t, tokens, 2)
	bFallback := fmt.Sprintf("127.0.0.98:%d", port)
	wrongKey := hostauthtest.Keys(t, "a")["a"].Path // names a, is not a's key
	stranger := hostauthtest.Keys(t, "mallory")["mallory"].Path

	for _, token := range tokens {
		resume := appproto.RackOpen{From: "a", Resume: token, RxSeq: 0, Secret: secret(t)}
		t.Run(fmt.Sprintf("token %d", token), func(t *testing.T) {
			// Plain TCP, as the takeover was: the TLS handshake fails.
			c, err := net.Dial("tcp", bFallback)
			require.NoError(t, err)
			defer c.Close()
			require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
			openRefused(t, c, resume, 0)

			// TLS without a certificate, with one naming a but another
			// key, with a stranger's: refused at the handshake, or at the
			// first read (TLS 1.3 checks the client after its Finished).
			for _, key := range []string{"", wrongKey, stranger} {
				tc, err := tlsAs(t, bFallback, key)
				if err == nil {
					openRefused(t, tc, resume, 0)
				}
			}

			// a's own key (a host that holds it, or a itself) but not the
			// leg's secret: refused, with the answer a leg that does not
			// exist gets. Nor does another token, nor no secret.
			for _, open := range []appproto.RackOpen{resume, {From: "a", Resume: token}, {From: "a", Resume: token + 100, Secret: resume.Secret}} {
				tc, err := tlsAs(t, bFallback, r.keys["a"].Path)
				require.NoError(t, err)
				openRefused(t, tc, open, ctlapi.CodeRefused)
			}
		})
	}
	// A new connection as a without a's key never reaches the listener.
	tc, err := tlsAs(t, bFallback, wrongKey)
	if err == nil {
		openRefused(t, tc, appproto.RackOpen{From: "a", Port: 80, Token: 999, Secret: secret(t), Window: 1 << 20}, 0)
	}

	// The victims never noticed: same transports, no move, bytes intact.
	for path, c := range victims {
		for i, size := range []int{1, 64, 4096, 1 << 20} {
			roundTrip(t, c, uint64(10+i), size)
		}
		require.Equal(t, path, c.(*socklike.Conn).Route().Path)
	}
	for _, s := range []*Server{r.a, r.b} {
		snap := s.Snapshot()
		require.Len(t, snap.Conns, 2)
		require.Zero(t, snap.PathSwitches, "a leg moved")
	}

	// The control: a's key and the leg's own secret do move a leg, so
	// the refusals above came from the secret, not from a resume that
	// cannot work.
	var lg *leg
	r.b.mu.Lock()
	for _, l := range r.b.legs {
		lg = l
	}
	r.b.mu.Unlock()
	tc, err = tlsAs(t, bFallback, r.keys["a"].Path)
	require.NoError(t, err)
	require.NoError(t, appproto.WriteFrame(tc, appproto.RackOpen{From: "a", Resume: lg.key.token, Secret: lg.secret}))
	var reply appproto.DialReply
	require.NoError(t, appproto.ReadFrame(tc, &reply))
	require.Equal(t, ctlapi.OK, reply.Code, "%+v", reply)
}

// recorder is a TCP relay that keeps what passes from its clients to to.
type recorder struct {
	ln   net.Listener
	to   string
	mu   sync.Mutex
	seen bytes.Buffer
}

func (r *recorder) run() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			up, err := net.Dial("tcp", r.to)
			if err != nil {
				return
			}
			defer up.Close()
			go func() { io.Copy(c, up); c.Close() }()
			buf := make([]byte, 64<<10)
			for {
				n, err := c.Read(buf)
				r.mu.Lock()
				r.seen.Write(buf[:n])
				r.mu.Unlock()
				if _, werr := up.Write(buf[:n]); err != nil || werr != nil {
					return
				}
			}
		}()
	}
}

// TestFallbackEncrypted: what a leg carries over the TCP fallback is not
// readable on the network between the proxies.
func TestFallbackEncrypted(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.97:0")
	require.NoError(t, err)
	defer ln.Close()
	rec := &recorder{ln: ln}
	r, port := fallbackRack(t, func(cfg *config.Config, o *Options) {
		if cfg.Host == "a" {
			cfg.Peers[0].Fallback = ln.Addr().String() // a reaches b through the recorder
		}
	})
	rec.to = fmt.Sprintf("127.0.0.98:%d", port)
	go rec.run()
	_, client := echoRack(t, r)
	c, err := (&socklike.Dialer{Proxy: client, Transports: []string{ctlapi.PathTCP}}).Dial("tcp", "b:80")
	require.NoError(t, err)
	defer c.Close()
	marker := []byte("ntstack plaintext that must not be seen on the wire; ")
	msg := bytes.Repeat(marker, (256<<10)/len(marker))
	errc := make(chan error, 1)
	go func() { _, err := c.Write(msg); errc <- err }()
	got := make([]byte, len(msg))
	_, err = io.ReadFull(c, got)
	require.NoError(t, err)
	require.NoError(t, <-errc)
	require.Equal(t, msg, got)

	rec.mu.Lock()
	seen := bytes.Clone(rec.seen.Bytes())
	rec.mu.Unlock()
	require.Greater(t, len(seen), len(msg), "the leg went through the recorder")
	require.Equal(t, byte(0x16), seen[0], "a TLS handshake record first")
	require.False(t, bytes.Contains(seen, marker[:16]), "plaintext on the wire")
}

// TestRDMATakeoverRefused: the RDMA listener's bootstrap is authenticated
// as the fallback is: a host without a peer's key gets no connection to
// open or resume a leg on, and a's key with a guessed secret resumes
// nothing; the victim carries on.
func TestRDMATakeoverRefused(t *testing.T) {
	r := rdmaRack(t)
	_, client := echoRack(t, r)
	c, err := (&socklike.Dialer{Proxy: client, Transports: []string{ctlapi.PathRDMA}}).Dial("tcp", "b:80")
	require.NoError(t, err)
	defer c.Close()
	roundTrip(t, c, 1, 64<<10)
	token := legToken(t, r.b)
	addr := r.cb.Proxy.RDMA.Listen
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resume := appproto.RackOpen{From: "a", Resume: token, Secret: secret(t)}

	provider := func(self string, key hostauthtest.Key) *rdma.TCP {
		cert, err := hostauth.LoadKey(key.Path)
		require.NoError(t, err)
		a, err := hostauth.New(self, cert, map[string]string{"b": r.keys["b"].Pin}, nil)
		require.NoError(t, err)
		return rdma.NewTCP(rdma.Config{Auth: a})
	}
	for name, p := range map[string]*rdma.TCP{
		"plain":     rdma.NewTCP(rdma.Config{HandshakeTimeout: 5 * time.Second}),
		"stranger":  provider("mallory", hostauthtest.Keys(t, "mallory")["mallory"]),
		"wrong key": provider("a", hostauthtest.Keys(t, "a")["a"]),
	} {
		t.Run(name, func(t *testing.T) {
			ac, err := p.DialHost(ctx, addr, "b")
			if err != nil {
				return // refused at the bootstrap
			}
			defer ac.Close()
			require.NoError(t, ac.SetDeadline(time.Now().Add(10*time.Second)))
			openRefused(t, ac, resume, 0)
		})
	}
	ac, err := provider("a", r.keys["a"]).DialHost(ctx, addr, "b")
	require.NoError(t, err)
	defer ac.Close()
	require.NoError(t, ac.SetDeadline(time.Now().Add(10*time.Second)))
	openRefused(t, ac, resume, ctlapi.CodeRefused)

	for i, size := range []int{1, 4096, 1 << 20} {
		roundTrip(t, c, uint64(20+i), size)
	}
	require.Equal(t, ctlapi.PathRDMA, c.(*socklike.Conn).Route().Path)
	require.Zero(t, r.b.Snapshot().PathSwitches)
}

// TestNoKeyNoStart: ntproxy without a host key refuses to start unless
// the configuration says insecure; insecure, its legs are plain TCP and
// still need their secrets to resume.
func TestNoKeyNoStart(t *testing.T) {
	cfg, err := config.Parse([]byte("host = \"a\"\nstate_dir = \"/nonexistent\"\n[[peers]]\nhost = \"b\"\n"))
	require.NoError(t, err)
	_, err = New(cfg, Options{})
	require.ErrorContains(t, err, "has no key (auth.key)")

	r, port := fallbackRack(t, func(cfg *config.Config, o *Options) {
		cfg.Auth = config.Auth{Insecure: true}
		cfg.Peers[0].Key = ""
	})
	_, client := echoRack(t, r)
	c, err := (&socklike.Dialer{Proxy: client, Transports: []string{ctlapi.PathTCP}}).Dial("tcp", "b:80")
	require.NoError(t, err)
	defer c.Close()
	roundTrip(t, c, 1, 4096)
	raw, err := net.Dial("tcp", fmt.Sprintf("127.0.0.98:%d", port))
	require.NoError(t, err)
	defer raw.Close()
	require.NoError(t, raw.SetDeadline(time.Now().Add(10*time.Second)))
	openRefused(t, raw, appproto.RackOpen{From: "a", Resume: legToken(t, r.b), Secret: secret(t)}, ctlapi.CodeRefused)
	roundTrip(t, c, 2, 4096)
	require.Zero(t, r.b.Snapshot().PathSwitches)
}
