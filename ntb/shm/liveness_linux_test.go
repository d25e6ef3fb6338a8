package shm

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/ntbtest"
)

// The liveness tests hold the other end of a link in a child process (this
// test binary, re-run by peerChild) so that it can be stopped and killed:
// the kernel's view of a process — its side lock — is what tells a gone
// peer from a silent one.

const (
	childDirEnv      = "NTSTACK_SHM_TEST_CHILD_DIR"
	childIntervalEnv = "NTSTACK_SHM_TEST_CHILD_INTERVAL"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(childDirEnv); dir != "" {
		os.Exit(runChild(dir))
	}
	os.Exit(m.Run())
}

// runChild attaches side 1 of link "l" in dir, says "ready" on stdout,
// and closes it in order when stdin ends.
func runChild(dir string) int {
	every, _ := time.ParseDuration(os.Getenv(childIntervalEnv))
	d, err := Open("l", Options{Dir: dir, Side: Side1, WindowSize: 64 << 10, HeartbeatInterval: every})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	if err := d.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// peer is the child process holding side 1.
type peer struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
}

// peerChild starts a child that attaches side 1 of link "l" in dir with
// the given heartbeat interval, and waits until it has.
func peerChild(t *testing.T, dir string, every time.Duration) *peer {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childDirEnv+"="+dir, childIntervalEnv+"="+every.String())
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	p := &peer{cmd: cmd, stdin: stdin}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "child: %q", line)
	require.Equal(t, "ready\n", line)
	return p
}

func (p *peer) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(sig))
}

// close has the child close its end in order and waits for it to exit.
func (p *peer) close(t *testing.T) {
	t.Helper()
	require.NoError(t, p.stdin.Close())
	require.NoError(t, p.cmd.Wait())
}

// noDown fails on any down event among evs.
func noDown(t *testing.T, evs []ntb.LinkEvent) {
	t.Helper()
	for _, ev := range evs {
		require.NotEqual(t, ntb.LinkDown, ev.State, "link went down: %+v", ev)
	}
}

// A peer stopped for 2 s (SIGSTOP: attached, alive, silent — what a peer
// starved of CPU looks like) makes the link suspect and never takes it
// down; once it runs again the link is trusted again.
func TestStoppedPeerIsSuspect(t *testing.T) {
	dir := testDir(t)
	o := Options{Dir: dir, Side: Side0, WindowSize: 64 << 10, HeartbeatInterval: 20 * time.Millisecond,
		HeartbeatTimeout: 100 * time.Millisecond, SilentTimeout: time.Minute}
	a, err := Open("l", o)
	require.NoError(t, err)
	defer a.Close()
	p := peerChild(t, dir, o.HeartbeatInterval)
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)

	p.signal(t, syscall.SIGSTOP)
	stopped := time.Now()
	_, before := ntbtest.WaitEvent(t, a, ntbtest.LivenessTimeout, "suspect", ntbtest.IsSuspect(true))
	noDown(t, before)
	require.True(t, a.Suspect())
	// Hold the peer stopped for 2 s in all (the stall this test injects,
	// so a timer), watching that the link stays up.
	hold := time.NewTimer(time.Until(stopped.Add(2 * time.Second)))
	defer hold.Stop()
	for held := false; !held; {
		select {
		case ev := <-a.LinkEvents():
			require.NotEqual(t, ntb.LinkDown, ev.State, "a stopped peer took the link down: %+v", ev)
		case <-hold.C:
			held = true
		}
	}
	require.Equal(t, ntb.LinkUp, a.Link())
	p.signal(t, syscall.SIGCONT)
	// The event shows the peer heard again; a.Suspect() is not asked
	// after it: on a loaded machine the resumed peer can miss its 100 ms
	// again, and a new suspicion is no failure.
	_, before = ntbtest.WaitEvent(t, a, ntbtest.LivenessTimeout, "peer heard again", ntbtest.IsSuspect(false))
	noDown(t, before)
	require.Equal(t, ntb.LinkUp, a.Link())

	p.close(t)
	ntbtest.WaitEvent(t, a, ntbtest.LivenessTimeout, "peer closed", ntbtest.IsDown(ntb.CauseClosed))
}

