package ntbtest

import (
	"testing"

	"github.com/ntstack/ntstack/ntb"
)

func TestConformance(t *testing.T) {
	Conformance(t, func(t *testing.T) (ntb.Device, ntb.Device) {
		a, b := NewPair(64 << 10)
		return a, b
	})
}
