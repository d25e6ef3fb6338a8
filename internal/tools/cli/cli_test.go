package cli

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// A subcommand in the table gets -h and --help without handling them
// itself: Dispatch runs it with -h and its flag set prints the usage.
func TestDispatchHelp(t *testing.T) {
	ran := 0
	p := Program{Name: "prog", Commands: []Command{{
		Name: "new", Synopsis: "[-n N]",
		Run: func(_ context.Context, args []string, stdout, stderr io.Writer) int {
			fs := FlagSet("prog new", "[-n N]", stderr)
			fs.Int("n", 1, "how many")
			if code, ok := Parse(fs, args, stdout); !ok {
				return code
			}
			ran++
			return 0
		},
	}}}
	for _, args := range [][]string{{"new", "-h"}, {"new", "--help"}, {"new", "-n", "2", "-help"}} {
		var out, errOut bytes.Buffer
		code, ok := p.Dispatch(context.Background(), args, &out, &errOut)
		require.True(t, ok, args)
		require.Equal(t, 0, code, args)
		require.Contains(t, out.String(), "usage: prog new [-n N]", args)
		require.Contains(t, out.String(), "how many", args)
		require.Empty(t, errOut.String(), args)
	}
	require.Zero(t, ran, "a help request must not run the command")

	var out, errOut bytes.Buffer
	code, ok := p.Dispatch(context.Background(), []string{"new", "-x"}, &out, &errOut)
	require.True(t, ok)
	require.Equal(t, 2, code)
	require.Contains(t, errOut.String(), "flag provided but not defined: -x")

	code, ok = p.Dispatch(context.Background(), []string{"new", "--", "-h"}, &out, &errOut)
	require.True(t, ok)
	require.Equal(t, 0, code)
	require.Equal(t, 1, ran, "-h after -- is an argument")

	_, ok = p.Dispatch(context.Background(), []string{"-h"}, &out, &errOut)
	require.False(t, ok, "the program's own flags are the program's")
}

func TestUsage(t *testing.T) {
	var b bytes.Buffer
	p := Program{Name: "prog", Synopsis: "[-v]", Commands: []Command{{Name: "a", Synopsis: "-x X"}, {Name: "version"}}}
	p.Usage(&b)
	require.Equal(t, "usage: prog [-v]\n       prog a -x X\n       prog version\n", b.String())
}
