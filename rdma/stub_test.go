//go:build !(verbs && cgo && linux)

package rdma

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// TestVerbsStub: a default build has no verbs provider and says why, in
// Available, Dial and Listen alike; Select falls back to TCP.
func TestVerbsStub(t *testing.T) {
	v := NewVerbs(Config{})
	err := v.Available()
	if !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "built without the verbs tag") {
		t.Fatalf("Available: %v, want ErrNotSupported naming the build tag", err)
	}
	if _, err := v.Dial(context.Background(), "127.0.0.1:1"); !errors.Is(err, ErrNotSupported) {
		t.Errorf("Dial: %v", err)
	}
	if _, err := v.Listen("127.0.0.1:0"); !errors.Is(err, ErrNotSupported) {
		t.Errorf("Listen: %v", err)
	}
	if err := v.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	p, err := Select(v, NewTCP(Config{}))
	if err != nil || p.Name() != "tcp" {
		t.Fatalf("Select: %v, %v; want tcp", p, err)
	}
	if _, err := Select(v); !errors.Is(err, ErrNotSupported) || !strings.Contains(err.Error(), "verbs") {
		t.Fatalf("Select(verbs): %v", err)
	}
}
