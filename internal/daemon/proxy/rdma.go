package proxy

import (
	"errors"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/wire/hostauth"
	"github.com/ntstack/ntstack/rdma"
)

// OpenRDMA returns the verbs provider of cfg ([proxy.rdma]) if this host
// can take the RDMA path, or why not: no listener configured, a build
// without the verbs tag, no such device, its port down (the provider's
// errors match rdma.ErrNotSupported). ntmon asks it to tell its peers;
// ntproxy, to listen and dial with it, with auth (the host's identity,
// nil when insecure) authenticating every connection's TCP bootstrap.
// Close the provider when done.
func OpenRDMA(cfg config.RDMA, auth *hostauth.Auth) (*rdma.Verbs, error) {
	if cfg.Listen == "" {
		return nil, errors.New("proxy.rdma.listen not configured")
	}
	rc := rdma.Config{Device: cfg.Device, Port: cfg.Port}
	if auth != nil { // a nil *Auth in the interface would not be nil
		rc.Auth = auth
	}
	v := rdma.NewVerbs(rc)
	if err := v.Available(); err != nil {
		v.Close()
		return nil, err
	}
	return v, nil
}
