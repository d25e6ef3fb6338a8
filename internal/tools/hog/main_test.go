package main

import (
	"bytes"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRun: help and bad arguments follow the cli convention; a hog stops
// when signalled, and after -for without one.
func TestRun(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string // in stdout, or stderr for a bad use
	}{
		{[]string{"-h"}, 0, "usage: hog [-n threads] [-for duration]"},
		{[]string{"-n", "0"}, 2, "-n 0: want at least one thread"},
		{[]string{"extra"}, 2, `unexpected argument "extra"`},
		{[]string{"-bogus"}, 2, "flag provided but not defined"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(tc.args, &stdout, &stderr, nil); code != tc.code {
			t.Errorf("hog %v: exit %d, want %d; stderr %q", tc.args, code, tc.code, stderr.String())
		}
		if !strings.Contains(stdout.String()+stderr.String(), tc.out) {
			t.Errorf("hog %v: output %q %q, want %q in it", tc.args, stdout.String(), stderr.String(), tc.out)
		}
	}

	sig := make(chan os.Signal, 1)
	sig <- syscall.SIGTERM
	var stderr bytes.Buffer
	if code := run([]string{"-n", "1"}, new(bytes.Buffer), &stderr, sig); code != 0 {
		t.Errorf("signalled hog: exit %d, stderr %q", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "terminated, stopping") {
		t.Errorf("signalled hog said %q, want that it stops", stderr.String())
	}
	if code := run([]string{"-n", "1", "-for", time.Millisecond.String()}, new(bytes.Buffer), new(bytes.Buffer), nil); code != 0 {
		t.Errorf("hog -for 1ms: exit %d", code)
	}
}
