package proxy

import (
	"errors"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/rdma"
)

// OpenRDMA returns the verbs provider of cfg ([proxy.rdma]) if this host
// can take the RDMA path, or why not: no listener configured, a build
// without the verbs tag, no such device, its port down (the provider's
// errors match rdma.ErrNotSupported). ntmon asks it to tell its peers;
// ntproxy, to listen and dial with it. Close the provider when done.
func OpenRDMA(cfg config.RDMA) (*rdma.Verbs, error) {
	if cfg.Listen == "" {
		return nil, errors.New("proxy.rdma.listen not configured")
	}
	v := rdma.NewVerbs(rdma.Config{Device: cfg.Device, Port: cfg.Port})
	if err := v.Available(); err != nil {
		v.Close()
		return nil, err
	}
	return v, nil
}
