// Package hostauth is the identity of a rack host and the mutual
// authentication of every channel between hosts: ntmon's peer sessions,
// the proxies' fallback legs and the RDMA bootstrap all run TLS 1.3 with
// the tls.Config this package builds, and learn who is at the other end
// only from the certificate it verified — never from a name the peer
// writes in a message.
//
// A host key is an ed25519 private key and a self-signed certificate that
// names the host (subject common name and DNS name), in one PEM file of
// mode 0600 (Generate, WriteKey, LoadKey). A peer is trusted when its
// certificate's public key matches the pin its configuration entry holds
// (Pin: "ed25519:<base64 of the raw key>" or "sha256:<base64 of the
// SHA-256 of the SubjectPublicKeyInfo>"), or, for a peer without a pin,
// when a rack CA the host trusts signed a certificate naming it. Either
// way the certificate must name the configured host it is taken for.
//
// Concurrency: an Auth is immutable after New and safe for concurrent use;
// the tls.Configs it returns may be shared.
package hostauth

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"slices"
	"strings"
	"time"
)

// ErrNotAuthenticated is matched (errors.Is) by every refusal of a peer's
// certificate: no certificate, a key no pin or CA vouches for, or a
// certificate naming another host.
var ErrNotAuthenticated = errors.New("peer not authenticated")

// Pin prefixes.
const (
	pinEd25519 = "ed25519:"
	pinSHA256  = "sha256:"
)

// Pin is a peer's pinned public key.
type Pin struct {
	ed25519 ed25519.PublicKey // set for an "ed25519:" pin
	spki    []byte            // SHA-256 of the SPKI, for a "sha256:" pin
}

// ParsePin parses "ed25519:<base64>" (the 32-byte raw public key) or
// "sha256:<base64>" (the SHA-256 of the DER SubjectPublicKeyInfo).
func ParsePin(s string) (Pin, error) {
	switch {
	case strings.HasPrefix(s, pinEd25519):
		b, err := base64.StdEncoding.DecodeString(s[len(pinEd25519):])
		if err != nil || len(b) != ed25519.PublicKeySize {
			return Pin{}, fmt.Errorf("parse pin %.80q: want %s and the base64 of a %d-byte key", s, pinEd25519, ed25519.PublicKeySize)
		}
		return Pin{ed25519: ed25519.PublicKey(b)}, nil
	case strings.HasPrefix(s, pinSHA256):
		b, err := base64.StdEncoding.DecodeString(s[len(pinSHA256):])
		if err != nil || len(b) != sha256.Size {
			return Pin{}, fmt.Errorf("parse pin %.80q: want %s and the base64 of a %d-byte digest", s, pinSHA256, sha256.Size)
		}
		return Pin{spki: b}, nil
	}
	return Pin{}, fmt.Errorf("parse pin %.80q: want %q or %q followed by base64", s, pinEd25519, pinSHA256)
}

func (p Pin) zero() bool { return p.ed25519 == nil && p.spki == nil }

// Matches reports whether cert carries the pinned key.
func (p Pin) Matches(cert *x509.Certificate) bool {
	if p.ed25519 != nil {
		k, ok := cert.PublicKey.(ed25519.PublicKey)
		return ok && k.Equal(p.ed25519)
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return len(p.spki) == sha256.Size && bytes.Equal(sum[:], p.spki)
}

// PinOf returns the pin of cert's key: "ed25519:" for an ed25519 key,
// "sha256:" of its SPKI for any other.
func PinOf(cert *x509.Certificate) string {
	if k, ok := cert.PublicKey.(ed25519.PublicKey); ok {
		return pinEd25519 + base64.StdEncoding.EncodeToString(k)
	}
	sum := sha256.Sum256(cert.RawSubjectPublicKeyInfo)
	return pinSHA256 + base64.StdEncoding.EncodeToString(sum[:])
}

// certLifetime is a generated certificate's validity: host keys are
// replaced by an operator, not by expiry, and a pin names the key, not the
// certificate.
const certLifetime = 100 * 365 * 24 * time.Hour

// Generate makes a host key for host: an ed25519 key and a self-signed
// certificate naming host, PEM-encoded (PRIVATE KEY, then CERTIFICATE),
// and the key's pin.
func Generate(host string) (pemBytes []byte, pin string, err error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, "", fmt.Errorf("generate host key: %w", err)
	}
	return NewKey(host, priv)
}

// NewKey is Generate with a given private key: its self-signed
// certificate naming host, both PEM-encoded, and the key's pin.
func NewKey(host string, priv ed25519.PrivateKey) (pemBytes []byte, pin string, err error) {
	pub := priv.Public().(ed25519.PublicKey)
	der, err := createCert(host, pub, nil, priv)
	if err != nil {
		return nil, "", err
	}
	p8, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, "", fmt.Errorf("generate host key: %w", err)
	}
	var b bytes.Buffer
	_ = pem.Encode(&b, &pem.Block{Type: "PRIVATE KEY", Bytes: p8})
	_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	cert, _ := x509.ParseCertificate(der)
	return b.Bytes(), PinOf(cert), nil
}

