package proc

import (
	"strings"
	"testing"
)

func TestCPUModel(t *testing.T) {
	for _, tc := range []struct{ name, cpuinfo, want string }{
		{"x86", "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7B13\nflags\t\t: fpu\n", "AMD EPYC 7B13"},
		{"first wins", "model name : A\nmodel name : B\n", "A"},
		{"arm64", "processor\t: 0\nBogoMIPS\t: 50.00\nCPU part\t: 0xd0c\n", "unknown"},
		{"empty", "", "unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := cpuModel(strings.NewReader(tc.cpuinfo)); got != tc.want {
				t.Errorf("cpuModel = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestCapEff(t *testing.T) {
	status := "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t0000000000000400\nCapBnd:\t000001ffffffffff\n"
	got, err := capEff(strings.NewReader(status))
	if err != nil || got != 1<<CapNetBindService {
		t.Fatalf("capEff = %#x, %v; want %#x", got, err, 1<<CapNetBindService)
	}
	if _, err := capEff(strings.NewReader("Name:\tx\n")); err == nil {
		t.Fatal("capEff of a status without CapEff: no error")
	}
	if _, err := capEff(strings.NewReader("CapEff:\tzz\n")); err == nil {
		t.Fatal("capEff of a bad CapEff: no error")
	}
}

func TestMayBindPrivilegedRoot(t *testing.T) {
	if err := MayBindPrivileged(Cred{UID: 0, PID: -1}); err != nil {
		t.Fatal(err)
	}
	// A non-root identity of a process that does not exist is refused.
	if err := MayBindPrivileged(Cred{UID: 65534, PID: -1}); err == nil {
		t.Fatal("pid -1 may bind a privileged port")
	}
}
