package monitor

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/accept"
)

// peerState is one configured rack peer. Its fields are guarded by
// Monitor.mu; cfg never changes.
type peerState struct {
	cfg config.Peer

	sess     *session  // the live session, nil while down
	why      string    // why it is up or down, in words
	since    time.Time // when it last went up or down
	everUp   bool
	retry    string    // why the last attempt to re-establish failed
	lastSeen time.Time // last frame received
	hello    Hello     // the peer's HELLO, from the last session
	// linkProblem says why the NTB link to the peer is not usable although
	// the session is up ("" = usable, or no link configured).
	linkProblem string
	// changed is closed and replaced whenever sess changes, waking the
	// peer's dialer.
	changed chan struct{}
}

// session is one peer connection, from its first frame to its close.
type session struct {
	m        *Monitor
	conn     net.Conn
	outbound bool   // this host dialed
	proved   string // the peer its certificate proved ("" = insecure)
	host     string // the peer, known after its HELLO
	dialer   string // the host that dialed
	hello    Hello

	wmu sync.Mutex // serialises frame writes

	done      chan struct{} // closed when the session ends
	closeOnce sync.Once
	closeWhy  string // set by close before done is closed
}

func (s *session) direction() string {
	if s.outbound {
		return "dialed by this host"
	}
	return "dialed by " + s.host
}

// send writes one frame, bounded by the peer timeout.
func (s *session) send(t FrameType, v any) error {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_ = s.conn.SetWriteDeadline(time.Now().Add(s.m.peerTimeout))
	return WriteFrame(s.conn, t, v)
}

// refuse sends an ERROR frame, best effort: the connection is closed next.
func (s *session) refuse(body ErrorBody) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	_ = s.conn.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	_ = WriteFrame(s.conn, FrameError, body)
}

// bye sends a BYE frame, best effort, and closes the session.
func (s *session) bye(msg string) {
	s.wmu.Lock()
	_ = s.conn.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	_ = WriteFrame(s.conn, FrameBye, ErrorBody{Message: msg})
	s.wmu.Unlock()
	s.close(msg)
}

// close ends the session with a reason; the first reason sticks.
func (s *session) close(why string) {
	s.closeOnce.Do(func() {
		s.closeWhy = why
		close(s.done)
		_ = s.conn.Close()
	})
}

// refusal is a handshake failure: msg goes to the peer in an ERROR frame
// (when send is set) and into the peer's status.
type refusal struct {
	host string // the configured peer it concerns, "" if none
	msg  string
	send bool
	// duplicate marks the loser of a simultaneous dial: expected, not a
	// fault, and no news for the peer's status.
	duplicate bool
}

func (r *refusal) Error() string { return r.msg }

// runAccept accepts peer connections until the listener closes.
func (m *Monitor) runAccept() {
	defer m.wg.Done()
	retry := accept.Retry{What: "peer listener " + m.peerLn.Addr().String(), Logf: m.logf}
	perIP := accept.NewLimiter("peer listener "+m.peerLn.Addr().String(), maxHandshakesPerIP, m.logf)
	for {
		conn, ok := accept.Next(&retry, m.ctx.Done(), m.peerLn.Accept)
		if !ok {
			return
		}
		ip, err := accept.RemoteIP(conn)
		if err != nil {
			_ = conn.Close()
			continue
		}
		release, ok := perIP.Take(ip)
		if !ok {
			_ = conn.Close()
			continue
		}
		select {
		case m.handshakes <- struct{}{}:
		default:
			release()
			m.log.Warn("refuse peer connection: too many pending handshakes", "remote", conn.RemoteAddr().String(), "limit", maxHandshakes)
			_ = conn.Close()
			continue
		}
		m.wg.Add(1)
		go m.runInbound(conn, release)
	}
}

func (m *Monitor) runInbound(conn net.Conn, release func()) {
	defer m.wg.Done()
	m.serveConn(conn, "", func() {
		release()
		<-m.handshakes
	})
}

