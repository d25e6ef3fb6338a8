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
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ntstack/ntstack/internal/tools/cli"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, sig))
}

// run is hog with its arguments, output and signals; it returns the exit
// code.
func run(args []string, stdout, stderr io.Writer, sig <-chan os.Signal) int {
	fs := cli.FlagSet("hog", "[-n threads] [-for duration]", stderr)
	n := fs.Int("n", 2*runtime.NumCPU(), "busy threads")
	d := fs.Duration("for", 0, "stop after this long (0: until signalled)")
	if code, ok := cli.Parse(fs, args, stdout); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "hog: unexpected argument %q\n", fs.Arg(0))
		fs.Usage()
		return 2
	}
	if *n < 1 {
		fmt.Fprintf(stderr, "hog: -n %d: want at least one thread\n", *n)
		return 2
	}
	// Every busy goroutine holds a thread of its own, and the scheduler
	// still finds one for the rest of the program.
	prev := runtime.GOMAXPROCS(*n + 1)
	defer runtime.GOMAXPROCS(prev)
	var stop atomic.Bool
	var spins atomic.Uint64
	var wg sync.WaitGroup
	for range *n {
		wg.Go(func() { spin(&stop, &spins) })
	}
	var timeout <-chan time.Time
	if *d > 0 {
		timeout = time.After(*d)
	}
	fmt.Fprintf(stderr, "hog: %d busy threads on %d CPUs\n", *n, runtime.NumCPU())
	select {
	case s := <-sig:
		fmt.Fprintf(stderr, "hog: %v, stopping\n", s)
	case <-timeout:
	}
	stop.Store(true)
	wg.Wait()
	return 0
}

// spin burns one thread until stop is set, counting its rounds in spins.
func spin(stop *atomic.Bool, spins *atomic.Uint64) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var x uint64
	for !stop.Load() {
		for i := range 1 << 16 {
			x = x*6364136223846793005 + uint64(i)
		}
		spins.Add(1 + x&1) // uses x: the loop is not optimised away
	}
}
