// Command hog saturates the machine's CPUs with busy loops, the load under
// which the integration tier must hold (make loadcheck): a process whose
// peer is starved of CPU must still keep its connections.
//
//	hog [-n threads] [-for duration]
//
// It spins n threads (default two per CPU, so that the tests beside it
// compete for every core rather than find one idle) until it is signalled
// (SIGINT, SIGTERM) or, with -for, until the duration has passed.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/tools/cli"
)

func main() {
	n := flag.Int("n", 2*runtime.NumCPU(), "busy threads")
	d := flag.Duration("for", 0, "stop after this long (0: until signalled)")
	cli.ParseMain("hog", "[-n threads] [-for duration]")
	if *n < 1 {
		fmt.Fprintf(os.Stderr, "hog: -n %d: want at least one thread\n", *n)
		os.Exit(2)
	}
	// Every busy goroutine holds a thread of its own, and the scheduler
	// still finds one for the signal handler.
	runtime.GOMAXPROCS(*n + 1)
	var stop atomic.Bool
	var spins atomic.Uint64
	for range *n {
		go spin(&stop, &spins)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	var timeout <-chan time.Time
	if *d > 0 {
		timeout = time.After(*d)
	}
	fmt.Fprintf(os.Stderr, "hog: %d busy threads on %d CPUs\n", *n, runtime.NumCPU())
	select {
	case s := <-sig:
		fmt.Fprintf(os.Stderr, "hog: %v, stopping\n", s)
	case <-timeout:
	}
	stop.Store(true)
}

// spin burns one thread until stop is set.
func spin(stop *atomic.Bool, spins *atomic.Uint64) {
	runtime.LockOSThread()
	var x uint64
	for !stop.Load() {
		for i := range 1 << 16 {
			x = x*6364136223846793005 + uint64(i)
		}
		spins.Add(x & 1) // keeps the loop from being optimised away
	}
}