// secure runs the TLS handshake on a new peer connection (bounded by the
// peer timeout) when this host authenticates its peers, and returns the
// connection to speak on and the host its certificate proved ("" when
// insecure). dialed is the peer this host dialed, "" for an inbound
// connection.
func (m *Monitor) secure(conn net.Conn, dialed string) (net.Conn, string, error) {
	if m.auth == nil {
		return conn, "", nil
	}
	_ = conn.SetDeadline(time.Now().Add(m.peerTimeout))
	defer func() { _ = conn.SetDeadline(time.Time{}) }()
	if dialed != "" {
		tc, err := m.auth.Client(conn, dialed)
		if err != nil {
			return nil, "", err
		}
		return tc, dialed, nil
	}
	tc, host, err := m.auth.Server(conn)
	if err != nil {
		return nil, "", err
	}
	return tc, host, nil
}

// runDialer keeps a session to one peer: while none is up it dials the
// peer's control address, backing off from BackoffMin to BackoffMax.
func (m *Monitor) runDialer(p *peerState) {
	defer m.wg.Done()
	backoff := m.opts.BackoffMin
	for {
		m.mu.Lock()
		up, changed := p.sess != nil, p.changed
		m.mu.Unlock()
		if up {
			select {
			case <-m.ctx.Done():
				return
			case <-changed:
				continue
			}
		}
		d := net.Dialer{Timeout: m.peerTimeout}
		conn, err := d.DialContext(m.ctx, "tcp", p.cfg.Control)
		if m.ctx.Err() != nil {
			if conn != nil {
				_ = conn.Close()
			}
			return
		}
		if err != nil {
			m.noteDown(p.cfg.Host, fmt.Sprintf("dial %s: %v", p.cfg.Control, unwrapOp(err)))
		} else if m.serveConn(conn, p.cfg.Host, nil) {
			// A session ran and ended: redial at once, then back off.
			backoff = m.opts.BackoffMin
			continue
		}
		if !sleepCtx(m.ctx, backoff) {
			return
		}
		backoff = min(2*backoff, m.opts.BackoffMax)
	}
}

// unwrapOp drops *net.OpError's repetition of the address.
func unwrapOp(err error) error {
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err
	}
	return err
}

// serveConn runs one peer connection: the HELLO exchange, then the
// session until it ends. dialed is the peer this host dialed ("" for an
// inbound connection); handshakeDone, if set, is called once the HELLO
// exchange is over. It reports whether a session was established.
func (m *Monitor) serveConn(conn net.Conn, dialed string, handshakeDone func()) bool {
	if !m.track(conn) {
		_ = conn.Close()
		if handshakeDone != nil {
			handshakeDone()
		}
		return false
	}
	defer m.untrack(conn)
	sc, proved, err := m.secure(conn, dialed)
	if err != nil {
		if handshakeDone != nil {
			handshakeDone()
		}
		m.unauthenticated(conn, dialed, err)
		return false
	}
	s := &session{m: m, conn: sc, outbound: dialed != "", proved: proved, done: make(chan struct{})}
	err = m.handshake(s, dialed)
	if handshakeDone != nil {
		handshakeDone()
	}
	if err != nil {
		m.refused(s, err)
		return false
	}
	m.runSession(s)
	return true
}

