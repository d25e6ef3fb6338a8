// Package accept keeps a daemon's accept loops alive and fair: nothing a
// local user or the network sends can make a listener stop taking
// connections, nor let one source crowd out the others.
//
//   - Retry is an accept loop's error policy, as net/http's Server.Serve
//     has it: after a failed Accept (EMFILE, ENFILE, ENOBUFS, ENOMEM,
//     ECONNABORTED, ...) wait 5 ms, doubling up to 1 s, log, and try again;
//     only a closed listener ends the loop.
//   - Limiter bounds the connections each source (a remote IP, a local
//     uid) has pending: accepted but not yet identified or past their
//     handshake. A connection over the bound is closed at once, so a flood
//     from one source costs the daemon a descriptor for microseconds, not
//     for the length of a handshake timeout, and the others still get in.
//   - Listener wraps a net.Listener with both, for servers that run their
//     own accept loop (net/http): its Accept fails only once it is closed.
//
// The handshake deadline itself is the caller's: it knows when its
// handshake ends, and sets and clears the deadline on the connection.
//
// Concurrency: a Limiter and a Listener are safe for concurrent use; a
// Retry belongs to one accept loop. Lifetime: a pending slot is held until
// its release function runs (Listener: until the connection is closed or
// Conn.Identified); forgetting to release one shrinks its source's bound
// for good.
package accept

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"syscall"
	"time"
)

// The retry delays after a failed Accept, as net/http's Server.Serve.
const (
	MinDelay = 5 * time.Millisecond
	MaxDelay = time.Second
)

// Temporary reports whether err, from Accept, names a shortage or a
// connection that went away before it was taken: the listener still works
// and the next Accept may succeed. Any other error but a closed listener
// is retried too (Retry), but logged as unexpected.
func Temporary(err error) bool {
	for _, e := range []syscall.Errno{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM,
		syscall.ECONNABORTED, syscall.ECONNRESET, syscall.EINTR, syscall.EAGAIN, syscall.EPROTO, syscall.EPERM} {
		if errors.Is(err, e) {
			return true
		}
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// Retry is the error policy of one accept loop:
//
//	for {
//		c, ok := accept.Next(&r, done, ln.Accept)
//		if !ok {
//			return
//		}
//		...
//	}
type Retry struct {
	// What names the listener in log lines ("fallback listener").
	What string
	// Logf receives the log lines (nil: none).
	Logf func(format string, args ...any)

	delay  time.Duration // the last wait; 0 after a success
	failed int           // failed Accepts since the last success
}

// Pause handles a failed Accept. It reports false when the loop must end:
// the listener is closed, or done is. Otherwise it logs err, waits the next
// delay (MinDelay doubling to MaxDelay), or until done closes, and reports
// whether the loop should accept again.
func (r *Retry) Pause(done <-chan struct{}, err error) bool {
	if errors.Is(err, net.ErrClosed) || closed(done) {
		return false
	}
	r.delay = NextDelay(r.delay)
	r.failed++
	// A shortage logs its first errors and then about once a second: at
	// most a line per MaxDelay however long it lasts. An unexpected error
	// is always logged.
	temp := Temporary(err)
	if r.Logf != nil && (r.failed <= 3 || r.delay == MaxDelay || !temp) {
		kind := "temporary"
		if !temp {
			kind = "unexpected"
		}
		r.Logf("accept on %s: %v (%s error %d in a row); retrying in %v", r.What, err, kind, r.failed, r.delay)
	}
	t := time.NewTimer(r.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}

// OK records a successful Accept: the next failure waits MinDelay again.
func (r *Retry) OK() {
	if r.failed > 0 && r.Logf != nil {
		r.Logf("accept on %s: accepting again after %d failed attempts", r.What, r.failed)
	}
	r.delay, r.failed = 0, 0
}

// Next calls accept until it returns a connection, pausing after each
// failure as Pause does, and reports false once the loop must end (the
// listener or done closed).
func Next[C any](r *Retry, done <-chan struct{}, accept func() (C, error)) (C, bool) {
	for {
		c, err := accept()
		if err == nil {
			r.OK()
			return c, true
		}
		if !r.Pause(done, err) {
			var zero C
			return zero, false
		}
	}
}

// NextDelay is the wait after prev: MinDelay first, then doubling to
// MaxDelay.
func NextDelay(prev time.Duration) time.Duration {
	if prev <= 0 {
		return MinDelay
	}
	return min(2*prev, MaxDelay)
}

func closed(done <-chan struct{}) bool {
	select {
	case <-done:
		return true
	default:
		return false
	}
}

// Limiter bounds the pending connections of each source.
type Limiter struct {
	what      string
	perSource int
	logf      func(string, ...any)

	// mu protects the following fields.
	mu      sync.Mutex
	pending map[string]int
	refused int       // connections refused since the last log line
	logged  time.Time // when the last refusal was logged
}

// NewLimiter returns a Limiter allowing perSource pending connections to
// each source (at least 1); what names the listener in the log lines
// logf receives (nil: none) when it refuses connections.
func NewLimiter(what string, perSource int, logf func(string, ...any)) *Limiter {
	return &Limiter{what: what, perSource: max(perSource, 1), logf: logf, pending: map[string]int{}}
}

// Take counts a connection from source as pending. It reports false, and
// counts nothing, when source has its bound pending already; the caller
// then closes the connection. Otherwise release, which is idempotent and
// safe to call from any goroutine, ends the connection's pending time.
func (l *Limiter) Take(source string) (release func(), ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.pending[source] >= l.perSource {
		l.refused++
		// Refusals are logged at most once a second, with their count.
		if now := time.Now(); l.logf != nil && now.Sub(l.logged) >= time.Second {
			l.logf("%s: refused %d connection(s): source %s has %d pending (the limit)", l.what, l.refused, source, l.perSource)
			l.refused, l.logged = 0, now
		}
		return nil, false
	}
	l.pending[source]++
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			defer l.mu.Unlock()
			if l.pending[source]--; l.pending[source] <= 0 {
				delete(l.pending, source)
			}
		})
	}, true
}