// createCert makes a certificate naming host for pub, signed by signer
// (with parent as the issuer; nil: self-signed).
func createCert(host string, pub ed25519.PublicKey, parent *x509.Certificate, signer any) ([]byte, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("certificate for %s: %w", host, err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: host},
		DNSNames:     []string{host},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(certLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if parent == nil {
		parent = tmpl
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, signer)
	if err != nil {
		return nil, fmt.Errorf("certificate for %s: %w", host, err)
	}
	return der, nil
}

// WriteKey generates a host key for host into path (mode 0600; an
// existing file is never overwritten) and returns its pin.
func WriteKey(path, host string) (string, error) {
	b, pin, err := Generate(host)
	if err != nil {
		return "", err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("write host key: %w", err)
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
		return "", fmt.Errorf("write host key %s: %w", path, err)
	}
	return pin, nil
}

// LoadKey reads a host key file: a private key and its certificate, PEM.
// The file must not be readable by group or others.
func LoadKey(path string) (tls.Certificate, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("load host key: %w", err)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return tls.Certificate{}, fmt.Errorf("load host key %s: mode %v lets others read the private key (chmod 600)", path, fi.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("load host key: %w", err)
	}
	cert, err := tls.X509KeyPair(b, b)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("load host key %s: %w", path, err)
	}
	return cert, nil
}

// LoadCA reads a PEM file of one or more CA certificates.
func LoadCA(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load rack CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, fmt.Errorf("load rack CA %s: no PEM certificate in it", path)
	}
	return pool, nil
}

// Auth is one host's identity and the peers it trusts.
type Auth struct {
	host string
	cert tls.Certificate
	leaf *x509.Certificate
	pins map[string]Pin // by configured peer host; the zero Pin: vouched for by ca
	ca   *x509.CertPool // nil: pins only
}

// New returns host's Auth: cert is its key; pins maps each peer host to
// its pin ("" or absent: vouched for by ca). Every peer needs a pin or a
// CA; a peer whose pin does not parse is an error.
func New(host string, cert tls.Certificate, peers map[string]string, ca *x509.CertPool) (*Auth, error) {
	leaf := cert.Leaf
	if leaf == nil {
		if len(cert.Certificate) == 0 {
			return nil, fmt.Errorf("host key of %s: no certificate", host)
		}
		var err error
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, fmt.Errorf("host key of %s: %w", host, err)
		}
	}
	if !names(leaf, host) {
		return nil, fmt.Errorf("host key of %s: its certificate names %s, not %s", host, certName(leaf), host)
	}
	a := &Auth{host: host, cert: cert, leaf: leaf, pins: map[string]Pin{}, ca: ca}
	var errs []error
	for peer, s := range peers {
		if s == "" {
			if ca == nil {
				errs = append(errs, fmt.Errorf("peer %s: no key pinned and no rack CA", peer))
			}
			a.pins[peer] = Pin{}
			continue
		}
		p, err := ParsePin(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("peer %s: %w", peer, err))
			continue
		}
		a.pins[peer] = p
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	a.cert.Leaf = leaf
	return a, nil
}

// Host is this host's name.
func (a *Auth) Host() string { return a.host }

// Pin is this host's own pin, as its peers' configurations hold it.
func (a *Auth) Pin() string { return PinOf(a.leaf) }

// names reports whether cert names host (as its common name or a DNS name).
func names(cert *x509.Certificate, host string) bool {
	return cert.Subject.CommonName == host || slices.Contains(cert.DNSNames, host)
}

func certName(cert *x509.Certificate) string {
	if cert.Subject.CommonName != "" {
		return cert.Subject.CommonName
	}
	return strings.Join(cert.DNSNames, ",")
}

// trusted reports whether host is a peer and chain (leaf first) proves
// it: the leaf names host, and its key matches host's pin or, for a peer
// without a pin, ca verifies the chain for host.
func (a *Auth) trusted(host string, chain []*x509.Certificate) error {
	leaf := chain[0]
	if host == a.host {
		return fmt.Errorf("%w: certificate names this host (%s)", ErrNotAuthenticated, host)
	}
	if !names(leaf, host) {
		return fmt.Errorf("%w: certificate names %.64q, not %s", ErrNotAuthenticated, certName(leaf), host)
	}
	p, ok := a.pins[host]
	if !ok {
		return fmt.Errorf("%w: %s is not a configured peer of %s", ErrNotAuthenticated, host, a.host)
	}
	if !p.zero() {
		if !p.Matches(leaf) {
			return fmt.Errorf("%w: %s's key %s is not the one pinned for it", ErrNotAuthenticated, host, PinOf(leaf))
		}
		return nil
	}
	if a.ca == nil {
		return fmt.Errorf("%w: %s has no pinned key and there is no rack CA", ErrNotAuthenticated, host)
	}
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: a.ca, Intermediates: inter, DNSName: host,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrNotAuthenticated, host, err)
	}
	return nil
}

// isPeer reports whether host is one of the configured peers.
func (a *Auth) isPeer(host string) bool {
	_, ok := a.pins[host]
	return ok
}