// handshake exchanges HELLOs and registers the session. The dialer speaks
// first; the acceptor answers with its HELLO or an ERROR, so a refused
// dialer never counts the session as up.
func (m *Monitor) handshake(s *session, dialed string) error {
	deadline := time.Now().Add(m.peerTimeout)
	if s.outbound {
		s.host = dialed
		s.dialer = m.cfg.Host
		if err := s.send(FrameHello, m.hello()); err != nil {
			return &refusal{host: dialed, msg: fmt.Sprintf("send HELLO: %v", unwrapOp(err))}
		}
	}
	_ = s.conn.SetReadDeadline(deadline)
	f, err := ReadFrame(s.conn)
	if err != nil {
		switch {
		case errors.Is(err, ErrFrame):
			return &refusal{host: dialed, msg: fmt.Sprintf("first frame: %v", err), send: true}
		case errors.Is(err, os.ErrDeadlineExceeded):
			return &refusal{host: dialed, msg: fmt.Sprintf("no HELLO within %v", m.peerTimeout)}
		case errors.Is(err, io.EOF):
			return &refusal{host: dialed, msg: "connection closed before HELLO"}
		}
		return &refusal{host: dialed, msg: fmt.Sprintf("read HELLO: %v", unwrapOp(err))}
	}
	if f.Type == FrameError || f.Type == FrameBye {
		var body ErrorBody
		if err := DecodeBody(f, &body); err != nil {
			return &refusal{host: dialed, msg: err.Error()}
		}
		who := dialed
		if who == "" {
			who = "the peer"
		}
		return &refusal{host: dialed, msg: fmt.Sprintf("%s refused the session: %s", who, body.Message), duplicate: body.Reason == reasonDuplicate}
	}
	if f.Type != FrameHello {
		return &refusal{host: dialed, msg: fmt.Sprintf("first frame is %v, want HELLO", f.Type), send: true}
	}
	h, err := DecodeHello(f)
	if err != nil {
		return &refusal{host: dialed, msg: err.Error(), send: true}
	}
	if err := m.checkHello(h, dialed, s.proved); err != nil {
		return err
	}
	s.host, s.hello = h.Host, h
	if !s.outbound {
		s.dialer = h.Host
	}
	_ = s.conn.SetReadDeadline(time.Time{})
	old, err := m.register(s)
	if err != nil {
		return err
	}
	if old != nil {
		old.bye(fmt.Sprintf("replaced by the session dialed by %s", s.dialer))
	}
	if !s.outbound {
		if err := s.send(FrameHello, m.hello()); err != nil {
			m.unregister(s, fmt.Sprintf("send HELLO: %v", unwrapOp(err)))
			return &refusal{msg: fmt.Sprintf("send HELLO: %v", unwrapOp(err))}
		}
	}
	return nil
}

// checkHello decides whether to talk to the sender of h. proved is the
// host the connection's certificate proved ("" = insecure): the HELLO
// must name it, so that the peer's identity comes from its key, never
// from what it writes.
func (m *Monitor) checkHello(h Hello, dialed, proved string) error {
	known := ""
	if _, ok := m.peers[h.Host]; ok {
		known = h.Host
	}
	if proved != "" {
		known = proved
	}
	if dialed != "" {
		known = dialed
	}
	switch {
	case m.auth != nil && (proved == "" || h.Host != proved):
		return &refusal{host: known, send: true, msg: fmt.Sprintf("HELLO names %.64q but the certificate proves %s", h.Host, proved)}
	case h.Magic != Magic:
		return &refusal{host: known, send: true, msg: fmt.Sprintf("not an ntmon: HELLO magic %q, want %q", h.Magic, Magic)}
	case h.Version != ProtocolVersion:
		return &refusal{host: known, send: true, msg: fmt.Sprintf("peer %s speaks ntmon protocol %d, this host (%s) speaks %d",
			h.Host, h.Version, m.cfg.Host, ProtocolVersion)}
	case h.Host == m.cfg.Host:
		return &refusal{host: known, send: true, msg: fmt.Sprintf("peer calls itself %s, this host's own name", h.Host)}
	case dialed != "" && h.Host != dialed:
		return &refusal{host: known, send: true, msg: fmt.Sprintf("dialed %s at %s but the ntmon there is %s", dialed, m.peers[dialed].cfg.Control, h.Host)}
	case known == "":
		return &refusal{send: true, msg: fmt.Sprintf("host %s is not among %s's peers", h.Host, m.cfg.Host)}
	}
	return nil
}

// hello is this host's HELLO.
func (m *Monitor) hello() Hello {
	h := Hello{
		Magic:     Magic,
		Version:   ProtocolVersion,
		Host:      m.cfg.Host,
		Caps:      m.opts.Caps,
		Addresses: m.cfg.Addresses,
		RDMA:      m.opts.RDMA.Addr,
		RDMAWhy:   m.opts.RDMA.Why,
	}
	for _, p := range m.cfg.Peers {
		if p.Link != "" {
			h.Links = append(h.Links, HelloLink{Name: p.Link, Peer: p.Host, Window: m.cfg.Proxy.Window, Partitions: m.cfg.Proxy.Partitions})
		}
	}
	return h
}

