package proc

import (
	"bytes"
	"context"
	"io"
	"runtime"
	"runtime/trace"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
	xtrace "golang.org/x/exp/trace"
)

func TestFutexWaitWakes(t *testing.T) {
	var word uint32
	done := make(chan struct{})
	go func() {
		for atomic.LoadUint32(&word) == 0 {
			FutexWait(&word, 0, 0)
		}
		close(done)
	}()
	atomic.StoreUint32(&word, 1)
	FutexWake(&word)
	<-done
	FutexWait(&word, 0, 0) // the word differs: returns at once
}

// TestFutexWaitGivesUpP: with one P, a goroutine asleep in FutexWait has
// its own thread give the P up as it enters the kernel, so the goroutine
// that wakes it runs at once. With syscall.Syscall6 the P stayed with the
// sleeper until sysmon's thread took it (the runtime trace shows which
// thread released it).
func TestFutexWaitGivesUpP(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var buf bytes.Buffer
	require.NoError(t, trace.Start(&buf))
	var word uint32
	var started atomic.Bool
	done := make(chan struct{})
	go func() {
		trace.Log(context.Background(), "futex", "sleeper")
		started.Store(true)
		// At least one system call, even if the word changed already.
		for ok := true; ok; ok = atomic.LoadUint32(&word) == 0 {
			FutexWait(&word, 0, 0)
		}
		close(done)
	}()
	for !started.Load() {
		runtime.Gosched() // the sleeper runs, and sleeps
	}
	atomic.StoreUint32(&word, 1)
	FutexWake(&word)
	<-done
	trace.Stop()

	r, err := xtrace.NewReader(&buf)
	require.NoError(t, err)
	sleeper, inSyscall := xtrace.NoGoroutine, false
	var sleepM xtrace.ThreadID
	var sleepP xtrace.ProcID
	for {
		ev, err := r.ReadEvent()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		switch {
		case ev.Kind() == xtrace.EventLog && ev.Log().Message == "sleeper":
			sleeper = ev.Goroutine()
		case ev.Kind() != xtrace.EventStateTransition:
		case ev.StateTransition().Resource.Kind == xtrace.ResourceGoroutine:
			st := ev.StateTransition()
			if st.Resource.Goroutine() != sleeper || sleeper == xtrace.NoGoroutine {
				continue
			}
			from, to := st.Goroutine()
			if to == xtrace.GoSyscall && !inSyscall {
				inSyscall, sleepM, sleepP = true, ev.Thread(), ev.Proc()
			}
			require.False(t, from == xtrace.GoSyscall && inSyscall, "the sleeper left its system call before its P was released")
		case inSyscall && ev.StateTransition().Resource.Kind == xtrace.ResourceProc:
			st := ev.StateTransition()
			if _, to := st.Proc(); st.Resource.Proc() != sleepP || to != xtrace.ProcIdle {
				continue
			}
			require.Equal(t, sleepM, ev.Thread(), "P%d was released by another thread (sysmon) than the sleeper's", sleepP)
			return
		}
	}
	t.Fatalf("no system call of the sleeper, or its P never released, in the trace")
}
