package ntb_test

// An upward import made by a test: rejected (no exception names it).
import (
	"testing"

	"example.com/tree/socklike"
)

func TestBuffer(t *testing.T) { _ = socklike.Buffer }
