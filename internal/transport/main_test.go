package transport

import (
	"testing"

	"go.uber.org/goleak"
)

// Every test leaves no goroutine behind: pollers, workers and parked calls
// end with their Endpoint.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
