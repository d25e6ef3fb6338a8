package proc

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Affinity returns the CPUs the calling thread may run on, in ascending
// order. Between calls to SetAffinity every thread of the process has the
// same mask, so this is the process's affinity.
func Affinity() ([]int, error) {
	var set unix.CPUSet
	if err := unix.SchedGetaffinity(0, &set); err != nil {
		return nil, fmt.Errorf("sched_getaffinity: %w", err)
	}
	n := set.Count()
	cpus := make([]int, 0, n)
	for cpu := 0; len(cpus) < n; cpu++ {
		if set.IsSet(cpu) {
			cpus = append(cpus, cpu)
		}
	}
	return cpus, nil
}

// SetAffinity restricts every thread of the calling process to cpus.
// sched_setaffinity acts on one thread, and the Go runtime has several, so
// it walks /proc/self/task until a pass finds no thread it has not pinned.
func SetAffinity(cpus []int) error {
	if len(cpus) == 0 {
		return errors.New("set affinity: no CPUs given")
	}
	var set unix.CPUSet
	for _, cpu := range cpus {
		set.Set(cpu)
	}
	done := make(map[int]bool)
	for {
		tids, err := threads()
		if err != nil {
			return fmt.Errorf("set affinity: %w", err)
		}
		fresh := 0
		for _, tid := range tids {
			if done[tid] {
				continue
			}
			fresh++
			err := unix.SchedSetaffinity(tid, &set)
			if err != nil && !errors.Is(err, unix.ESRCH) { // ESRCH: thread already gone
				return fmt.Errorf("set affinity of thread %d to CPUs %v: %w", tid, cpus, err)
			}
			done[tid] = true
		}
		if fresh == 0 {
			return nil
		}
	}
}

// threads lists the thread ids of the calling process.
func threads() ([]int, error) {
	entries, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return nil, fmt.Errorf("list threads: %w", err)
	}
	tids := make([]int, 0, len(entries))
	for _, e := range entries {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			return nil, fmt.Errorf("list threads: bad task entry %q: %w", e.Name(), err)
		}
		tids = append(tids, tid)
	}
	return tids, nil
}

// Pollable returns f, a pipe or socket its process inherited blocking (a
// child's standard input, say), as a file the runtime's poller waits on:
// a goroutine reading a blocking file holds its P in a system call, and
// with every P held nothing polls the network, nor the FIFOs ntb's
// doorbells ring, until sysmon takes the P back, which an idle process's
// sysmon does up to 10 ms late. (ntbench's server answered its control
// pipe with GOMAXPROCS 1 so: each measurement began with its readers
// asleep ~10 ms.) The new file holds a duplicate descriptor; f, now
// non-blocking too, must not be read afterwards. A file that cannot be
// duplicated comes back as it was.
func Pollable(f *os.File) *os.File {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return f
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return f
	}
	return os.NewFile(uintptr(fd), f.Name())
}

// CPUTime returns the user plus system CPU time the calling process has
// used so far, all threads included (getrusage RUSAGE_SELF, microsecond
// resolution).
func CPUTime() (time.Duration, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// KillWithParent returns process attributes that make the kernel SIGKILL
// the child when the thread that started it exits (see the package
// comment), so a benchmark killed mid-run leaves no server behind.
func KillWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// ReadHost describes this machine. Fields it cannot read are left empty
// (the CPU model becomes "unknown"); the report is informative, so a
// missing field is not an error.
func ReadHost() Host {
	h := Host{CPUs: runtime.NumCPU(), CPUModel: "unknown"}
	h.Hostname, _ = os.Hostname()
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		h.CPUModel = cpuModel(f)
		f.Close()
	}
	var uts unix.Utsname
	if unix.Uname(&uts) == nil {
		h.Kernel = unix.ByteSliceToString(uts.Release[:])
	}
	return h
}

// PinThread binds the calling OS thread to cpu. Lock the goroutine to its
// thread first (runtime.LockOSThread) or the pin lands on whatever thread
// runs it next.
func PinThread(cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	if err := unix.SchedSetaffinity(0, &set); err != nil {
		return fmt.Errorf("pin thread to cpu %d: %w", cpu, err)
	}
	return nil
}

// EffectiveCaps returns the effective capability set of process pid, a
// bit per capability (CapEff in /proc/<pid>/status).
func EffectiveCaps(pid int) (uint64, error) {
	if pid <= 0 {
		return 0, fmt.Errorf("capabilities of pid %d: no such process", pid)
	}
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("capabilities of pid %d: %w", pid, err)
	}
	defer f.Close()
	caps, err := capEff(f)
	if err != nil {
		return 0, fmt.Errorf("capabilities of pid %d: %w", pid, err)
	}
	return caps, nil
}
