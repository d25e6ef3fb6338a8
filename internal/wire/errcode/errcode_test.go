package errcode

import "testing"

// The numbers are part of the protocol: a renumbering breaks every peer
// of another build.
func TestCodesStable(t *testing.T) {
	want := map[Code]uint16{
		OK: 0, CodeBadRequest: 1, CodeUnknown: 2, CodeDenied: 3, CodeNoPath: 4,
		CodePortInUse: 5, CodeRefused: 6, CodeInternal: 7, CodeVersion: 8,
		CodeQuota: 9, CodeUnavail: 10, CodeTimeout: 11, CodeNoDirect: 12,
	}
	for c, n := range want {
		if uint16(c) != n {
			t.Errorf("%v = %d, want %d", c, uint16(c), n)
		}
		if c.String() == "" || c.String() == Code(999).String() {
			t.Errorf("code %d has no name", n)
		}
	}
	if got := Code(999).String(); got != "code 999" {
		t.Errorf("unknown code prints %q", got)
	}
}
