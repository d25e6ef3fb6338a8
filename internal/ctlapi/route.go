package ctlapi

import (
	"fmt"
	"strings"

	"github.com/ntstack/ntstack/internal/config"
)

// noRDMA is why the rdma transport is never chosen: no verbs provider is
// built yet, and these machines have no RDMA device.
const noRDMA = "no RDMA provider on this host"

// PickRoute walks the transports a connection to peer may take, in order,
// and returns the first usable one, its reason naming what was passed
// over. ntbWhy says why the NTB link is unusable ("" if it is usable).
func PickRoute(peer config.Peer, asked []string, ntbWhy string) (Route, error) {
	order, excluded := peer.TransportOrder(asked)
	var passed []string
	for _, t := range order {
		switch t {
		case PathNTB:
			if ntbWhy == "" {
				return Route{Host: peer.Host, Path: PathNTB, Link: peer.Link,
					Reason: fmt.Sprintf("rack peer %s over NTB link %s", peer.Host, peer.Link)}, nil
			}
			passed = append(passed, ntbWhy)
		case PathRDMA:
			passed = append(passed, noRDMA)
		case PathTCP:
			if peer.Fallback != "" {
				why := strings.Join(passed, "; ")
				if why == "" {
					why = fmt.Sprintf("tcp first in the order %v", order)
				}
				return Route{Host: peer.Host, Path: PathTCP, Addr: peer.Fallback,
					Reason: fmt.Sprintf("%s: TCP fallback %s", why, peer.Fallback)}, nil
			}
			passed = append(passed, "no TCP fallback configured for "+peer.Host)
		}
	}
	for _, t := range config.Transports {
		if why, ok := excluded[t]; ok {
			passed = append(passed, t+" "+why)
		}
	}
	return Route{}, Errorf(CodeNoPath, "no path to %s: %s", peer.Host, strings.Join(passed, "; "))
}
