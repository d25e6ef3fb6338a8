package rackdemo

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"
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
// SIGINT or SIGTERM. It writes a line "ADDR=TO" to out for each pair once
// it listens, ADDR the address bound (LISTEN may name port 0).
func RelayMain(pairs []string, procs int, out io.Writer) error {
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
		fmt.Fprintf(out, "%s=%s\n", ln.Addr(), to)
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

// The rack workloads' ceiling: the TCP baseline's server and client code
// with two relays (RelayMain, one P each, as ntproxy runs) in place of the
// two ntproxys: client → relay → relay → server, three loopback hops each
// way, where the proxied path crosses its application's memory link, the
// NTB link and the far application's. RelayPath is its path.
const RelayPath = "tcp-relays"

// relayTransport runs the relays cmd (ntrack relay) starts in front of
// each server it listens for.
func relayTransport(ctx context.Context, cmd []string) transport {
	var addr string // the client's relay's, set by listen
	return transport{
		name: "tcp through two relays (a → relay → relay → b)",
		listen: func(int) (net.Listener, error) {
			l, err := listenRelayed(ctx, cmd)
			if err == nil {
				addr = l.addr
			}
			return l, err
		},
		dial: (&net.Dialer{}).DialContext,
		host: func(int) string { return addr },
		path: func(net.Conn) string { return RelayPath },
	}
}

// relayedListener is a server's listener with the relays in front of it;
// addr is the first relay's, and Close stops them too.
type relayedListener struct {
	net.Listener
	addr string
	cmds []*exec.Cmd
	once sync.Once
}

func (l *relayedListener) Close() error {
	err := l.Listener.Close()
	l.once.Do(func() {
		for _, c := range l.cmds {
			c.Process.Signal(syscall.SIGTERM)
		}
		for _, c := range l.cmds {
			c.Wait()
		}
	})
	return err
}

// listenRelayed listens on loopback and starts the two relays in front of
// it, the server's first, each on a port of its choosing.
func listenRelayed(ctx context.Context, cmd []string) (*relayedListener, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &relayedListener{Listener: ln, addr: ln.Addr().String()}
	for range 2 {
		c := exec.CommandContext(ctx, cmd[0], append(cmd[1:len(cmd):len(cmd)], "-procs", "1", "127.0.0.1:0="+l.addr)...)
		c.Stderr = os.Stderr
		c.WaitDelay = 2 * time.Second
		out, err := c.StdoutPipe()
		if err == nil {
			err = c.Start()
		}
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("start relay: %w", err)
		}
		l.cmds = append(l.cmds, c)
		// Its one line, "ADDR=TO", once it listens (EOF if it failed).
		line, err := bufio.NewReader(out).ReadString('\n')
		addr, _, ok := strings.Cut(line, "=")
		if err != nil || !ok {
			l.Close()
			return nil, fmt.Errorf("relay to %s did not start listening: %q, %v", l.addr, line, err)
		}
		l.addr = addr
	}
	return l, nil
}
