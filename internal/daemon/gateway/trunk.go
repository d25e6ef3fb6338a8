package gateway

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/prim/accept"
	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/appproto"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/socklike"
)

// Trunks. In trunk mode (the default) the gateways of two hosts share one
// link — a transport endpoint of their own, beside the proxies' rack link
// — and every connection a forward carries to the other host is a
// connection on it:
//
//	host a gateway                                    host b gateway
//	  control: socklike conn to b:1023 ─────────────▶ trunk listener
//	    trunkOpen{link, window} ──────────────────────▶ attach side 1,
//	                                                  listen on each export
//	    ◀──────────────────────────── trunkReply{ports}  port the ACL allows
//	  attach side 0
//	  per carried conn:
//	    announcement: port, 2 bytes big-endian ───────▶ one Accept on port
//	    OPEN port on the trunk ──────────────────────▶ accepted, dial target
//
// Setting up a carried connection is then an OPEN on a live link (no link
// file, no lease, no quota grant), and the link's poller, doorbell and
// heartbeat serve all of them: a record that arrives for any carried
// connection is taken off the ring by whoever polls, and one doorbell
// wakes the gateway for a burst of them.
//
// The control connection (config.GatewayTrunkPort) is the trunk's lease:
// when it ends (either gateway stopped, the ntproxys lost each other),
// both ends close the trunk and its carried connections with it; the next
// forwarded connection opens a new trunk. It also carries the
// announcements: the far end accepts one connection per announcement
// rather than keeping an Accept pending (see serveTrunk). A trunk that cannot be opened (the far
// gateway has no exports, an old gateway, no NTB path) leaves the forward
// to dial a direct link per connection, as in direct mode, and is tried
// again after trunkRetry.
//
// Access control is the proxies' rules applied by the gateways: the
// control connection passes ntmon like any dial, and each carried
// connection is checked against the same rules the proxies apply to a
// dial of its port (out at this end, in at the far end).

// trunkPrefix starts every trunk link's name: trunkPrefix + opener + "-"
// + random hex.
const trunkPrefix = "gwtrunk-"

// Bounds of the window a peer may ask a trunk to map (per side), and the
// window this end asks for: twice a direct link's, since every carried
// connection shares it.
const (
	minTrunkWindow = 256 << 10
	maxTrunkWindow = 64 << 20
)

// trunkSpinConns is the most connections a trunk carries while its calls
// spin (transport.Config.SpinConns). A lone client's round trips gain
// from the spin (one Redis client: p50 71-87 µs against 255-279 µs with
// no spinning); with fifty connections the spinner copies everybody's
// records, and not spinning served 1.3-1.9x the relays' Redis requests
// a second against 0.9-1.3x, and a small request beside bulk in half
// the time (docs/perf-log.md, 2026-12-03 14:41).
const trunkSpinConns = 4

// trunkRetry is how long a forward to a host whose trunk could not be
// opened dials per-connection links before it tries a trunk again.
const trunkRetry = 5 * time.Second

// trunkOpen is the opener's request on the control connection.
type trunkOpen struct {
	Link   string `json:"link"`
	Window int    `json:"window"`
}

// trunkReply answers a trunkOpen: the ports the trunk carries, or why not.
type trunkReply struct {
	Ports []int  `json:"ports,omitempty"`
	Error string `json:"error,omitempty"`
}

// trunk is this end's share of one trunk: at the opener, a forward's
// link to one host.
type trunk struct {
	host  string
	ready chan struct{} // closed once set up or failed
	// Set before ready closes, then read only:
	err    error
	failed time.Time
	ports  []int
	ep     *transport.Endpoint
	link   string     // the link's name in the fabric directory
	remove sync.Once  // the link file goes once a connection shows both ends hold it
	callMu sync.Mutex // serialises announcements on the control connection

	mu sync.Mutex
	// mu protects the following fields.
	ctl   net.Conn
	ended bool
	done  chan struct{} // closed when it ends (nil until the first look)
}

// doneCh returns a channel closed when the trunk ends.
func (t *trunk) doneCh() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done == nil {
		t.done = make(chan struct{})
		if t.ended {
			close(t.done)
		}
	}
	return t.done
}

// closed reports whether ch is closed.
func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// hold makes ctl and ep the trunk's, to close when it ends; it reports
// false, closing them, if it has ended already.
func (t *trunk) hold(ctl net.Conn, ep *transport.Endpoint) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		ctl.Close()
		if ep != nil {
			ep.Close()
		}
		return false
	}
	t.ctl = ctl
	if ep != nil {
		t.ep = ep
	}
	return true
}

