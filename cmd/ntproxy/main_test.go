package main

import (
	"testing"

	"github.com/ntstack/ntstack/internal/tools/cli/clitest"
)

func TestMain(m *testing.M) { clitest.Main(m, main) }

// TestHelp: -h and --help print ntproxy's usage and exit 0; a bad flag or a
// stray argument exits 2.
func TestHelp(t *testing.T) {
	for _, a := range []string{"-h", "--help"} {
		clitest.CheckHelp(t, "ntproxy", a)
	}
	clitest.CheckBadUsage(t, []string{"-nosuchflag"}, []string{"stray"})
}
