package main

import (
	"os"
	"testing"

	"github.com/ntstack/ntstack/internal/tools/cli/clitest"
)

func TestMain(m *testing.M) {
	clitest.MaybeMain(main)
	os.Exit(m.Run())
}

// TestHelp: -h, --help and help print ntmon's usage and exit 0, and so do -h
// and --help after every subcommand of its table.
func TestHelp(t *testing.T) {
	for _, a := range []string{"-h", "--help", "help"} {
		clitest.CheckHelp(t, "ntmon", a)
	}
	for _, c := range ntmon.Commands {
		for _, a := range []string{"-h", "--help"} {
			clitest.CheckHelp(t, "ntmon "+c.Name, c.Name, a)
		}
	}
}

// TestBadUsage: an unknown command or flag exits 2 and says so.
func TestBadUsage(t *testing.T) {
	for _, args := range [][]string{{"nosuchcommand"}, {"-nosuchflag"}, {ntmon.Commands[0].Name, "-nosuchflag"}} {
		_, stderr, code := clitest.Run(t, args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2; stderr: %s", args, code, stderr)
		}
		if stderr == "" {
			t.Errorf("%v: nothing on stderr", args)
		}
	}
}
