package ctlapi

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Path choice: NTB, then RDMA, then TCP, restricted and ordered per host
// (peers.transports) and per connection (ResolveRequest.Transports), each
// choice and each refusal saying why, and the hops a connection may move
// between.
func TestPickRoute(t *testing.T) {
	peer := Paths{Host: "b", Link: "ab", Fallback: "192.0.2.2:7480"}
	down := "peer b control plane down since 12:00:00 (eof)"
	noRDMA := "no RDMA on this host: verbs provider: built without the verbs tag"
	rdma := Reach{RDMAAddr: "198.51.100.2:7490"}
	ntb, rd, tcp := Hop{"ntb", "ab"}, Hop{"rdma", "198.51.100.2:7490"}, Hop{"tcp", "192.0.2.2:7480"}
	for _, tc := range []struct {
		name        string
		offRack     bool     // the peer has no NTB link
		transports  []string // the peer's
		asked       []string // the connection's
		reach       Reach
		path        string
		reason, err string
		hops        []Hop
	}{
		{name: "ntb up", reach: Reach{RDMAWhy: noRDMA}, path: "ntb", reason: "rack peer b over NTB link ab", hops: []Hop{ntb, tcp}},
		{name: "ntb up, rdma too", reach: rdma, path: "ntb", hops: []Hop{ntb, rd, tcp}},
		{name: "control plane down: ntb, noted", reach: Reach{NTBNote: down + ", the link's own state decides", RDMAWhy: noRDMA}, path: "ntb",
			reason: "rack peer b over NTB link ab; " + down + ", the link's own state decides", hops: []Hop{ntb, tcp}},
		{name: "ntb down: tcp", reach: Reach{NTBWhy: down, RDMAWhy: noRDMA}, path: "tcp",
			reason: down + "; " + noRDMA + ": TCP fallback 192.0.2.2:7480", hops: []Hop{ntb, tcp}},
		{name: "ntb down: rdma", reach: Reach{NTBWhy: down, RDMAAddr: rd.Addr}, path: "rdma",
			reason: down + ": RDMA 198.51.100.2:7490", hops: []Hop{ntb, rd, tcp}},
		{name: "off-rack: rdma", offRack: true, reach: Reach{NTBWhy: "no NTB link to b", RDMAAddr: rd.Addr}, path: "rdma",
			reason: "no NTB link to b: RDMA 198.51.100.2:7490", hops: []Hop{rd, tcp}},
		{name: "host allows only ntb", transports: []string{"ntb"}, reach: Reach{NTBWhy: down, RDMAAddr: rd.Addr},
			err: "no path to b: " + down + "; rdma not allowed for b (peers.transports = [ntb]); tcp not allowed for b (peers.transports = [ntb])"},
		{name: "connection asks tcp first", asked: []string{"tcp", "ntb"}, reach: rdma, path: "tcp",
			reason: "tcp first in the order [tcp ntb]: TCP fallback 192.0.2.2:7480", hops: []Hop{tcp, ntb}},
		{name: "connection denies tcp", asked: []string{"ntb", "rdma"}, reach: Reach{NTBWhy: down, RDMAWhy: noRDMA},
			err: "no path to b: " + down + "; " + noRDMA + "; tcp not asked for by the connection"},
		{name: "host order tcp, ntb", transports: []string{"tcp", "ntb"}, reach: rdma, path: "tcp", hops: []Hop{tcp, ntb}},
	} {
		p := peer
		p.Transports = tc.transports
		if tc.offRack {
			p.Link = ""
		}
		rt, err := PickRoute(p, tc.asked, tc.reach)
		if tc.err != "" {
			require.Equal(t, CodeNoPath, CodeOf(err), tc.name)
			require.Contains(t, err.Error(), tc.err, tc.name)
			continue
		}
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.path, rt.Path, tc.name)
		require.Contains(t, rt.Reason, tc.reason, tc.name)
		require.Equal(t, tc.hops, rt.Hops, tc.name)
		require.Equal(t, tc.path, rt.Hops[indexOf(rt.Hops, tc.path)].Path, tc.name)
	}
}

func indexOf(hops []Hop, path string) int {
	for i, h := range hops {
		if h.Path == path {
			return i
		}
	}
	return -1
}
