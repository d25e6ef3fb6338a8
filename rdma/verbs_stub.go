//go:build !(verbs && cgo && linux)

package rdma

import (
	"context"
	"fmt"
	"net"
)

// errNoVerbs is what the verbs provider says in a build without it.
var errNoVerbs = fmt.Errorf("verbs provider: built without the verbs tag (build with -tags verbs, cgo enabled and libibverbs-dev installed, on Linux): %w", ErrNotSupported)

// VerbsBuilt reports whether this build has the verbs provider.
const VerbsBuilt = false

// device stands in for the verbs device of verbs_cgo.go.
type device struct{}

func verbsAvailable(Config) error        { return errNoVerbs }
func openDevice(Config) (*device, error) { return nil, errNoVerbs }
func (*device) ref()                     {}
func (*device) unref() error             { return nil }
func (*device) connect(context.Context, net.Conn, Config) (link, error) {
	return nil, errNoVerbs
}