func (t *trunk) alive() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return !t.ended
}

// end closes the trunk: its control connection, endpoint and every
// connection on it.
func (t *trunk) end() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		return
	}
	t.ended = true
	if t.done != nil {
		close(t.done)
	}
	if t.ctl != nil {
		t.ctl.Close()
	}
	if t.ep != nil {
		t.ep.Close()
	}
}

// trunkTo returns a live trunk to host, opening one if there is none.
// Concurrent callers share one opening.
func (g *Gateway) trunkTo(ctx context.Context, host string) (*trunk, error) {
	g.mu.Lock()
	if g.closing {
		g.mu.Unlock()
		return nil, net.ErrClosed
	}
	t := g.trunks[host]
	if t != nil && closed(t.ready) && (t.err == nil && !t.alive() || t.err != nil && time.Since(t.failed) >= trunkRetry) {
		t = nil // ended, or failed long enough ago to try again
	}
	if t == nil {
		t = &trunk{host: host, ready: make(chan struct{})}
		g.trunks[host] = t
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.openTrunk(t)
		}()
	}
	g.mu.Unlock()
	select {
	case <-t.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if t.err != nil {
		return nil, t.err
	}
	return t, nil
}

// openTrunk sets t up and holds it until its control connection ends.
func (g *Gateway) openTrunk(t *trunk) {
	ctx, cancel := context.WithTimeout(g.ctx, dialTimeout)
	err := g.setupTrunk(ctx, t)
	cancel()
	if err != nil {
		t.err, t.failed = fmt.Errorf("trunk to %s: %w", t.host, err), time.Now()
		t.end()
		close(t.ready)
		g.logf("gateway: %v; forwards to %s dial a link per connection", t.err, t.host)
		return
	}
	close(t.ready)
	g.logf("gateway: trunk %s to %s carries ports %v", t.link, t.host, t.ports)
	t.mu.Lock()
	ctl := t.ctl
	t.mu.Unlock()
	var b [1]byte
	ctl.Read(b[:]) // the far end writes nothing: this ends with the lease
	t.end()
	g.logf("gateway: trunk to %s ended", t.host)
}

func (g *Gateway) setupTrunk(ctx context.Context, t *trunk) (err error) {
	d := socklike.Dialer{Proxy: g.proxy}
	ctl, err := d.DialContext(ctx, "ntb", net.JoinHostPort(t.host, strconv.Itoa(config.GatewayTrunkPort)))
	if err != nil {
		return err
	}
	if !t.hold(ctl, nil) {
		return net.ErrClosed
	}
	if r, ok := ctl.(interface{ Route() socklike.Route }); ok && r.Route().Path != ctlapi.PathNTB {
		return fmt.Errorf("%s is reached over %s, not an NTB link", t.host, r.Route().Path)
	}
	var nonce [8]byte
	rand.Read(nonce[:])
	open := trunkOpen{Link: trunkPrefix + g.cfg.Host + "-" + hex.EncodeToString(nonce[:]), Window: trunkWindow(g.cfg)}
	defer func() {
		if err != nil {
			shm.Remove(g.cfg.Proxy.FabricDir, open.Link)
		}
	}()
	if dl, ok := ctx.Deadline(); ok {
		ctl.SetDeadline(dl)
	}
	// The far end attaches first, so that it serves the link's memory, as
	// the accepting end of a direct link does.
	var reply trunkReply
	if err = appproto.WriteFrame(ctl, open); err == nil {
		err = appproto.ReadFrame(ctl, &reply)
	}
	if err != nil {
		return err
	}
	if reply.Error != "" {
		return errors.New(reply.Error)
	}
	ctl.SetDeadline(time.Time{})
	ep, err := g.openTrunkLink(open, shm.Side0)
	if err != nil {
		return err
	}
	if !t.hold(ctl, ep) {
		return net.ErrClosed
	}
	t.ports, t.link = reply.Ports, open.Link
	return nil
}

// trunkWindow is the window this end asks a trunk for.
func trunkWindow(cfg *config.Config) int {
	return min(max(2*cfg.Proxy.DirectWindow, minTrunkWindow), maxTrunkWindow)
}

