package vfio

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// fakeHost is a Host over sysfs and /dev trees in a temporary directory,
// laid out as the kernel lays them out (see bind_linux.go). Nothing in it
// reacts to writes: a bind leaves the driver links as they were.
type fakeHost struct {
	Host
	t *testing.T
}

func newFakeHost(t *testing.T) *fakeHost {
	root := t.TempDir()
	h := &fakeHost{Host: Host{SysfsRoot: filepath.Join(root, "sys"), DevRoot: filepath.Join(root, "dev")}, t: t}
	h.mkdir(h.sys("bus", "pci", "devices"))
	h.mkdir(h.sys("bus", "pci", "drivers"))
	h.mkdir(h.sys("kernel", "iommu_groups"))
	h.mkdir(h.dev())
	h.write(h.sys("bus", "pci", "drivers_probe"), "")
	return h
}

// loadVFIO makes the vfio-pci driver and /dev/vfio/vfio appear, as
// modprobe vfio-pci does.
func (h *fakeHost) loadVFIO() {
	h.mkdir(h.sys("bus", "pci", "drivers", vfioPCI))
	h.mkdir(h.dev("vfio"))
	h.write(h.dev("vfio", "vfio"), "")
}

// addDevice adds a PCI device bound to driver ("" for none) in IOMMU group
// group (-1 for none).
func (h *fakeHost) addDevice(addr, driver string, group int) {
	dir := h.sys("bus", "pci", "devices", addr)
	h.mkdir(dir)
	h.write(filepath.Join(dir, "driver_override"), "")
	if driver != "" {
		drvDir := h.sys("bus", "pci", "drivers", driver)
		h.mkdir(drvDir)
		h.write(filepath.Join(drvDir, "unbind"), "")
		h.symlink(drvDir, filepath.Join(dir, "driver"))
	}
	if group >= 0 {
		groupDir := h.sys("kernel", "iommu_groups", strconv.Itoa(group))
		h.mkdir(filepath.Join(groupDir, "devices"))
		h.symlink(dir, filepath.Join(groupDir, "devices", addr))
		h.symlink(groupDir, filepath.Join(dir, "iommu_group"))
	}
}

// addGroupNode creates /dev/vfio/<group>, as vfio-pci does on binding.
func (h *fakeHost) addGroupNode(group int) {
	h.write(h.dev("vfio", strconv.Itoa(group)), "")
}

func (h *fakeHost) mkdir(path string) {
	if err := os.MkdirAll(path, 0o755); err != nil {
		h.t.Fatal(err)
	}
}

func (h *fakeHost) write(path, s string) {
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		h.t.Fatal(err)
	}
}

func (h *fakeHost) read(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		h.t.Fatal(err)
	}
	return string(b)
}

func (h *fakeHost) symlink(target, link string) {
	if err := os.Symlink(target, link); err != nil {
		h.t.Fatal(err)
	}
}

const (
	nic   = "0000:01:00.0"
	audio = "0000:01:00.1"
)

// checkErr fails unless err matches each of sentinels and its text holds
// each of words.
func checkErr(t *testing.T, err error, sentinels []error, words ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one matching %v", sentinels)
	}
	for _, s := range sentinels {
		if !errors.Is(err, s) {
			t.Errorf("error %q does not match %q", err, s)
		}
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not mention %q", err, w)
		}
	}
}

func TestIOMMUGroup(t *testing.T) {
	h := newFakeHost(t)
	h.addDevice(nic, "e1000e", 7)
	h.addDevice(audio, "", -1)

	if g, err := h.IOMMUGroup("01:00.0"); g != 7 || err != nil {
		t.Errorf("IOMMUGroup = %d, %v; want 7", g, err)
	}
	_, err := h.IOMMUGroup("0000:02:00.0")
	checkErr(t, err, []error{ErrNoSuchDevice}, "0000:02:00.0")
	_, err = h.IOMMUGroup(audio)
	checkErr(t, err, []error{ErrNoIOMMU, ErrNotSupported}, "intel_iommu=on", "VT-d")
	_, err = h.IOMMUGroup("../../etc")
	checkErr(t, err, nil, "invalid pci address", "../../etc")
}

