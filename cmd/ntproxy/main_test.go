package main

import (
	"strings"
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

// TestGatewayAlone: -gateway is the process ntproxy starts for its gateway;
// run by hand, without the stats socket ntproxy passes it, it exits 1 and
// says so.
func TestGatewayAlone(t *testing.T) {
	_, stderr, code := clitest.Run(t, "-gateway", "-config", "/nonexistent/host.toml")
	if code != 1 || !strings.Contains(stderr, "not the gateway stats socket") {
		t.Fatalf("ntproxy -gateway: exit %d, stderr %q; want 1 and the missing stats socket", code, stderr)
	}
}