// openTrunkLink attaches side of the trunk link open names. Every carried
// connection is on the trunk's one partition, so the engine's
// SharedWindow (its default) is what keeps a small message from waiting
// behind the other connections' bulk records: while a connection carries
// small messages both ways (a Redis client's), the bulk connections'
// windows shrink. An HTTP client's small requests do not count, their
// answers being bulk (the engine's noteData), so HTTP alone keeps the full
// windows. Calls spin only while the trunk carries a few connections
// (trunkSpinConns).
func (g *Gateway) openTrunkLink(open trunkOpen, side shm.Side) (*transport.Endpoint, error) {
	ep, err := transport.Open(open.Link, transport.Config{SpinBudget: g.cfg.Proxy.SpinBudget.Duration, SpinConns: trunkSpinConns, Sockets: true,
		Fabric: shm.Options{Dir: g.cfg.Proxy.FabricDir, WindowSize: open.Window, Side: side, HeartbeatTimeout: appproto.LinkHeartbeatTimeout}})
	if err != nil {
		return nil, fmt.Errorf("trunk link %s: %w", open.Link, err)
	}
	return ep, nil
}

// dialTrunk opens a connection to svc's rack address on the trunk to its
// host. ok is false when the trunk cannot carry it (none, or not its
// port); the caller then dials as in direct mode.
func (g *Gateway) dialTrunk(ctx context.Context, svc *service) (c net.Conn, ok bool) {
	hostPart, ps, _ := net.SplitHostPort(svc.stat.To)
	host, known := g.cfg.HostOf(hostPart)
	port, _ := strconv.Atoi(ps)
	if !known {
		return nil, false
	}
	if allowed, _ := g.cfg.Allowed("out", os.Getuid(), host, port); !allowed {
		return nil, false // the proxies refuse it with the rule's name
	}
	t, err := g.trunkTo(ctx, host)
	if err != nil || !slices.Contains(t.ports, port) {
		return nil, false
	}
	if err := t.announce(port); err != nil {
		t.end()
		return nil, false
	}
	// A trunk that ends under the dial (the far gateway dropped it) ends
	// the dial too: the connection then goes as in direct mode.
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ended := t.doneCh()
	go func() {
		select {
		case <-ended:
			cancel()
		case <-dctx.Done():
		}
	}()
	fc, err := t.ep.DialContext(dctx, port)
	if err != nil {
		// The trunk is going (the far gateway stopped listening with it).
		return nil, false
	}
	t.remove.Do(func() { shm.Remove(g.cfg.Proxy.FabricDir, t.link) })
	svc.trunked.Add(1)
	return fc, true
}

// announce tells the far end, on the control connection, that a
// connection to port follows, so that it accepts one there (see
// serveTrunk).
func (t *trunk) announce(port int) error {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], uint16(port))
	t.callMu.Lock()
	defer t.callMu.Unlock()
	t.mu.Lock()
	ctl := t.ctl
	t.mu.Unlock()
	_, err := ctl.Write(b[:])
	return err
}

// serveTrunks accepts trunks on ln (the trunk port) until it closes.
// Accept errors are retried with backoff, as serve's.
func (g *Gateway) serveTrunks(ctx context.Context, ln net.Listener) error {
	retry := accept.Retry{What: "gateway trunk port", Logf: g.logf}
	for {
		c, ok := accept.Next(&retry, ctx.Done(), ln.Accept)
		if !ok {
			return nil
		}
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			g.serveTrunk(ctx, c)
		}()
	}
}