// A killed peer (SIGKILL: no chance to detach) is gone at the next look,
// not after any timeout: the kernel dropped its side lock. The timeouts
// here are an hour, so only that can take the link down.
func TestKilledPeerIsGone(t *testing.T) {
	dir := testDir(t)
	o := Options{Dir: dir, Side: Side0, WindowSize: 64 << 10, HeartbeatInterval: 20 * time.Millisecond,
		HeartbeatTimeout: time.Hour, SilentTimeout: time.Hour}
	a, err := Open("l", o)
	require.NoError(t, err)
	defer a.Close()
	p := peerChild(t, dir, o.HeartbeatInterval)
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	p.signal(t, syscall.SIGKILL)
	ev, before := ntbtest.WaitEvent(t, a, ntbtest.LivenessTimeout, "down", func(ev ntb.LinkEvent) bool { return ev.State == ntb.LinkDown })
	require.Equal(t, ntb.CauseGone, ev.Cause, "%+v (before: %+v)", ev, before)
	require.Equal(t, ntb.CauseGone, a.LinkCause())
}

// An orderly close is told from a crash, in the cause and the reason.
func TestClosedPeerIsClosed(t *testing.T) {
	dir := testDir(t)
	o := Options{Dir: dir, Side: Side0, WindowSize: 64 << 10, HeartbeatInterval: 20 * time.Millisecond}
	a, err := Open("l", o)
	require.NoError(t, err)
	defer a.Close()
	p := peerChild(t, dir, o.HeartbeatInterval)
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	p.close(t)
	ev, _ := ntbtest.WaitEvent(t, a, ntbtest.LivenessTimeout, "down", func(ev ntb.LinkEvent) bool { return ev.State == ntb.LinkDown })
	require.Equal(t, ntb.CauseClosed, ev.Cause, "%+v", ev)
	require.Contains(t, ev.Reason, "detached")
}

// Forcing the link down is local at this end and a hardware failure at
// the peer's.
func TestForcedDownCauses(t *testing.T) {
	a, b := openPair(t, Options{Dir: testDir(t), WindowSize: 64 << 10, HeartbeatInterval: 10 * time.Millisecond})
	defer a.Close()
	defer b.Close()
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	ntbtest.WaitLink(t, b, ntb.LinkUp, ntbtest.LivenessTimeout)
	a.ForceLinkDown()
	ntbtest.WaitEvent(t, a, ntbtest.LivenessTimeout, "local down", ntbtest.IsDown(ntb.CauseLocal))
	ntbtest.WaitEvent(t, b, ntbtest.LivenessTimeout, "hardware down", ntbtest.IsDown(ntb.CauseHardware))
	a.ForceLinkUp()
	ntbtest.WaitLink(t, b, ntb.LinkUp, ntbtest.LivenessTimeout)
}

// The link comes up when the second end attaches, not at a heartbeat:
// with an hour between beats, only the arrival can bring it up — at the
// end that arrives (its first look), and at the end that waited (woken by
// the socket the memory came through, or by the doorbell).
func TestUpWhenPeerArrives(t *testing.T) {
	slow := Options{WindowSize: 64 << 10, HeartbeatInterval: time.Hour, HeartbeatTimeout: 2 * time.Hour, SilentTimeout: 3 * time.Hour}
	check := func(t *testing.T, first, second *Device) {
		t.Helper()
		ntbtest.WaitEvent(t, second, ntbtest.LivenessTimeout, "up at the arriving end", ntbtest.IsSuspect(false))
		ntbtest.WaitEvent(t, first, ntbtest.LivenessTimeout, "up at the waiting end", ntbtest.IsSuspect(false))
		require.Equal(t, ntb.LinkUp, first.Link())
		require.Equal(t, ntb.LinkUp, second.Link())
	}
	t.Run("named", func(t *testing.T) {
		o := slow
		o.Dir = testDir(t)
		a, err := Open("l", o)
		require.NoError(t, err)
		defer a.Close()
		b, err := Open("l", o)
		require.NoError(t, err)
		defer b.Close()
		check(t, a, b)
		// A detach is seen at once too, by an end asleep on its doorbell.
		woke := make(chan error, 1)
		go func() {
			_, err := a.WaitDoorbell(context.Background(), 1)
			woke <- err
		}()
		require.NoError(t, b.Close())
		ntbtest.WaitEvent(t, a, ntbtest.LivenessTimeout, "peer closed", ntbtest.IsDown(ntb.CauseClosed))
		require.NoError(t, <-woke)
	})
	t.Run("memory", func(t *testing.T) {
		// No socket: the arriving end rings the waiting one, which
		// sleeps on its doorbell as a partition link's handshake does.
		f, err := NewMemLink("t")
		require.NoError(t, err)
		defer f.Close()
		o := slow
		o.Side = Side0
		a, err := OpenFile(f, "t", o)
		require.NoError(t, err)
		defer a.Close()
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			for ctx.Err() == nil {
				_, _ = a.WaitDoorbell(ctx, 1)
			}
		}()
		o.Side = Side1
		b, err := OpenFile(f, "t", o)
		require.NoError(t, err)
		defer b.Close()
		check(t, a, b)
	})
}
