package main

import (
	"testing"

	"github.com/ntstack/ntstack/internal/tools/cli/clitest"
)

func TestMain(m *testing.M) { clitest.Main(m, main) }

// TestHelp: -h, --help and help print ntmon's usage and exit 0, and so do -h
// and --help after every subcommand; an unknown command or flag exits 2.
func TestHelp(t *testing.T) {
	clitest.CheckProgramHelp(t, &ntmon)
	clitest.CheckBadUsage(t, []string{"nosuchcommand"}, []string{"-nosuchflag"}, []string{"status", "-nosuchflag"})
}