func TestCheckGroup(t *testing.T) {
	tests := []struct {
		name      string
		setup     func(h *fakeHost)
		sentinels []error
		words     []string
	}{
		{"no device", func(h *fakeHost) {}, []error{ErrNoSuchDevice}, nil},
		{
			"no iommu",
			func(h *fakeHost) { h.loadVFIO(); h.addDevice(nic, vfioPCI, -1) },
			[]error{ErrNoIOMMU, ErrNotSupported}, []string{"intel_iommu=on"},
		},
		{
			"vfio-pci not loaded",
			func(h *fakeHost) { h.addDevice(nic, "e1000e", 7) },
			[]error{ErrNotSupported}, []string{"modprobe vfio-pci"},
		},
		{
			"bound to host driver",
			func(h *fakeHost) { h.loadVFIO(); h.addDevice(nic, "e1000e", 7) },
			[]error{ErrNotBound}, []string{"e1000e", "BindVFIO"},
		},
		{
			"not bound",
			func(h *fakeHost) { h.loadVFIO(); h.addDevice(nic, "", 7) },
			[]error{ErrNotBound}, []string{"no driver"},
		},
		{
			"group not viable",
			func(h *fakeHost) {
				h.loadVFIO()
				h.addDevice(nic, vfioPCI, 7)
				h.addDevice(audio, "snd_hda_intel", 7)
				h.addDevice("0000:00:01.0", "pcieport", 7)
				h.addDevice("0000:01:00.2", "", 7)
				h.addDevice("0000:01:00.3", "pci-stub", 7)
				h.addGroupNode(7)
			},
			[]error{ErrGroupNotViable}, []string{"group 7", audio + " (snd_hda_intel)"},
		},
		{
			"no container node",
			func(h *fakeHost) {
				h.loadVFIO()
				h.addDevice(nic, vfioPCI, 7)
				if err := os.Remove(h.dev("vfio", "vfio")); err != nil {
					t.Fatal(err)
				}
			},
			[]error{ErrNotSupported}, []string{"/vfio/vfio", "modprobe vfio-pci"},
		},
		{
			"no group node",
			func(h *fakeHost) { h.loadVFIO(); h.addDevice(nic, vfioPCI, 7) },
			[]error{ErrNoSuchDevice}, []string{"/vfio/7"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newFakeHost(t)
			tt.setup(h)
			_, err := h.CheckGroup(nic)
			checkErr(t, err, tt.sentinels, append(tt.words, nic)...)
			if tt.name != "group not viable" && strings.Contains(err.Error(), "0000:00:01.0") {
				t.Errorf("error %q blames the bridge", err)
			}
		})
	}

	t.Run("ready", func(t *testing.T) {
		checkNoFDLeak(t)
		h := newFakeHost(t)
		h.loadVFIO()
		h.addDevice(nic, vfioPCI, 7)
		h.addDevice("0000:00:01.0", "pcieport", 7)
		h.addGroupNode(7)
		if g, err := h.CheckGroup(nic); g != 7 || err != nil {
			t.Errorf("CheckGroup = %d, %v; want 7", g, err)
		}
	})
}

