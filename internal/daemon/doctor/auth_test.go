package doctor

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/wire/hostauth/hostauthtest"
)

func TestCheckAuth(t *testing.T) {
	keys := hostauthtest.Keys(t, "a", "b")
	check := func(auth config.Auth, pin string) Result {
		cfg := &config.Config{Host: "a", Auth: auth, Peers: []config.Peer{{Host: "b", Key: pin}}}
		return (&host{opts: Options{Config: cfg}}).checkAuth()
	}

	r := check(config.Auth{Insecure: true}, "")
	require.Equal(t, Warn, r.Status)
	require.Contains(t, r.Detail, "WARNING: INSECURE")
	require.Contains(t, r.Fix, "ntmon keygen -host a")

	r = check(config.Auth{}, "")
	require.Equal(t, Fail, r.Status)
	require.Contains(t, r.Detail, "refuse to start")

	r = check(config.Auth{Key: keys["a"].Path}, keys["b"].Pin)
	require.Equal(t, Pass, r.Status, r.Detail)
	require.Contains(t, r.Detail, "key "+keys["a"].Pin+"; 1 of 1 peers pinned")

	r = check(config.Auth{Key: keys["a"].Path}, "")
	require.Equal(t, Fail, r.Status)
	require.Contains(t, r.Detail, "peer b: no key pinned and no rack CA")

	require.NoError(t, os.Chmod(keys["a"].Path, 0o644))
	r = check(config.Auth{Key: keys["a"].Path}, keys["b"].Pin)
	require.Equal(t, Fail, r.Status)
	require.Contains(t, r.Detail, "lets others read the private key")
}
