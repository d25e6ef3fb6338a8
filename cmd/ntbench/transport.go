package main

import (
	"fmt"
	"net"
	"slices"
	"strings"
)

// A transport creates connected byte streams between the client process and
// the server process. Each transport lives in a file of its own and adds
// itself to the registry from an init function:
//
//	func init() {
//		register(transport{
//			name:   "tcp",
//			listen: func(o *options) (net.Listener, string, error) { … },
//			dial:   func(o *options, addr string) (net.Conn, error) { … },
//		})
//	}
//
// Lifetimes: the server process closes the listener and every accepted
// connection before it exits, so whatever listen sets up (files, shared
// memory) must be released by the listener's Close; the client closes the
// connections it dialled after each size.
type transport struct {
	name string
	// listen runs in the server process; addr is what the client passes to
	// dial. It must fit on one line.
	listen func(o *options) (ln net.Listener, addr string, err error)
	// dial runs in the client process, once per connection.
	dial func(o *options, addr string) (net.Conn, error)
	// local, set instead of listen and dial, is a bound rather than a
	// transport: it measures stream in the client process, with no server,
	// on cpus (the client's and the server's; -1: not pinned), and returns
	// one sample per connection.
	local func(o *options, size int, cpus [2]int) ([]sample, error)
}

// transports holds every registered transport by name. It is written only
// by init functions.
var transports = map[string]transport{}

// register adds t to the transports the benchmark knows. It panics on an
// unusable or duplicate name: that is a programming error caught at start-up.
func register(t transport) {
	served := t.listen != nil && t.dial != nil && t.local == nil
	bound := t.listen == nil && t.dial == nil && t.local != nil
	if t.name == "" || strings.ContainsAny(t.name, ", \t\n") || !served && !bound {
		panic(fmt.Sprintf("ntbench: register: incomplete transport %q", t.name))
	}
	if _, dup := transports[t.name]; dup {
		panic(fmt.Sprintf("ntbench: register: transport %q registered twice", t.name))
	}
	transports[t.name] = t
}

// transportNames returns the registered transport names, sorted; the
// bounds (local) only if all is set.
func transportNames(all bool) []string {
	names := make([]string, 0, len(transports))
	for name, t := range transports {
		if all || t.local == nil {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}