// refused logs a failed handshake, tells the peer why when that helps,
// and records the reason in the peer's status if it has no live session.
func (m *Monitor) refused(s *session, err error) {
	r, ok := err.(*refusal)
	if !ok {
		r = &refusal{msg: err.Error()}
	}
	if r.send {
		reason := ""
		if r.duplicate {
			reason = reasonDuplicate
		}
		s.refuse(ErrorBody{Message: r.msg, Reason: reason})
	}
	if m.ctx.Err() != nil {
		return
	}
	dir := "inbound"
	if s.outbound {
		dir = "outbound"
	}
	if r.duplicate {
		m.log.Info("second session with peer dropped", "peer", s.host, "dir", dir, "remote", s.conn.RemoteAddr().String(), "why", r.msg)
		return
	}
	m.log.Warn("peer session refused", "peer", r.host, "dir", dir, "remote", s.conn.RemoteAddr().String(), "why", r.msg)
	if r.host != "" {
		m.noteDown(r.host, "session refused: "+r.msg)
	}
}

// unauthenticated logs a connection whose TLS handshake failed: it never
// reaches the HELLO exchange, so it cannot touch any session.
func (m *Monitor) unauthenticated(conn net.Conn, dialed string, err error) {
	if m.ctx.Err() != nil {
		return
	}
	if dialed == "" {
		m.log.Warn("peer connection refused: not authenticated", "remote", conn.RemoteAddr().String(), "why", err)
		return
	}
	m.log.Warn("peer session refused: not authenticated", "peer", dialed, "remote", conn.RemoteAddr().String(), "why", err)
	m.noteDown(dialed, "not authenticated: "+err.Error())
}

// preferred reports whether s is the session both ends keep when two
// exist: the one dialed by the lexically smaller host.
func (m *Monitor) preferred(s *session) bool {
	return s.dialer == min(m.cfg.Host, s.host)
}

// register makes s its peer's live session. A second session with the
// same peer replaces the first unless only the first is preferred; the
// replaced session is returned for the caller to close.
func (m *Monitor) register(s *session) (old *session, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, &refusal{host: s.host, send: true, msg: fmt.Sprintf("ntmon on %s is shutting down", m.cfg.Host)}
	}
	p := m.peers[s.host]
	if p.sess != nil {
		if m.preferred(p.sess) && !m.preferred(s) {
			return nil, &refusal{send: true, duplicate: true, msg: fmt.Sprintf("duplicate session: %s and %s already have one, dialed by %s",
				m.cfg.Host, s.host, p.sess.dialer)}
		}
		old = p.sess
	}
	now := time.Now()
	p.sess, p.hello, p.everUp, p.retry = s, s.hello, true, ""
	p.since, p.lastSeen = now, now
	p.why = "session " + s.direction()
	p.linkProblem = m.linkProblem(p.cfg, s.hello)
	close(p.changed)
	p.changed = make(chan struct{})
	m.log.Info("peer up", "peer", s.host, "session", s.direction(), "remote", s.conn.RemoteAddr().String(),
		"caps", strings.Join(s.hello.Caps, ","), "link", p.cfg.Link, "link_problem", p.linkProblem)
	return old, nil
}

// unregister marks s's peer down if s is its live session.
func (m *Monitor) unregister(s *session, why string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.peers[s.host]
	if p == nil || p.sess != s {
		return
	}
	p.sess = nil
	p.since = time.Now()
	p.why = why
	close(p.changed)
	p.changed = make(chan struct{})
	if m.ctx.Err() == nil {
		m.log.Warn("peer down", "peer", s.host, "why", why)
	}
}

// noteDown records why a peer without a live session is still down: the
// reason it went down stays, the latest failure to reconnect is added.
func (m *Monitor) noteDown(host, why string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.peers[host]
	if p == nil || p.sess != nil {
		return
	}
	if p.everUp {
		p.retry = why
	} else {
		p.why = why
	}
	m.log.Debug("peer still down", "peer", host, "why", why)
}

