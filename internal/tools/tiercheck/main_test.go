package main

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The module in testdata/tree holds one deliberately wrong import (ntb/shm,
// tier link, imports socklike, tier api) and one made by a test (ntb's
// external test imports socklike); its other imports go down a tier or
// more and must pass.
func TestTreeRejectsUpwardImport(t *testing.T) {
	module, pkgs, err := List(filepath.Join("testdata", "tree"), "./...")
	require.NoError(t, err)
	require.Equal(t, "example.com/tree", module)
	require.Len(t, pkgs, 5)
	require.Equal(t, []Violation{
		{From: "ntb", To: "socklike", Test: true, Why: "tier link may not import tier api"},
		{From: "ntb/shm", To: "socklike", Why: "tier link may not import tier api"},
	}, Check(module, pkgs))
}

// TestRepositoryTiers holds this module to the rule, as make lint does.
func TestRepositoryTiers(t *testing.T) {
	module, pkgs, err := List(filepath.Join("..", "..", ".."), "./...")
	require.NoError(t, err)
	require.Equal(t, "github.com/ntstack/ntstack", module)
	for _, v := range Check(module, pkgs) {
		t.Error(v)
	}
}

func TestCheckGraph(t *testing.T) {
	const m = "example.com/m"
	pkg := func(path string, imports, tests []string) Package {
		return Package{ImportPath: m + "/" + path, Imports: imports, XTestImports: tests}
	}
	for _, tc := range []struct {
		name string
		pkg  Package
		want []Violation
	}{
		{name: "down two tiers", pkg: pkg("socklike", []string{m + "/ntb/shm", m + "/internal/prim/ring"}, nil)},
		{name: "same tier", pkg: pkg("internal/prim/pool", []string{m + "/internal/prim/shmem", m + "/vfio"}, nil)},
		{name: "outside the module", pkg: pkg("vfio", []string{"golang.org/x/sys/unix", "fmt", "example.com/other/socklike"}, nil)},
		{name: "top tier imports anything", pkg: pkg("cmd/ntmon", []string{m + "/internal/daemon/monitor", m + "/internal/tools/rack"}, nil)},
		{name: "wire imports daemon", pkg: pkg("internal/wire/ctlapi", []string{m + "/internal/daemon/config"}, nil),
			want: []Violation{{From: "internal/wire/ctlapi", To: "internal/daemon/config", Why: "tier link may not import tier daemon"}}},
		{name: "primitive imports transport", pkg: pkg("internal/prim/ring", []string{m + "/internal/transport"}, nil),
			want: []Violation{{From: "internal/prim/ring", To: "internal/transport", Why: "tier prim may not import tier transport"}}},
		{name: "test imports upward", pkg: pkg("rdma", nil, []string{m + "/internal/daemon/proxy"}),
			want: []Violation{{From: "rdma", To: "internal/daemon/proxy", Test: true, Why: "tier transport may not import tier daemon"}}},
		{name: "test exception", pkg: pkg("ntb/ivshmem", nil, []string{m + "/internal/transport"})},
		{name: "an exception is for tests only", pkg: pkg("ntb/ivshmem", []string{m + "/internal/transport"}, nil),
			want: []Violation{{From: "ntb/ivshmem", To: "internal/transport", Why: "tier link may not import tier transport"}}},
		{name: "untiered package", pkg: pkg("misc", nil, nil),
			want: []Violation{{From: "misc", Why: "in no tier; add it to the tiers of internal/tools/tiercheck"}}},
		{name: "untiered import", pkg: pkg("cmd/x", []string{m + "/misc"}, nil),
			want: []Violation{{From: "cmd/x", To: "misc", Why: "the imported package is in no tier"}}},
		{name: "prefix is a path, not a string", pkg: pkg("ntbx", nil, nil),
			want: []Violation{{From: "ntbx", Why: "in no tier; add it to the tiers of internal/tools/tiercheck"}}},
	} {
		require.Equal(t, tc.want, Check(m, []Package{tc.pkg}), tc.name)
	}
}

// Every exception names packages of the table, and an import that is
// really upward: an exception that is not needed hides nothing.
func TestExceptionsAreUpward(t *testing.T) {
	for from, tos := range testExceptions {
		for to, why := range tos {
			ft, tt := tierOf(from), tierOf(to)
			require.NotEqual(t, -1, ft, from)
			require.NotEqual(t, -1, tt, to)
			require.Greater(t, tt, ft, "%s -> %s", from, to)
			require.NotEmpty(t, why)
		}
	}
}