// serveTrunk is the far end of a trunk opened on ctl: it attaches the
// link, listens on it for the exports the opener may reach and carries
// what they accept, until ctl ends.
func (g *Gateway) serveTrunk(ctx context.Context, ctl net.Conn) {
	from, _, _ := net.SplitHostPort(ctl.RemoteAddr().String())
	t := &trunk{host: from, ctl: ctl, ready: make(chan struct{})}
	defer t.end()
	defer context.AfterFunc(ctx, t.end)() // Run is ending: so is the trunk, set up or not
	ctl.SetDeadline(time.Now().Add(dialTimeout))
	var open trunkOpen
	if err := appproto.ReadFrame(ctl, &open); err != nil {
		return
	}
	refuse := func(err error) {
		appproto.WriteFrame(ctl, trunkReply{Error: err.Error()})
		g.logf("gateway: trunk from %s refused: %v", from, err)
	}
	if _, ok := g.cfg.Peer(from); !ok {
		refuse(fmt.Errorf("%q is not a rack peer", from))
		return
	}
	rest, ok := strings.CutPrefix(open.Link, trunkPrefix+from+"-")
	if !ok || rest == "" || strings.ContainsAny(rest, "/\x00") || len(open.Link) > 96 {
		refuse(fmt.Errorf("trunk link name %q is not one %s may open", open.Link, from))
		return
	}
	if open.Window < minTrunkWindow || open.Window > maxTrunkWindow || open.Window%4096 != 0 {
		refuse(fmt.Errorf("trunk window %d outside [%d, %d] or not a multiple of 4096", open.Window, minTrunkWindow, maxTrunkWindow))
		return
	}
	ep, err := g.openTrunkLink(open, shm.Side1)
	if err != nil {
		refuse(err)
		return
	}
	t.link = open.Link // before the trunk is listed in g.served, then read only
	t.hold(ctl, ep)
	// One trunk per peer: a new one from the same host replaces the old,
	// whose opener is gone or gave it up.
	g.mu.Lock()
	old := g.served[from]
	g.served[from] = t
	closing := g.closing
	g.mu.Unlock()
	if old != nil {
		old.end()
	}
	if closing {
		return
	}
	defer func() {
		g.mu.Lock()
		if g.served[from] == t {
			delete(g.served, from)
		}
		g.mu.Unlock()
	}()
	var ports []int
	lns, svcs := map[int]*transport.Listener{}, map[int]*service{}
	for _, svc := range g.services {
		if svc.stat.Kind != "export" {
			continue
		}
		port := svc.port
		if allowed, _ := g.cfg.Allowed("in", -1, from, port); !allowed {
			continue
		}
		ln, err := ep.Listen(port)
		if err != nil {
			refuse(err)
			return
		}
		ports = append(ports, port)
		lns[port], svcs[port] = ln, svc
	}
	ctl.SetDeadline(time.Time{})
	if err := appproto.WriteFrame(ctl, trunkReply{Ports: ports}); err != nil {
		return
	}
	t.ports = ports
	close(t.ready)
	g.logf("gateway: trunk %s from %s carries ports %v", open.Link, from, ports)
	// One Accept per announcement rather than one always pending: a
	// pending Accept has the trunk's poller watch the rings whenever no
	// call runs, which costs each record of a lone request/response
	// connection a hand-off to the poller. An announcement whose
	// connection never comes leaves its Accept to take the next one to
	// that port. The control connection's end is the trunk's.
	var b [2]byte
	for {
		if _, err := io.ReadFull(ctl, b[:]); err != nil {
			return
		}
		port := int(binary.BigEndian.Uint16(b[:]))
		ln, svc := lns[port], svcs[port]
		if ln == nil {
			g.logf("gateway: trunk from %s: announcement for port %d, which it does not carry", from, port)
			return
		}
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			c, err := ln.AcceptConn()
			if err != nil {
				return
			}
			g.carry(ctx, svc, c, func() {})
		}()
	}
}

// TrunkStats returns the state of each trunk this gateway opened or
// serves.
func (g *Gateway) TrunkStats() []ctlapi.TrunkStat {
	g.mu.Lock()
	var out []ctlapi.TrunkStat
	for role, m := range map[string]map[string]*trunk{"opened": g.trunks, "served": g.served} {
		for _, t := range m {
			out = append(out, t.stat(role))
		}
	}
	g.mu.Unlock()
	slices.SortFunc(out, func(a, b ctlapi.TrunkStat) int {
		return cmp.Or(strings.Compare(a.Peer, b.Peer), strings.Compare(a.Role, b.Role))
	})
	return out
}

// stat is t's state for TrunkStats.
func (t *trunk) stat(role string) ctlapi.TrunkStat {
	st := ctlapi.TrunkStat{Peer: t.host, Role: role, State: "setting up"}
	if !closed(t.ready) {
		return st
	}
	st.Link, st.Ports = t.link, t.ports
	t.mu.Lock()
	ended, ep := t.ended, t.ep
	t.mu.Unlock()
	switch {
	case t.err != nil:
		st.State, st.Error = "failed", t.err.Error()
	case ended:
		st.State = "ended"
	case ep.Device().Link() != ntb.LinkUp:
		st.State, st.Conns = "down", ep.Conns()
	default:
		st.State, st.Conns = "up", ep.Conns()
	}
	return st
}
