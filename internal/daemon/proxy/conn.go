package proxy

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"

	"github.com/ntstack/ntstack/internal/transport"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// spliceBuf is the copy buffer of one direction: one MTU record of
// socklike, so a bulk stream moves a record per call.
const spliceBuf = transport.DefaultMTU

// pconn is one proxied connection: an application's connection on its
// memory link, joined to the far side (another application's memory
// link, or a rack link).
type pconn struct {
	id        uint64
	app       uint64 // the application that dialed or accepted it
	peerApp   *app   // the accepting application of a same-host connection
	dir       string
	path      string // the transport it opened on (a leg's current one: leg.path)
	reason    string
	link      string
	partition int
	local     string
	remote    string
	direct    bool         // direct mode: the proxy holds only the lease
	dlName    string       // direct mode: the direct link's name
	cont      string       // a proxied connection carrying on direct link cont's (directfall.go)
	leg       *leg         // the part between this proxy and a peer's, if any
	slot      *poolUse     // shared-pool mode: its slot of the application's pool
	peerLim   legLimits    // what the peer leg said of its window and frames
	hops      []ctlapi.Hop // the transports its leg may move between (dialer side)
	secret    []byte       // its leg's resume secret (legSecretLen bytes)

	bytesTX, bytesRX atomic.Uint64 // from / to the application
	msgsTX, msgsRX   atomic.Uint64
	inFlight         [2]atomic.Int64 // bytes read but not yet written, per direction

	done      atomic.Int32 // directions finished
	closeOnce sync.Once
	ends      [2]net.Conn
}

// mode names pc's data-path mode.
func (pc *pconn) mode() string {
	switch {
	case pc.direct:
		return "direct"
	case pc.slot != nil:
		return "pool"
	}
	return "proxy"
}

// leggy reports whether pc crosses to a peer proxy, over a leg.
func (pc *pconn) leggy() bool {
	return pc.path == ctlapi.PathNTB || pc.path == ctlapi.PathRDMA || pc.path == ctlapi.PathTCP
}

func (pc *pconn) close() {
	if pc.leg != nil {
		pc.leg.close(nil)
		return
	}
	pc.closeOnce.Do(func() {
		for _, c := range pc.ends {
			if c != nil {
				c.Close()
			}
		}
	})
}

// splice registers pc and copies both ways between the application's end
// and the far end until both directions finish, then closes both.
func (s *Server) splice(a *app, pc *pconn, appEnd, farEnd net.Conn) {
	pc.app = a.id
	pc.ends = [2]net.Conn{appEnd, farEnd}
	s.mu.Lock()
	if s.closed || a.gone || (pc.peerApp != nil && pc.peerApp.gone) {
		s.mu.Unlock()
		pc.close()
		return
	}
	s.conns[pc.id] = pc
	a.conns[pc.id] = pc
	if pc.peerApp != nil {
		pc.peerApp.conns[pc.id] = pc
	}
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		s.copy(pc, farEnd, appEnd, &pc.bytesRX, &pc.msgsRX, &pc.inFlight[1])
	}()
	s.copy(pc, appEnd, farEnd, &pc.bytesTX, &pc.msgsTX, &pc.inFlight[0])
	// The reverse direction ends by itself (EOF or the close below).
}

// copy moves bytes from src to dst until EOF (passed on as a half close)
// or an error (which closes the whole connection).
func (s *Server) copy(pc *pconn, src, dst net.Conn, bytes, msgs *atomic.Uint64, inFlight *atomic.Int64) {
	buf := make([]byte, spliceBuf)
	var err error
	for {
		var n int
		n, err = src.Read(buf)
		if n > 0 {
			inFlight.Store(int64(n))
			_, werr := dst.Write(buf[:n])
			inFlight.Store(0)
			bytes.Add(uint64(n))
			msgs.Add(1)
			if werr != nil {
				err = werr
				break
			}
		}
		if err != nil {
			break
		}
	}
	if errors.Is(err, io.EOF) {
		cw, ok := dst.(interface{ CloseWrite() error })
		if !ok || cw.CloseWrite() != nil {
			pc.close()
		}
	} else {
		pc.close()
	}
	if pc.done.Add(1) == 2 {
		pc.close()
		s.forget(pc)
	}
}

// forget removes pc from the tables.
func (s *Server) forget(pc *pconn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.conns, pc.id)
	if a := s.apps[pc.app]; a != nil {
		delete(a.conns, pc.id)
	}
	if pc.peerApp != nil {
		delete(pc.peerApp.conns, pc.id)
	}
}
