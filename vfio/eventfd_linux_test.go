package vfio

import (
	"encoding/binary"
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
)

func signal(t *testing.T, e *Eventfd, n uint64) {
	t.Helper()
	if _, err := unix.Write(e.FD(), binary.NativeEndian.AppendUint64(nil, n)); err != nil {
		t.Fatal(err)
	}
}

func TestEventfd(t *testing.T) {
	checkNoFDLeak(t)
	e, err := NewEventfd()
	if err != nil {
		t.Fatal(err)
	}
	signal(t, e, 2)
	signal(t, e, 3)
	if n, err := e.Wait(); n != 5 || err != nil {
		t.Errorf("Wait = %d, %v; want 5 (the signals add up)", n, err)
	}

	if err := e.SetReadDeadline(time.Now().Add(10 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if n, err := e.Wait(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("Wait on a reset counter = %d, %v; want os.ErrDeadlineExceeded", n, err)
	}
	if err := e.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}

	done := make(chan error)
	go func() {
		_, err := e.Wait()
		done <- err
	}()
	waitfor.Blocked(t, "vfio.(*Eventfd).Wait") // Close must end a Wait that is already blocked
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, os.ErrClosed) {
		t.Errorf("Wait across Close = %v, want os.ErrClosed", err)
	}
	if err := e.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}
