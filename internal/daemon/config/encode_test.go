package config

import (
	"bytes"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestEncodeRoundTrip checks that Parse reads back what Encode writes, for
// the commented example and for a sparse configuration Encode fills in.
func TestEncodeRoundTrip(t *testing.T) {
	b, err := os.ReadFile("example.toml")
	require.NoError(t, err)
	want, err := Parse(b)
	require.NoError(t, err)
	uid := -1
	want.ACL = append(want.ACL, Rule{Action: "allow", UID: &uid})
	want.Proxy.SpinBudget.Duration = 20 * time.Microsecond

	var buf bytes.Buffer
	require.NoError(t, want.Encode(&buf))
	got, err := Parse(buf.Bytes())
	require.NoError(t, err, "document:\n%s", buf.String())
	require.Equal(t, want, got)

	sparse := &Config{Host: "b", Peers: []Peer{{Host: "a"}}}
	buf.Reset()
	require.NoError(t, sparse.Encode(&buf))
	got, err = Parse(buf.Bytes())
	require.NoError(t, err, "document:\n%s", buf.String())
	require.Equal(t, DefaultHeartbeat, got.Monitor.Heartbeat.Duration)
	require.Equal(t, DefaultWindow, got.Proxy.Window)
	require.Equal(t, "/run/ntstack/b", got.StateDir)
	require.Nil(t, got.ACL)
	require.Nil(t, got.Peers[0].Addresses)
	require.Zero(t, sparse.Proxy.Window, "Encode must not fill in its receiver")
	t.Logf("sparse:\n%s", buf.String())
}
