package config

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestExampleParses(t *testing.T) {
	b, err := os.ReadFile("example.toml")
	require.NoError(t, err)
	c, err := Parse(b)
	require.NoError(t, err)
	require.Equal(t, "a", c.Host)
	require.Equal(t, 500*time.Millisecond, c.Monitor.Heartbeat.Duration)
	require.Len(t, c.Peers, 1)
	require.Equal(t, "rack-a-b", c.Peers[0].Link)
	require.Equal(t, "/etc/ntstack/a.key", c.Auth.Key)
	require.True(t, c.Secure())

	host, ok := c.HostOf("10.77.0.2")
	require.True(t, ok)
	require.Equal(t, "b", host)
	_, ok = c.HostOf("10.77.0.9")
	require.False(t, ok)

	ok, rule := c.Allowed("out", 1000, "b", 6379)
	require.False(t, ok)
	require.Equal(t, 0, rule)
	ok, _ = c.Allowed("out", 0, "b", 6379)
	require.True(t, ok, "rule 0 names uid 1000 only")
	ok, rule = c.Allowed("in", 0, "c", 22)
	require.False(t, ok)
	require.Equal(t, 1, rule)
	ok, rule = c.Allowed("in", 0, "b", 22)
	require.True(t, ok)
	require.Equal(t, -1, rule)
}

func TestParseRejects(t *testing.T) {
	for name, doc := range map[string]string{
		"no host":         ``,
		"unknown key":     "host = \"a\"\nbogus = 1\n",
		"self as peer":    "host = \"a\"\n[[peers]]\nhost = \"a\"\n",
		"address twice":   "host = \"a\"\naddresses = [\"x\"]\n[[peers]]\nhost = \"b\"\naddresses = [\"x\"]\n",
		"link twice":      "host = \"a\"\n[[peers]]\nhost = \"b\"\nlink = \"l\"\n[[peers]]\nhost = \"c\"\nlink = \"l\"\n",
		"bad action":      "host = \"a\"\n[[acl]]\naction = \"maybe\"\n",
		"bad window":      "host = \"a\"\n[proxy]\nwindow = 100\n",
		"bad duration":    "host = \"a\"\n[monitor]\nheartbeat = \"soon\"\n",
		"bad control":     "host = \"a\"\n[[peers]]\nhost = \"b\"\ncontrol = \"nohostport\"\n",
		"too many parts":  "host = \"a\"\n[proxy]\npartitions = 31\n",
		"bad quota":       "host = \"a\"\n[quota]\nmemory = -2\n",
		"quota uid twice": "host = \"a\"\n[[quota.uid]]\nuid = 7\nmemory = 1\n[[quota.uid]]\nuid = 7\nmemory = 2\n",
		"bad pin":         "host = \"a\"\n[[peers]]\nhost = \"b\"\nkey = \"ed25519:short\"\n",
		"unknown pin":     "host = \"a\"\n[[peers]]\nhost = \"b\"\nkey = \"rsa:AAAA\"\n",
	} {
		_, err := Parse([]byte(doc))
		require.Error(t, err, name)
	}
}

func TestQuota(t *testing.T) {
	c, err := Parse([]byte("host = \"a\"\n"))
	require.NoError(t, err)
	require.EqualValues(t, DefaultQuotaMemory, c.Quota.MemoryOf(1000))
	require.EqualValues(t, NoLimit, c.Quota.MemoryOf(0), "root is not bounded by default")

	b, err := os.ReadFile("example.toml")
	require.NoError(t, err)
	c, err = Parse(b)
	require.NoError(t, err)
	require.EqualValues(t, 1<<30, c.Quota.MemoryOf(1001))
	require.EqualValues(t, 256<<20, c.Quota.MemoryOf(1000))

	c, err = Parse([]byte("host = \"a\"\n[quota]\nmemory = -1\n[[quota.uid]]\nuid = 0\nmemory = 4096\n"))
	require.NoError(t, err)
	require.EqualValues(t, NoLimit, c.Quota.MemoryOf(1000))
	require.EqualValues(t, 4096, c.Quota.MemoryOf(0), "root is bounded when named")
}
