//go:build !linux

package vfio

import (
	"errors"
	"testing"
)

func TestNotSupported(t *testing.T) {
	var h Host
	if _, err := h.OpenContainer(); !errors.Is(err, ErrNotSupported) {
		t.Errorf("OpenContainer = %v, want ErrNotSupported", err)
	}
	if _, err := h.CheckGroup("0000:01:00.0"); !errors.Is(err, ErrNotSupported) {
		t.Errorf("CheckGroup = %v, want ErrNotSupported", err)
	}
	if _, err := NewDMABuffer(1); !errors.Is(err, ErrNotSupported) {
		t.Errorf("NewDMABuffer = %v, want ErrNotSupported", err)
	}
}