// Pending returns how many connections source has pending.
func (l *Limiter) Pending(source string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.pending[source]
}

// RemoteIP is the source of a TCP (or any IP) connection: its remote
// address without the port. Other addresses are their own source.
func RemoteIP(c net.Conn) (string, error) {
	a := c.RemoteAddr()
	if a == nil {
		return "", errors.New("no remote address")
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap().String(), nil
	}
	if host, _, err := net.SplitHostPort(a.String()); err == nil {
		return host, nil
	}
	return a.String(), nil
}

// Options configure a Listener.
type Options struct {
	// What names the listener in log lines.
	What string
	// Logf receives the log lines (nil: none).
	Logf func(format string, args ...any)
	// Source names a connection's source (nil: RemoteIP). A connection
	// whose source cannot be told is closed.
	Source func(net.Conn) (string, error)
	// Exempt, if set, reports sources that are not bounded (root, say,
	// who is trusted with everything).
	Exempt func(source string) bool
	// PerSource bounds each source's pending connections (0: no bound,
	// and Source is not called).
	PerSource int
}

// Listener is a net.Listener whose Accept backs off and retries on every
// error until the listener is closed, and which closes at once the
// connections of a source that has Options.PerSource pending. A returned
// connection (a *Conn) stays pending until it is closed or Identified.
type Listener struct {
	net.Listener
	o     Options
	lim   *Limiter
	retry Retry
	done  chan struct{}
	once  sync.Once
}

var _ net.Listener = (*Listener)(nil)

// Wrap returns ln as a Listener; closing the Listener closes ln.
func Wrap(ln net.Listener, o Options) *Listener {
	if o.Source == nil {
		o.Source = RemoteIP
	}
	return &Listener{
		Listener: ln,
		o:        o,
		lim:      NewLimiter(o.What, o.PerSource, o.Logf),
		retry:    Retry{What: o.What, Logf: o.Logf},
		done:     make(chan struct{}),
	}
}

// Accept returns the next connection within its source's bound. It fails
// only once the listener is closed (net.ErrClosed, or the error of the
// Accept that found it closed).
func (l *Listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if l.retry.Pause(l.done, err) {
				continue
			}
			if closed(l.done) && !errors.Is(err, net.ErrClosed) {
				err = fmt.Errorf("accept on %s: %w (%v)", l.o.What, net.ErrClosed, err)
			}
			return nil, err
		}
		l.retry.OK()
		if l.o.PerSource <= 0 {
			return &Conn{Conn: c, release: func() {}}, nil
		}
		src, err := l.o.Source(c)
		if err != nil {
			if l.o.Logf != nil {
				l.o.Logf("%s: refused a connection: its source: %v", l.o.What, err)
			}
			c.Close()
			continue
		}
		if l.o.Exempt != nil && l.o.Exempt(src) {
			return &Conn{Conn: c, Source: src, release: func() {}}, nil
		}
		release, ok := l.lim.Take(src)
		if !ok {
			c.Close()
			continue
		}
		return &Conn{Conn: c, Source: src, release: release}, nil
	}
}

// Close closes the listener and ends a backoff in progress.
func (l *Listener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// Conn is a connection a Listener accepted, pending until Identified or
// closed.
type Conn struct {
	net.Conn
	// Source is where it came from, as Options.Source named it.
	Source  string
	release func()
}

// Identified ends the connection's pending time: its peer is known.
func (c *Conn) Identified() { c.release() }

// Close closes the connection and ends its pending time.
func (c *Conn) Close() error {
	c.release()
	return c.Conn.Close()
}

// NetConn returns the accepted connection itself (a *net.UnixConn, say).
func (c *Conn) NetConn() net.Conn { return c.Conn }
