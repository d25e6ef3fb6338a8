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
