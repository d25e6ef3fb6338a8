package main

import (
	"fmt"
	"net"
	"os"
	"sync"

	engine "github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/qos"
)

// ntb is ntstack itself in embedded mode: each process attaches its end of
// an emulated link (shared memory under /dev/shm) and talks through the
// transport engine's connections (socklike's, without the wrapper, so that
// the engine's knobs and counters are at hand). The server names the link
// after its pid.
func init() {
	register(transport{
		name: "ntb",
		listen: func(o *options) (net.Listener, string, error) {
			name := fmt.Sprintf("ntbench-%d", os.Getpid())
			ep, err := engine.Open(name, endpointConfig(o))
			if err != nil {
				return nil, "", err
			}
			ln, err := ep.Listen(1)
			if err != nil {
				ep.Close()
				return nil, "", err
			}
			return &endpointListener{Listener: ln, ep: ep, link: name, stats: o.stats}, name, nil
		},
		dial: func(o *options, link string) (net.Conn, error) {
			ep, err := clientEndpoint(link, o)
			if err != nil {
				return nil, err
			}
			c, err := ep.Dial(1)
			if err != nil {
				return nil, err
			}
			return c, c.SetPriority(qos.Class(o.priority))
		},
	})
}

// endpointConfig is the engine configuration the flags ask for.
func endpointConfig(o *options) engine.Config {
	core, _ := engine.ParseCoreModel(o.core) // checked with the flags
	return engine.Config{SpinBudget: o.spin, Partitions: o.partitions, QoS: o.qos, CoreModel: core, MTU: o.mtu, Window: o.recvWindow, SharedWindow: o.sharedWin}
}

// endpointListener closes the server's endpoint and removes the link file
// with the listener.
type endpointListener struct {
	*engine.Listener
	ep    *engine.Endpoint
	link  string
	stats bool
}

func (l *endpointListener) Close() error {
	if l.stats {
		fmt.Fprintf(os.Stderr, "ntb server %s: %+v\n", l.link, l.ep.Stats())
	}
	l.Listener.Close()
	err := l.ep.Close()
	shm.Remove("", l.link)
	return err
}

// The client process keeps one endpoint per link for all its connections,
// until the server it dials stops (closeClients).
var (
	clientMu   sync.Mutex
	clientEps  = map[string]*engine.Endpoint{}
	statsHooks []func() // print client counters when a measurement ends
)

func clientEndpoint(link string, o *options) (*engine.Endpoint, error) {
	clientMu.Lock()
	defer clientMu.Unlock()
	if ep := clientEps[link]; ep != nil {
		return ep, nil
	}
	ep, err := engine.Open(link, endpointConfig(o))
	if err != nil {
		return nil, err
	}
	clientEps[link] = ep
	if o.stats {
		statsHooks = append(statsHooks, func() { fmt.Fprintf(os.Stderr, "ntb client %s: %+v\n", link, ep.Stats()) })
	}
	return ep, nil
}

// closeClients closes the client's endpoints once their servers have
// stopped, and removes what of their links' files they put back after the
// server removed them (an attached end restores its socket and the lock
// file): a run of many rounds would otherwise keep an endpoint a round
// and leave its files under /dev/shm.
func closeClients() {
	clientMu.Lock()
	defer clientMu.Unlock()
	for link, ep := range clientEps {
		ep.Close()
		shm.Remove("", link)
		delete(clientEps, link)
	}
}
