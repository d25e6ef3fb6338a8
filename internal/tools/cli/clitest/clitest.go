// Package clitest runs a command's test binary as the command itself, to
// check what the process prints and its exit code: TestMain calls
// MaybeMain(main) first; a test calls Run or CheckHelp.
package clitest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ntstack/ntstack/internal/tools/cli"
)

// mainEnv, set to 1, makes the test binary run the command's main.
const mainEnv = "NTSTACK_CLITEST_MAIN"

// MaybeMain runs main and exits 0 when it returns, if this test binary was
// started by Run; otherwise it returns at once. Call it first in TestMain.
func MaybeMain(main func()) {
	if os.Getenv(mainEnv) != "1" {
		return
	}
	main()
	os.Exit(0)
}

// Main is the TestMain of a command whose tests need nothing more: main
// if Run started this test binary, the tests otherwise.
func Main(m *testing.M, main func()) {
	MaybeMain(main)
	os.Exit(m.Run())
}

// Run runs the test binary as the command with args and returns what it
// wrote to stdout and stderr and its exit code.
func Run(t testing.TB, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(os.Environ(), mainEnv+"=1", "GORACE=atexit_sleep_ms=0")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("run %v: %v", args, err)
	}
	return out.String(), errOut.String(), code
}

// CheckHelp runs the command with args (a help request) and checks that
// it exits 0 with usage on stdout: a line starting "usage: " followed by
// want (the command's name, with the subcommand's).
func CheckHelp(t *testing.T, want string, args ...string) {
	t.Helper()
	stdout, stderr, code := Run(t, args...)
	if code != 0 {
		t.Errorf("%v: exit %d, want 0; stderr: %s", args, code, stderr)
	}
	if !strings.Contains(stdout, "usage: "+want) {
		t.Errorf("%v: stdout has no %q:\n%s", args, "usage: "+want, stdout)
	}
}

// CheckProgramHelp checks a program with subcommands: -h, --help and help
// print its usage and exit 0, and so do -h and --help after each
// subcommand of its table, which a new subcommand joins by being listed.
func CheckProgramHelp(t *testing.T, p *cli.Program) {
	t.Helper()
	for _, a := range []string{"-h", "--help", "help"} {
		CheckHelp(t, p.Name, a)
	}
	for _, c := range p.Commands {
		for _, a := range []string{"-h", "--help"} {
			CheckHelp(t, p.Name+" "+c.Name, c.Name, a)
		}
	}
}

// CheckBadUsage runs the command with each argument list and checks that
// it exits 2 and says why on stderr.
func CheckBadUsage(t *testing.T, argLists ...[]string) {
	t.Helper()
	for _, args := range argLists {
		_, stderr, code := Run(t, args...)
		if code != 2 || stderr == "" {
			t.Errorf("%v: exit %d, stderr %q; want 2 and a message", args, code, stderr)
		}
	}
}