// linkProblem says why the NTB link the config names for p cannot be used
// with the peer that sent h, or "" if it can (or none is configured).
func (m *Monitor) linkProblem(p config.Peer, h Hello) string {
	if p.Link == "" {
		return ""
	}
	if !slices.Contains(h.Caps, "ntb") {
		return fmt.Sprintf("peer %s offers no NTB (caps %s)", p.Host, strings.Join(h.Caps, ","))
	}
	i := slices.IndexFunc(h.Links, func(l HelloLink) bool { return l.Name == p.Link })
	if i < 0 {
		return fmt.Sprintf("peer %s has no link %s configured", p.Host, p.Link)
	}
	l := h.Links[i]
	switch {
	case l.Peer != m.cfg.Host:
		return fmt.Sprintf("link %s: %s's config joins it to %s, not %s", p.Link, p.Host, l.Peer, m.cfg.Host)
	case l.Partitions != m.cfg.Proxy.Partitions:
		return fmt.Sprintf("link %s: %s has %d partitions, %s has %d (both ends must agree)",
			p.Link, p.Host, l.Partitions, m.cfg.Host, m.cfg.Proxy.Partitions)
	case l.Window != m.cfg.Proxy.Window:
		return fmt.Sprintf("link %s: %s has a %d-byte window, %s %d (both ends must agree)",
			p.Link, p.Host, l.Window, m.cfg.Host, m.cfg.Proxy.Window)
	}
	return ""
}

// runSession serves an established session: heartbeats out, frames in,
// until the peer goes silent, leaves or breaks the protocol, or Close.
func (m *Monitor) runSession(s *session) {
	m.wg.Add(1)
	go s.runHeartbeats()
	why := s.read()
	s.close(why)
	m.unregister(s, s.closeWhy)
}

// runHeartbeats sends a HEARTBEAT every monitor.heartbeat until the
// session ends.
func (s *session) runHeartbeats() {
	defer s.m.wg.Done()
	t := time.NewTicker(s.m.heartbeat)
	defer t.Stop()
	var seq uint64
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
		}
		seq++
		if err := s.send(FrameHeartbeat, Heartbeat{Seq: seq}); err != nil {
			s.close(fmt.Sprintf("send heartbeat: %v", unwrapOp(err)))
			return
		}
	}
}

// read receives frames until the session must end, and returns why.
func (s *session) read() string {
	m := s.m
	for {
		_ = s.conn.SetReadDeadline(time.Now().Add(m.peerTimeout))
		f, err := ReadFrame(s.conn)
		if err != nil {
			select {
			case <-s.done:
				return s.closeWhy
			default:
			}
			switch {
			case errors.Is(err, ErrFrame):
				s.refuse(ErrorBody{Message: err.Error()})
				return "protocol error: " + err.Error()
			case errors.Is(err, os.ErrDeadlineExceeded):
				return fmt.Sprintf("silent for %v (peer_timeout)", m.peerTimeout)
			case errors.Is(err, io.EOF):
				return "peer closed the connection"
			}
			return fmt.Sprintf("read: %v", unwrapOp(err))
		}
		switch f.Type {
		case FrameHeartbeat:
			var hb Heartbeat
			if err := DecodeBody(f, &hb); err != nil {
				s.refuse(ErrorBody{Message: err.Error()})
				return "protocol error: " + err.Error()
			}
		case FrameError, FrameBye:
			var body ErrorBody
			if err := DecodeBody(f, &body); err != nil {
				return "protocol error: " + err.Error()
			}
			if f.Type == FrameBye {
				return "peer said goodbye: " + body.Message
			}
			return "peer reported an error: " + body.Message
		default:
			msg := fmt.Sprintf("unexpected %v in an established session", f.Type)
			s.refuse(ErrorBody{Message: msg})
			return "protocol error: " + msg
		}
		m.mu.Lock()
		if p := m.peers[s.host]; p.sess == s {
			p.lastSeen = time.Now()
		}
		m.mu.Unlock()
	}
}