// identify returns the configured peer chain proves, trying each name its
// leaf carries.
func (a *Auth) identify(chain []*x509.Certificate) (string, error) {
	if len(chain) == 0 {
		return "", fmt.Errorf("%w: no certificate", ErrNotAuthenticated)
	}
	leaf := chain[0]
	cands := append([]string{leaf.Subject.CommonName}, leaf.DNSNames...)
	var first error
	for _, h := range cands {
		if h == "" || !a.isPeer(h) {
			continue
		}
		err := a.trusted(h, chain)
		if err == nil {
			return h, nil
		}
		if first == nil {
			first = err
		}
	}
	if first == nil {
		first = fmt.Errorf("%w: certificate names %.64q, no configured peer of %s", ErrNotAuthenticated, certName(leaf), a.host)
	}
	return "", first
}

// base is the tls.Config both sides share: TLS 1.3 only, this host's key,
// and chain verification left to VerifyConnection (pins are not chains).
func (a *Auth) base() *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		Certificates:       []tls.Certificate{a.cert},
		InsecureSkipVerify: true, // VerifyConnection checks the pin or the CA
	}
}

// ServerConfig accepts connections from any configured peer; the peer's
// identity is PeerHost of the connection.
func (a *Auth) ServerConfig() *tls.Config {
	c := a.base()
	c.ClientAuth = tls.RequireAnyClientCert
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		_, err := a.identify(cs.PeerCertificates)
		return err
	}
	return c
}

// ClientConfig connects to peer and to nothing else: the server must
// prove to be that configured host.
func (a *Auth) ClientConfig(peer string) *tls.Config {
	c := a.base()
	c.ServerName = peer
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return fmt.Errorf("%w: no certificate", ErrNotAuthenticated)
		}
		return a.trusted(peer, cs.PeerCertificates)
	}
	return c
}

// PeerHost returns the host a completed handshake authenticated.
func (a *Auth) PeerHost(c *tls.Conn) (string, error) {
	return a.identify(c.ConnectionState().PeerCertificates)
}

// Server runs the server side of the handshake on c (bounded by c's
// deadline) and returns the connection with the peer host it proved.
func (a *Auth) Server(c net.Conn) (*tls.Conn, string, error) {
	tc := tls.Server(c, a.ServerConfig())
	if err := tc.Handshake(); err != nil {
		return nil, "", fmt.Errorf("tls handshake with %s: %w", c.RemoteAddr(), err)
	}
	host, err := a.PeerHost(tc)
	if err != nil {
		return nil, "", err
	}
	return tc, host, nil
}

// Client runs the client side of the handshake on c, to peer (bounded by
// c's deadline).
func (a *Auth) Client(c net.Conn, peer string) (*tls.Conn, error) {
	tc := tls.Client(c, a.ClientConfig(peer))
	if err := tc.Handshake(); err != nil {
		return nil, fmt.Errorf("tls handshake with %s at %s: %w", peer, c.RemoteAddr(), err)
	}
	return tc, nil
}

// CA is a rack certificate authority, for racks that sign host keys
// instead of pinning each: NewCA makes one, Sign issues a host's key,
// KeyPEM and LoadCAKey keep it in a file (best kept off the rack).
type CA struct {
	cert *x509.Certificate
	key  ed25519.PrivateKey
}

// KeyPEM is the CA's private key and certificate, as LoadCAKey reads them.
func (ca *CA) KeyPEM() ([]byte, error) {
	p8, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	_ = pem.Encode(&b, &pem.Block{Type: "PRIVATE KEY", Bytes: p8})
	_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})
	return b.Bytes(), nil
}

// CertPEM is the CA's certificate, the file hosts name as auth.ca.
func (ca *CA) CertPEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})
}

// LoadCAKey reads a CA's key file (KeyPEM; mode 0600, as LoadKey wants).
func LoadCAKey(path string) (*CA, error) {
	c, err := LoadKey(path)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("load CA key %s: %w", path, err)
	}
	key, ok := c.PrivateKey.(ed25519.PrivateKey)
	if !ok || !cert.IsCA {
		return nil, fmt.Errorf("load CA key %s: not an ed25519 CA certificate and key", path)
	}
	return &CA{cert: cert, key: key}, nil
}

// NewCA makes a CA and returns it with its certificate in PEM.
func NewCA(name string) (*CA, []byte, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate CA key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: name},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(certLifetime),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, priv)
	if err != nil {
		return nil, nil, fmt.Errorf("create CA certificate: %w", err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &CA{cert: cert, key: priv}, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), nil
}

// Sign makes a host key for host, its certificate signed by ca, in the
// format LoadKey reads.
func (ca *CA) Sign(host string) ([]byte, error) {
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate host key: %w", err)
	}
	der, err := createCert(host, pub, ca.cert, ca.key)
	if err != nil {
		return nil, err
	}
	p8, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	_ = pem.Encode(&b, &pem.Block{Type: "PRIVATE KEY", Bytes: p8})
	_ = pem.Encode(&b, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	return b.Bytes(), nil
}
