package gateway

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine they started is
// still running once they have all returned. With $childEnv set the test
// binary is a stand-in gateway process instead (process_test.go).
func TestMain(m *testing.M) {
	if mode := os.Getenv(childEnv); mode != "" {
		os.Exit(runTestChild(mode))
	}
	goleak.VerifyTestMain(m)
}
