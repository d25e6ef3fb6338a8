package vfio

import (
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestGroupIoctls checks that group operations reach the kernel (a regular
// file answers ENOTTY), leak nothing, and fail cleanly after Close.
func TestGroupIoctls(t *testing.T) {
	checkNoFDLeak(t)
	g := &Group{file: vfioFile{f: tempFile(t, 0)}, id: 7}
	c := &Container{file: vfioFile{f: tempFile(t, 0)}}
	ops := map[string]func() error{
		"Status":         func() error { _, err := g.Status(); return err },
		"SetContainer":   func() error { return g.SetContainer(c) },
		"UnsetContainer": g.UnsetContainer,
		"OpenDevice":     func() error { _, err := g.OpenDevice("01:00.0"); return err },
	}
	for name, op := range ops {
		if err := op(); !errors.Is(err, unix.ENOTTY) {
			t.Errorf("%s = %v, want ENOTTY", name, err)
		}
	}
	if _, err := g.OpenDevice("bogus"); err == nil || errors.Is(err, unix.ENOTTY) {
		t.Errorf("OpenDevice(bogus) = %v, want an address error", err)
	}
	c.Close()
	if err := g.SetContainer(c); !errors.Is(err, os.ErrClosed) {
		t.Errorf("SetContainer(closed container) = %v, want os.ErrClosed", err)
	}
	g.Close()
	if err := g.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	for name, op := range ops {
		if err := op(); !errors.Is(err, os.ErrClosed) {
			t.Errorf("%s after Close = %v, want os.ErrClosed", name, err)
		}
	}
}

// TestNotViable checks the explanation OpenGroup gives when the kernel
// reports a group not viable.
func TestNotViable(t *testing.T) {
	h := newFakeHost(t)
	h.loadVFIO()
	h.addDevice(nic, vfioPCI, 7)
	checkErr(t, h.notViable(7), []error{ErrGroupNotViable}, "bind to vfio-pci")
	h.addDevice(audio, "snd_hda_intel", 7)
	checkErr(t, h.notViable(7), []error{ErrGroupNotViable}, audio+" (snd_hda_intel)")
}
