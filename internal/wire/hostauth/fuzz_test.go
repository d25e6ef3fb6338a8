package hostauth_test

import (
	"testing"

	"github.com/ntstack/ntstack/internal/wire/hostauth"
)

// FuzzParsePin: a pin comes from a configuration file; no input panics.
func FuzzParsePin(f *testing.F) {
	f.Add("ed25519:NAlI/H2S36tCN+4OCGtXzaQSMheAfeJZB5rJjEHx3QE=")
	f.Add("sha256:47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=")
	f.Add("ed25519:")
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = hostauth.ParsePin(s)
	})
}
