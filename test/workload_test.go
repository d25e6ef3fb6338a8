//go:build integration

package test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/tools/rack"
	"github.com/ntstack/ntstack/internal/tools/rackdemo"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// TestRackWorkloads runs the rack-scale workloads between two hosts through
// their daemons — a RESP key-value server under go-redis and a YCSB load,
// net/http serving 8 KiB to 32 MiB files — and the same code over TCP
// through two relays (ntrack relay) and over TCP loopback, every value and
// body verified. The figures are the demo's; here only correctness is
// asserted.
func TestRackWorkloads(t *testing.T) {
	r := startRack(t, rack.Spec{Hosts: []string{"a", "b"}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := rackdemo.Run(ctx, rackdemo.Options{
		ServerHost: r.Host("b").Config, ClientHost: r.Host("a").Config,
		Records: 2000, KVTime: 500 * time.Millisecond, HTTPTime: 500 * time.Millisecond,
		RelayCmd: []string{filepath.Join(daemons(t), "ntrack"), "relay"},
	})
	var out testWriter
	res.Print(&out)
	t.Logf("\n%s", out)
	require.NoError(t, err)
	paths := []string{ctlapi.PathNTB, ctlapi.PathNTB + "-pool", ctlapi.PathNTB + "-direct", rackdemo.RelayPath, ctlapi.PathTCP}
	require.Len(t, res.KV, 2*len(paths))
	require.Len(t, res.HTTP, 3*len(paths))
	for i, k := range res.KV {
		require.Equal(t, paths[i/2], k.Path)
		require.Positive(t, k.Ops, "%s %s", k.Transport, k.Workload)
		require.Zero(t, k.Errors+k.VerifyErrors, "%s %s", k.Transport, k.Workload)
	}
	for i, h := range res.HTTP {
		require.Equal(t, paths[i/3], h.Path)
		require.Positive(t, h.Requests, "%s %d", h.Transport, h.Size)
		require.Zero(t, h.Errors+h.VerifyErrors, "%s %d", h.Transport, h.Size)
	}
}

type testWriter []byte

func (w *testWriter) Write(b []byte) (int, error) { *w = append(*w, b...); return len(b), nil }
func (w testWriter) String() string               { return string(w) }
