package rackdemo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"
)

// The gateway table's ceiling: two plain Go TCP relays in place of the
// two gateways. A client's connection reaches a relay on its own host's
// loopback, which dials a relay on the server host over the rack's
// network, which dials the server on that host's loopback — the gateway
// path's shape (two user-space hops, each a loopback socket pair plus the
// rack between them) with TCP instead of the fabric between the hops. Each
// relay is a process of two Ps, like ntproxy's gateway process.

// relayPorts are the relays' listening ports: the client host's relay
// listens on 127.0.0.1 at the first, the server host's on its rack address
// at the second.
var relayPorts = map[int][2]int{
	redisPort: {26379, 27379},
	nginxPort: {28080, 27080},
}

// Relay serves ln until it fails or ctx ends: each connection is carried
// to a new connection to to, bytes copied both ways by two goroutines, each
// direction's end passed on as a half-close.
func Relay(ctx context.Context, ln net.Listener, to string) error {
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait() // relayConn closes its connections once ctx ends
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			relayConn(ctx, c, to)
		}()
	}
}

// relayConn carries c to a new connection to to until both directions end
// or ctx does.
func relayConn(ctx context.Context, c net.Conn, to string) {
	defer c.Close()
	u, err := net.Dial("tcp", to)
	if err != nil {
		return
	}
	defer u.Close()
	stop := context.AfterFunc(ctx, func() {
		c.Close()
		u.Close()
	})
	defer stop()
	done := make(chan struct{})
	go func() {
		relayCopy(u, c)
		close(done)
	}()
	relayCopy(c, u)
	<-done
}

// relayCopy copies src to dst, then half-closes dst's write side.
func relayCopy(dst, src net.Conn) {
	io.Copy(dst, src)
	if tc, ok := dst.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}

// RelayMain is the relay program ("ntrack relay LISTEN=TO ..."): it relays
// each LISTEN address to its TO address with procs Ps (GOMAXPROCS), until
// SIGINT or SIGTERM.
func RelayMain(pairs []string, procs int) error {
	if len(pairs) == 0 {
		return errors.New("relay: want LISTEN=TO pairs")
	}
	if procs > 0 {
		runtime.GOMAXPROCS(procs)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, len(pairs))
	started := 0
	var err error
	for _, pair := range pairs {
		listen, to, ok := strings.Cut(pair, "=")
		if !ok {
			err = fmt.Errorf("relay: %q is not LISTEN=TO", pair)
			break
		}
		ln, lerr := net.Listen("tcp", listen)
		if lerr != nil {
			err = fmt.Errorf("relay: %w", lerr)
			break
		}
		started++
		go func() { errc <- Relay(ctx, ln, to) }()
	}
	if err != nil {
		stop()
	}
	for range started {
		err = errors.Join(err, <-errc)
	}
	return err
}
