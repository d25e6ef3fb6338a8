package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// childEnv makes the test binary a stand-in gateway process of the mode
// it names (runTestChild).
const childEnv = "NTSTACK_GATEWAY_TEST_CHILD"

// fakeReporter reports fixed counters.
type fakeReporter struct{}

func (fakeReporter) Stats() []ctlapi.GatewayStat {
	return []ctlapi.GatewayStat{{Kind: "forward", Listen: "127.0.0.1:16379", To: "b:7379", Active: 2, Total: 5, BytesIn: 1 << 40}}
}

func (fakeReporter) TrunkStats() []ctlapi.TrunkStat {
	return []ctlapi.TrunkStat{{Peer: "b", Link: "gw-a-b", Role: "opened", State: "up", Ports: []int{7379}, Conns: 2}}
}

// runTestChild is the test binary as a gateway process:
//   - serve: ServeStats(fakeReporter) until its socket closes or SIGTERM;
//   - fail: an error on stderr, exit status 1;
//   - hang: nothing, forever (only a signal ends it);
//   - parent: StartProcess a hang child, print its pid, then hang.
func runTestChild(mode string) int {
	switch mode {
	case "serve":
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM)
		go func() {
			<-sig
			os.Exit(0)
		}()
		c, err := StatsConn()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := ServeStats(c, fakeReporter{}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	case "fail":
		fmt.Fprintln(os.Stderr, "gateway forward 127.0.0.1:16379: bind: address already in use")
		return 1
	case "hang":
		select {}
	case "parent":
		p, err := StartProcess(testChild("hang"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		fmt.Println(p.Pid())
		select {}
	}
	fmt.Fprintf(os.Stderr, "%s=%q: no such mode\n", childEnv, mode)
	return 2
}

// testChild returns the command of a stand-in gateway process.
func testChild(mode string) *exec.Cmd {
	cmd := exec.Command(os.Args[0])
	// GORACE: a race-enabled binary otherwise sleeps a second at exit.
	cmd.Env = append(os.Environ(), childEnv+"="+mode, "GORACE=atexit_sleep_ms=0")
	return cmd
}

// ntproxy reads the gateway process's counters over the stats socket, and
// Stop ends the process cleanly.
func TestProcessStats(t *testing.T) {
	p, err := StartProcess(testChild("serve"))
	require.NoError(t, err)
	defer p.Stop()
	for range 3 {
		require.Equal(t, fakeReporter{}.Stats(), p.Stats())
		require.Equal(t, fakeReporter{}.TrunkStats(), p.TrunkStats())
	}
	require.NoError(t, p.Stop())
	<-p.Done()
	require.NoError(t, p.Stop(), "Stop is idempotent")
	require.Nil(t, p.Stats(), "no counters from a process that ended")
}

// A gateway process that fails ends with its exit status and its last
// line of stderr, which ntproxy then returns.
func TestProcessFails(t *testing.T) {
	cmd := testChild("fail")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	p, err := StartProcess(cmd)
	require.NoError(t, err)
	<-p.Done()
	require.ErrorContains(t, p.Err(), "exit status 1")
	require.ErrorContains(t, p.Err(), "address already in use")
	require.Contains(t, stderr.String(), "address already in use", "its stderr goes on to cmd.Stderr")
	require.Equal(t, p.Err(), p.Stop())
}

// A gateway process whose stats socket closes (its ntproxy is gone) ends.
func TestProcessEndsWithStatsSocket(t *testing.T) {
	p, err := StartProcess(testChild("serve"))
	require.NoError(t, err)
	defer p.Stop()
	p.stats.Close()
	<-p.Done()
	require.NoError(t, p.Err())
}

// A gateway process dies with its parent even if it serves nothing: the
// kernel kills it when the parent's thread that started it ends.
func TestProcessDiesWithParent(t *testing.T) {
	parent := testChild("parent")
	out, err := parent.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, parent.Start())
	defer parent.Wait()
	defer parent.Process.Kill()
	// The hang child inherits the pipe's write end: the pipe ends when
	// both processes have exited (the child left to be reaped by init).
	rd := bufio.NewReader(out)
	line, err := rd.ReadString('\n')
	require.NoError(t, err)
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	require.NoError(t, err)
	require.NoError(t, parent.Process.Kill())
	rest, err := io.ReadAll(rd)
	require.NoError(t, err, "the pipe ends once the gateway process %d is gone", pid)
	require.Empty(t, rest)
}

// ServeStats carries a gateway's counters as they are.
func TestServeStatsRoundTrip(t *testing.T) {
	p := statsOverPipe(t, fakeReporter{})
	require.Equal(t, fakeReporter{}.Stats(), p.Stats())
	require.Equal(t, fakeReporter{}.TrunkStats(), p.TrunkStats())
}

// statsOverPipe returns a Process whose stats requests r answers through
// ServeStats, over an in-memory pipe, as ntproxy reads a gateway
// process's.
func statsOverPipe(t *testing.T, r Reporter) *Process {
	c1, c2 := net.Pipe()
	served := make(chan error, 1)
	go func() { served <- ServeStats(c2, r) }()
	t.Cleanup(func() {
		c1.Close()
		require.NoError(t, <-served)
	})
	return &Process{stats: c1, rd: bufio.NewReader(c1)}
}
