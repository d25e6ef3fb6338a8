package ctlapi

import (
	"fmt"
	"slices"
	"strings"
)

// Transports, in the default order of preference.
var Transports = []string{PathNTB, PathRDMA, PathTCP}

// Paths are the ways to one peer host that the host's configuration
// offers.
type Paths struct {
	Host string
	// Link names the emulated NTB link to the peer ("" = no NTB link).
	Link string
	// Fallback is a TCP address that reaches the peer off the fabric.
	Fallback string
	// Transports restricts and orders the paths to the peer: a subset of
	// Transports (empty = all of them, in that order).
	Transports []string
}

// TransportOrder returns the transports a connection to p may try, in
// order: those the connection asks for (all if none), in its order, that
// p's Transports allow; and, for each transport left out, why.
func (p Paths) TransportOrder(asked []string) (order []string, excluded map[string]string) {
	allowed := p.Transports
	if len(allowed) == 0 {
		allowed = Transports
	}
	want := asked
	if len(want) == 0 {
		want = allowed
	}
	excluded = map[string]string{}
	for _, t := range want {
		if slices.Contains(allowed, t) {
			order = append(order, t)
		} else {
			excluded[t] = fmt.Sprintf("not allowed for %s (peers.transports = %v)", p.Host, allowed)
		}
	}
	for _, t := range Transports {
		if _, ok := excluded[t]; !ok && !slices.Contains(order, t) {
			if slices.Contains(allowed, t) {
				excluded[t] = "not asked for by the connection"
			} else {
				excluded[t] = fmt.Sprintf("not allowed for %s (peers.transports = %v)", p.Host, allowed)
			}
		}
	}
	return order, excluded
}

// Reach is what a connection to a peer could use at the moment, as far as
// the control plane knows.
type Reach struct {
	// NTBWhy says why the NTB link is unusable ("" = usable).
	NTBWhy string
	// NTBNote is added to the reason of a route over the NTB link: what
	// the control plane could not check (its session with the peer is
	// down, and ntproxy goes by the link's own state).
	NTBNote string
	// RDMAAddr is the peer ntproxy's RDMA listener when both hosts have
	// a usable RDMA device; otherwise RDMAWhy says why not.
	RDMAAddr string
	RDMAWhy  string
}

// PickRoute walks the transports a connection to peer may take, in order,
// and returns the first usable one, its reason naming what was passed
// over. The route's Hops are every transport of that order the pair has
// (the NTB link while merely down too): the ones a connection may move to
// when its transport fails, and back.
func PickRoute(peer Paths, asked []string, r Reach) (Route, error) {
	order, excluded := peer.TransportOrder(asked)
	var hops []Hop
	for _, t := range order {
		switch {
		case t == PathNTB && peer.Link != "":
			hops = append(hops, Hop{Path: PathNTB, Addr: peer.Link})
		case t == PathRDMA && r.RDMAAddr != "":
			hops = append(hops, Hop{Path: PathRDMA, Addr: r.RDMAAddr})
		case t == PathTCP && peer.Fallback != "":
			hops = append(hops, Hop{Path: PathTCP, Addr: peer.Fallback})
		}
	}
	var passed []string
	for _, t := range order {
		switch t {
		case PathNTB:
			if r.NTBWhy == "" {
				why := fmt.Sprintf("rack peer %s over NTB link %s", peer.Host, peer.Link)
				if r.NTBNote != "" {
					why += "; " + r.NTBNote
				}
				return Route{Host: peer.Host, Path: PathNTB, Link: peer.Link, Hops: hops, Reason: why}, nil
			}
			passed = append(passed, r.NTBWhy)
		case PathRDMA:
			if r.RDMAAddr != "" {
				return Route{Host: peer.Host, Path: PathRDMA, Addr: r.RDMAAddr, Hops: hops,
					Reason: fmt.Sprintf("%s: RDMA %s", passedOver(passed, order), r.RDMAAddr)}, nil
			}
			passed = append(passed, r.RDMAWhy)
		case PathTCP:
			if peer.Fallback != "" {
				return Route{Host: peer.Host, Path: PathTCP, Addr: peer.Fallback, Hops: hops,
					Reason: fmt.Sprintf("%s: TCP fallback %s", passedOver(passed, order), peer.Fallback)}, nil
			}
			passed = append(passed, "no TCP fallback configured for "+peer.Host)
		}
	}
	for _, t := range Transports {
		if why, ok := excluded[t]; ok {
			passed = append(passed, t+" "+why)
		}
	}
	return Route{}, Errorf(CodeNoPath, "no path to %s: %s", peer.Host, strings.Join(passed, "; "))
}

// passedOver is why a route did not take the transports before it.
func passedOver(passed, order []string) string {
	if len(passed) == 0 {
		return fmt.Sprintf("%s first in the order %v", order[0], order)
	}
	return strings.Join(passed, "; ")
}
