package ctlapi

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/config"
)

// Path choice: NTB, then RDMA, then TCP, restricted and ordered per host
// (peers.transports) and per connection (ResolveRequest.Transports), each
// choice and each refusal saying why.
func TestPickRoute(t *testing.T) {
	peer := config.Peer{Host: "b", Link: "ab", Fallback: "192.0.2.2:7480"}
	down := "peer b control plane down since 12:00:00 (eof)"
	for _, tc := range []struct {
		name        string
		transports  []string // the peer's
		asked       []string // the connection's
		ntbWhy      string
		path        string
		reason, err string
	}{
		{name: "ntb up", path: "ntb", reason: "rack peer b over NTB link ab"},
		{name: "ntb down: tcp", ntbWhy: down, path: "tcp", reason: down + "; no RDMA provider on this host: TCP fallback 192.0.2.2:7480"},
		{name: "host allows only ntb", transports: []string{"ntb"}, ntbWhy: down,
			err: "no path to b: " + down + "; rdma not allowed for b (peers.transports = [ntb]); tcp not allowed for b (peers.transports = [ntb])"},
		{name: "connection asks tcp first", asked: []string{"tcp", "ntb"}, path: "tcp", reason: "tcp first in the order [tcp ntb]: TCP fallback 192.0.2.2:7480"},
		{name: "connection denies tcp", asked: []string{"ntb", "rdma"}, ntbWhy: down,
			err: "no path to b: " + down + "; no RDMA provider on this host; tcp not asked for by the connection"},
		{name: "host order tcp, ntb", transports: []string{"tcp", "ntb"}, path: "tcp"},
	} {
		p := peer
		p.Transports = tc.transports
		rt, err := PickRoute(p, tc.asked, tc.ntbWhy)
		if tc.err != "" {
			require.Equal(t, CodeNoPath, CodeOf(err), tc.name)
			require.Contains(t, err.Error(), tc.err, tc.name)
			continue
		}
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.path, rt.Path, tc.name)
		require.Contains(t, rt.Reason, tc.reason, tc.name)
	}
}
