// Package hostauthtest makes host keys for tests: one per host name, in a
// test's temporary directory, with the pins their peers' configurations
// hold.
package hostauthtest

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/ntstack/ntstack/internal/wire/hostauth"
)

// Key is one host's key file and its pin.
type Key struct {
	Path string
	Pin  string
}

// Keys writes a key for each host into a directory removed at the end of
// the test.
func Keys(t testing.TB, hosts ...string) map[string]Key {
	t.Helper()
	dir, err := os.MkdirTemp("", "hostkeys")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	keys := map[string]Key{}
	for _, h := range hosts {
		p := filepath.Join(dir, h+".key")
		pin, err := hostauth.WriteKey(p, h)
		if err != nil {
			t.Fatal(err)
		}
		keys[h] = Key{Path: p, Pin: pin}
	}
	return keys
}

// Rack is a rack CA in a directory, issuing host keys on demand: a test
// configures auth.ca = CAFile and auth.key = Key(host) and needs no pins.
type Rack struct {
	dir    string
	ca     *hostauth.CA
	CAFile string

	mu   sync.Mutex
	keys map[string]string // host → key file
}

// NewRack makes a CA in a new directory under dir ("" = the system's
// temporary directory); Remove deletes it.
func NewRack(dir string) (*Rack, error) {
	d, err := os.MkdirTemp(dir, "rackca")
	if err != nil {
		return nil, err
	}
	ca, pemCA, err := hostauth.NewCA("test rack CA")
	if err != nil {
		return nil, err
	}
	r := &Rack{dir: d, ca: ca, CAFile: filepath.Join(d, "ca.pem"), keys: map[string]string{}}
	if err := os.WriteFile(r.CAFile, pemCA, 0o644); err != nil {
		return nil, err
	}
	return r, nil
}

// Key returns the file of host's CA-signed key, made at the first call.
func (r *Rack) Key(t testing.TB, host string) string {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if p, ok := r.keys[host]; ok {
		return p
	}
	b, err := r.ca.Sign(host)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(r.dir, host+".key")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	r.keys[host] = p
	return p
}

// Remove deletes the rack's directory.
func (r *Rack) Remove() { _ = os.RemoveAll(r.dir) }
