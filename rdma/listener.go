package rdma

import (
	"context"
	"log"
	"net"
	"sync"
	"time"

	"github.com/ntstack/ntstack/internal/prim/accept"
)

// listener is both providers' net.Listener: a TCP listener for the
// bootstrap sockets, and one goroutine per accepted socket running the
// provider's handshake, so a slow or silent client never holds up
// Accept. Connections that finish their handshake queue for Accept; the
// queue is bounded (acceptBacklog), and a full queue holds up handshakes.
type listener struct {
	tcp       net.Listener
	addr      *Addr
	timeout   time.Duration
	handshake func(ctx context.Context, c net.Conn) (net.Conn, error)

	ready  chan net.Conn
	ctx    context.Context // cancelled by Close: ends handshakes
	cancel context.CancelFunc
	wg     sync.WaitGroup // runAccept and the handshakes

	closeOnce sync.Once
}

const acceptBacklog = 16

var _ net.Listener = (*listener)(nil)

func newListener(provider, addr string, timeout time.Duration, handshake func(context.Context, net.Conn) (net.Conn, error)) (*listener, error) {
	tl, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &listener{
		tcp:       tl,
		addr:      &Addr{Provider: provider, TCP: tl.Addr()},
		timeout:   timeout,
		handshake: handshake,
		ready:     make(chan net.Conn, acceptBacklog),
		ctx:       ctx,
		cancel:    cancel,
	}
	l.wg.Go(l.runAccept)
	return l, nil
}

// maxPendingPerIP bounds the handshakes in progress from one remote
// address; more connections from it are closed at once.
const maxPendingPerIP = 64

// runAccept accepts bootstrap sockets until the listener closes. Accept
// errors (descriptors running out, say) are retried with backoff, as
// net/http's Server.Serve, never the end of the listener. The provider has
// no logger of its own: the retries and refusals go to the standard
// logger, which the daemons set up.
func (l *listener) runAccept() {
	what := "rdma bootstrap " + l.tcp.Addr().String()
	retry := accept.Retry{What: what, Logf: log.Printf}
	pending := accept.NewLimiter(what, maxPendingPerIP, log.Printf)
	for {
		c, ok := accept.Next(&retry, l.ctx.Done(), l.tcp.Accept)
		if !ok {
			return
		}
		ip, err := accept.RemoteIP(c)
		if err != nil {
			c.Close()
			continue
		}
		release, ok := pending.Take(ip)
		if !ok {
			c.Close()
			continue
		}
		l.wg.Go(func() {
			ctx, cancel := context.WithTimeout(l.ctx, l.timeout)
			defer cancel()
			conn, err := l.handshake(ctx, c)
			release()
			if err != nil {
				c.Close()
				return
			}
			select {
			case l.ready <- conn:
			case <-l.ctx.Done():
				conn.Close()
			}
		})
	}
}

// Accept returns the next connection whose handshake completed.
func (l *listener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.ctx.Done():
		return nil, &net.OpError{Op: "accept", Net: l.addr.Network(), Addr: l.addr, Err: net.ErrClosed}
	}
}

// Close stops accepting, ends handshakes in progress and closes the
// connections that were not yet accepted.
func (l *listener) Close() error {
	err := net.ErrClosed
	l.closeOnce.Do(func() {
		l.cancel()
		err = l.tcp.Close()
		l.wg.Wait()
		for {
			select {
			case c := <-l.ready:
				c.Close()
			default:
				return
			}
		}
	})
	if err == net.ErrClosed {
		return &net.OpError{Op: "close", Net: l.addr.Network(), Addr: l.addr, Err: net.ErrClosed}
	}
	return err
}

func (l *listener) Addr() net.Addr { return l.addr }
