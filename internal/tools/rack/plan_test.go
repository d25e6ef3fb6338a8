package rack

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
)

// TestPlan checks the hosts and configurations a spec yields, without
// touching the system (no root needed).
func TestPlan(t *testing.T) {
	r, err := plan(Spec{
		Name:      "t1",
		Hosts:     []string{"a", "b", "c", "d"},
		OffRack:   []string{"d"},
		Subnet:    netip.MustParsePrefix("10.1.2.0/24"),
		StateRoot: "/s",
		Configure: func(c *config.Config) { c.Monitor.PeerTimeout.Duration = 300e6 },
	})
	require.NoError(t, err)
	require.Equal(t, "t1-br", r.Bridge())
	require.Equal(t, "/dev/shm/ntstack-t1", r.FabricDir())
	links := map[string]map[string]string{}
	for i, h := range r.Hosts() {
		require.Equal(t, i, h.Index)
		require.Equal(t, netip.AddrFrom4([4]byte{10, 1, 2, byte(10 + i)}), h.IP)
		require.Equal(t, fmt.Sprintf("10.77.2.%d", 10+i), h.Address)
		require.Equal(t, "/s/"+h.Name, h.StateDir)
		require.Equal(t, "/s/"+h.Name+"/config.toml", h.ConfigPath)
		require.Equal(t, "t1-"+h.Name, h.Netns)
		require.Equal(t, h.Name == "d", h.OffRack)
		require.Equal(t, int64(300e6), int64(h.Config.Monitor.PeerTimeout.Duration))

		var buf bytes.Buffer
		require.NoError(t, h.Config.Encode(&buf))
		c, err := config.Parse(buf.Bytes())
		require.NoError(t, err, "%s", buf.String())
		require.Len(t, c.Peers, 3)
		// Secure by default: a key per host, each peer's pinned.
		require.Equal(t, "/s/"+h.Name+"/host.key", c.Auth.Key)
		require.False(t, c.Auth.Insecure)
		links[h.Name] = map[string]string{}
		for _, p := range c.Peers {
			links[h.Name][p.Host] = p.Link
			require.Equal(t, r.Host(p.Host).KeyPin, p.Key)
			require.NotEqual(t, h.KeyPin, p.Key)
		}
	}
	require.Equal(t, map[string]map[string]string{
		"a": {"b": "t1-a-b", "c": "t1-a-c", "d": ""},
		"b": {"a": "t1-a-b", "c": "t1-b-c", "d": ""},
		"c": {"a": "t1-a-c", "b": "t1-b-c", "d": ""},
		"d": {"a": "", "b": "", "c": ""},
	}, links)

	r, err = plan(Spec{Hosts: []string{"x", "y", "z"}, Links: [][2]string{{"z", "x"}}})
	require.NoError(t, err)
	require.Regexp(t, `^ntr[0-9a-f]{5}$`, r.Name())
	require.True(t, netip.MustParsePrefix("192.168.0.0/16").Overlaps(r.Subnet()))
	require.Equal(t, 24, r.Subnet().Bits())
	p, _ := r.Host("x").Config.Peer("z")
	require.Equal(t, r.Name()+"-x-z", p.Link)
	p, _ = r.Host("x").Config.Peer("y")
	require.Empty(t, p.Link)

	r, err = plan(Spec{Hosts: []string{"x", "y"}, Links: [][2]string{}})
	require.NoError(t, err)
	p, _ = r.Host("x").Config.Peer("y")
	require.Empty(t, p.Link)

	r, err = plan(Spec{Hosts: []string{"x"}, BinDir: "/opt/nt"})
	require.NoError(t, err)
	require.Equal(t, []string{"/opt/nt/ntproxy", "-config", r.Host("x").ConfigPath}, r.daemons[1].Argv(r.Host("x")))
}

func TestPlanRejects(t *testing.T) {
	two := []string{"a", "b"}
	for want, spec := range map[string]Spec{
		"rack name":             {Name: "Bad", Hosts: two},
		"rack name ":            {Name: "abcdefghijk", Hosts: two},
		"0 hosts":               {},
		"listed twice":          {Hosts: []string{"a", "a"}},
		`host "a/b"`:            {Hosts: []string{"a/b"}},
		"unknown host":          {Hosts: two, Links: [][2]string{{"a", "c"}}},
		"is off-rack":           {Hosts: two, OffRack: []string{"b"}, Links: [][2]string{{"a", "b"}}},
		"to itself":             {Hosts: two, Links: [][2]string{{"a", "a"}}},
		"link a-b listed twice": {Hosts: two, Links: [][2]string{{"a", "b"}, {"b", "a"}}},
		"off-rack host":         {Hosts: two, OffRack: []string{"c"}},
		"both BinDir":           {Hosts: two, BinDir: "/x", Daemons: []Daemon{{Name: "d", Argv: func(*Host) []string { return nil }}}},
		"unique name":           {Hosts: two, Daemons: []Daemon{{Name: "d"}}},
		"no room":               {Hosts: two, Subnet: netip.MustParsePrefix("10.0.0.0/29")},
		"network address":       {Hosts: two, Subnet: netip.MustParsePrefix("10.0.0.1/24")},
		"ACL for unknown":       {Hosts: two, ACL: map[string][]config.Rule{"c": nil}},
		"shorter StateRoot":     {Hosts: two, StateRoot: "/" + strings.Repeat("x", 100)},
		"IPv4 network":          {Hosts: two, Subnet: netip.MustParsePrefix("fd00::/64")},
	} {
		_, err := plan(spec)
		require.ErrorContains(t, err, want)
	}
}