func TestBindVFIO(t *testing.T) {
	overrideOf := func(h *fakeHost) string { return h.read(h.sys("bus", "pci", "devices", nic, "driver_override")) }
	probed := func(h *fakeHost) string { return h.read(h.sys("bus", "pci", "drivers_probe")) }

	t.Run("already bound", func(t *testing.T) {
		h := newFakeHost(t)
		h.loadVFIO()
		h.addDevice(nic, vfioPCI, 7)
		if err := h.BindVFIO(nic); err != nil {
			t.Fatal(err)
		}
		if overrideOf(h) != "" || probed(h) != "" {
			t.Error("BindVFIO wrote to sysfs for a device already bound")
		}
	})
	t.Run("rebind from host driver", func(t *testing.T) {
		h := newFakeHost(t)
		h.loadVFIO()
		h.addDevice(nic, "e1000e", 7)
		err := h.BindVFIO("01:00.0")
		// The fake kernel does not rebind, so BindVFIO must notice.
		checkErr(t, err, []error{ErrNotBound}, nic, "bound to e1000e after probing")
		if got := overrideOf(h); got != vfioPCI {
			t.Errorf("driver_override = %q, want %q", got, vfioPCI)
		}
		if got := h.read(h.sys("bus", "pci", "drivers", "e1000e", "unbind")); got != nic {
			t.Errorf("e1000e/unbind = %q, want %q", got, nic)
		}
		if got := probed(h); got != nic {
			t.Errorf("drivers_probe = %q, want %q", got, nic)
		}
	})
	t.Run("unbound device", func(t *testing.T) {
		h := newFakeHost(t)
		h.loadVFIO()
		h.addDevice(nic, "", 7)
		checkErr(t, h.BindVFIO(nic), []error{ErrNotBound}, "no driver")
		if overrideOf(h) != vfioPCI || probed(h) != nic {
			t.Errorf("driver_override %q, drivers_probe %q; want %q, %q", overrideOf(h), probed(h), vfioPCI, nic)
		}
	})
	t.Run("vfio-pci not loaded", func(t *testing.T) {
		h := newFakeHost(t)
		h.addDevice(nic, "e1000e", 7)
		checkErr(t, h.BindVFIO(nic), []error{ErrNotSupported}, "modprobe vfio-pci")
		if overrideOf(h) != "" {
			t.Error("BindVFIO wrote driver_override without vfio-pci loaded")
		}
	})
	t.Run("no device", func(t *testing.T) {
		h := newFakeHost(t)
		h.loadVFIO()
		checkErr(t, h.BindVFIO(nic), []error{ErrNoSuchDevice}, nic)
	})
}

func TestOpenContainerWithoutVFIO(t *testing.T) {
	h := newFakeHost(t)
	_, err := h.OpenContainer()
	checkErr(t, err, []error{ErrNotSupported}, "/vfio/vfio", "modprobe vfio-pci")
}

func TestOpenGroupErrors(t *testing.T) {
	h := newFakeHost(t)
	_, err := h.OpenGroup(7)
	checkErr(t, err, []error{ErrNotSupported}, "open group 7", "modprobe vfio-pci")

	h.loadVFIO()
	_, err = h.OpenGroup(7)
	checkErr(t, err, []error{ErrNoSuchDevice}, "/vfio/7")
}

// TestOpenNotVFIO opens regular files where the device nodes belong: the
// first ioctl fails, and nothing stays open.
func TestOpenNotVFIO(t *testing.T) {
	checkNoFDLeak(t)
	h := newFakeHost(t)
	h.loadVFIO()
	h.addGroupNode(7)
	if _, err := h.OpenContainer(); !errors.Is(err, unix.ENOTTY) {
		t.Errorf("OpenContainer = %v, want ENOTTY", err)
	}
	if _, err := h.OpenGroup(7); !errors.Is(err, unix.ENOTTY) {
		t.Errorf("OpenGroup = %v, want ENOTTY", err)
	}
}

func TestOpenError(t *testing.T) {
	h := newFakeHost(t)
	h.loadVFIO()
	path := h.dev("vfio", "7")
	busy := h.openError(path, &fs.PathError{Op: "open", Path: path, Err: unix.EBUSY})
	checkErr(t, busy, []error{ErrDeviceBusy, unix.EBUSY}, "another process")
	denied := h.openError(path, &fs.PathError{Op: "open", Path: path, Err: unix.EACCES})
	checkErr(t, denied, []error{fs.ErrPermission}, "root", path)
}

func TestParsePCIAddr(t *testing.T) {
	for in, want := range map[string]string{
		"0000:01:00.0":  "0000:01:00.0",
		"01:00.0":       "0000:01:00.0",
		"0000:AF:1F.7":  "0000:af:1f.7",
		"10000:00:02.0": "10000:00:02.0", // VMD domains are wider
	} {
		if got, err := parsePCIAddr(in); got != want || err != nil {
			t.Errorf("parsePCIAddr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "01:00", "0000:01:00.8", "0000:1:00.0", "000:01:00.0", "0000:01:00.0/..", "../01:00.0", "0000:0g:00.0"} {
		if got, err := parsePCIAddr(in); err == nil {
			t.Errorf("parsePCIAddr(%q) = %q, want an error", in, got)
		}
	}
}
