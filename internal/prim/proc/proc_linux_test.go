package proc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
)

// helperEnv makes the test binary act as a helper process (see TestMain).
const helperEnv = "PROC_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "parent":
		// Start a grandchild tied to this process, report its pid, and
		// exit without waiting for it.
		self, err := os.Executable()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		cmd := exec.Command(self)
		cmd.Env = append(os.Environ(), helperEnv+"=sleeper")
		cmd.SysProcAttr = KillWithParent()
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(cmd.Process.Pid)
		os.Exit(0)
	case "sleeper":
		// Lives until its parent's death kills it, the thing under
		// test; the minute only bounds a failure.
		time.Sleep(time.Minute)
		os.Exit(0)
	}
}

func TestKillWithParent(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), helperEnv+"=parent")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper parent: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("helper parent printed %q: %v", out, err)
	}
	t.Cleanup(func() { unix.Kill(pid, unix.SIGKILL) })
	// The kernel signals the grandchild when its parent exits; allow a
	// loaded machine plenty of time to deliver it.
	if !waitfor.Until(func() bool { return !alive(pid) }) {
		t.Fatalf("grandchild %d still alive after its parent exited", pid)
	}
}

// alive reports whether pid exists and is not a zombie (a container's init
// may never reap the orphan).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(stat), ") ")
	return !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}

func TestSetAffinity(t *testing.T) {
	orig, err := Affinity()
	if err != nil {
		t.Fatal(err)
	}
	if len(orig) == 0 {
		t.Fatal("Affinity returned no CPUs")
	}
	t.Cleanup(func() {
		if err := SetAffinity(orig); err != nil {
			t.Errorf("restore affinity: %v", err)
		}
	})
	want := orig[len(orig)-1]
	if err := SetAffinity([]int{want}); err != nil {
		t.Fatal(err)
	}
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, status := range tasks {
		b, err := os.ReadFile(status)
		if err != nil {
			continue // thread exited
		}
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
				if got := strings.TrimSpace(v); got != strconv.Itoa(want) {
					t.Errorf("%s: Cpus_allowed_list %s, want %d", status, got, want)
				}
			}
		}
	}
	got, err := Affinity()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []int{want}) {
		t.Errorf("Affinity = %v, want [%d]", got, want)
	}
	if err := SetAffinity(nil); err == nil {
		t.Error("SetAffinity(nil) succeeded")
	}
}

func TestCPUTime(t *testing.T) {
	before, err := CPUTime()
	if err != nil {
		t.Fatal(err)
	}
	for start := time.Now(); time.Since(start) < 20*time.Millisecond; {
	}
	after, err := CPUTime()
	if err != nil {
		t.Fatal(err)
	}
	if before <= 0 || after < before {
		t.Errorf("CPUTime went from %v to %v", before, after)
	}
}

func TestReadHost(t *testing.T) {
	h := ReadHost()
	if h.CPUs < 1 || h.Kernel == "" || h.CPUModel == "" {
		t.Errorf("ReadHost = %+v, want CPUs, kernel and CPU model", h)
	}
}

// TestPollable turns a blocking pipe, as a child inherits its standard
// input, into a file the runtime's poller waits on: only such a file
// takes a read deadline.
func TestPollable(t *testing.T) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	blocking := os.NewFile(uintptr(fds[0]), "pipe")
	defer blocking.Close()
	if err := blocking.SetReadDeadline(time.Now()); err == nil {
		t.Fatal("a blocking pipe took a deadline: the test proves nothing")
	}
	f := Pollable(blocking)
	defer f.Close()
	if err := f.SetReadDeadline(time.Now().Add(10 * time.Millisecond)); err != nil {
		t.Fatalf("deadline: %v", err)
	}
	if _, err := f.Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read of an empty pipe: %v, want the deadline", err)
	}
}

// EffectiveCaps reads what capget(2) says of this process.
func TestEffectiveCapsSelf(t *testing.T) {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		t.Fatalf("capget: %v", err)
	}
	want := uint64(data[1].Effective)<<32 | uint64(data[0].Effective)
	got, err := EffectiveCaps(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("EffectiveCaps = %#x, capget says %#x", got, want)
	}
	if _, err := EffectiveCaps(0); err == nil {
		t.Fatal("EffectiveCaps(0): no error")
	}
}
