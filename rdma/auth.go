package rdma

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
)

// Authenticator secures a connection's bootstrap socket before the hello:
// TLS 1.3 authenticated both ways with the hosts' keys
// (internal/wire/hostauth's Auth is one). Client runs on the dialing side
// and must prove the far end is peer; Server runs on the listening side
// and returns the peer host the dialer proved. Both are bounded by the
// socket's deadline.
//
// What the bootstrap authenticates is the connection's setup: who may
// connect and where the connection's queue pair and ring are. The verbs
// data path itself (RDMA writes into the peer's ring) is neither
// authenticated nor encrypted beyond what the RDMA fabric provides; the
// TCP provider's whole stream runs inside the TLS session, encrypted.
type Authenticator interface {
	Client(c net.Conn, peer string) (*tls.Conn, error)
	Server(c net.Conn) (*tls.Conn, string, error)
}

// bootConn is a bootstrap socket: TCP, or TLS over it.
type bootConn interface {
	net.Conn
	CloseWrite() error
}

var (
	_ bootConn = (*net.TCPConn)(nil)
	_ bootConn = (*tls.Conn)(nil)
)

var errNeedHost = errors.New("the bootstrap is authenticated (Config.Auth): dial with DialHost and the peer's host")

// secureDial runs the client side of cfg.Auth on c, expecting host; with
// no Auth it returns c as it is.
func (cfg Config) secureDial(ctx context.Context, c net.Conn, host string) (bootConn, error) {
	if cfg.Auth == nil {
		return c.(*net.TCPConn), nil
	}
	if host == "" {
		return nil, errNeedHost
	}
	var tc *tls.Conn
	err := withDeadline(ctx, c, func() error {
		var err error
		tc, err = cfg.Auth.Client(c, host)
		return err
	})
	if err != nil {
		return nil, err
	}
	return tc, nil
}

// secureAccept runs the server side of cfg.Auth on c and returns the
// socket to run the hello on and the peer it proved ("": no Auth).
func (cfg Config) secureAccept(ctx context.Context, c net.Conn) (bootConn, string, error) {
	if cfg.Auth == nil {
		return c.(*net.TCPConn), "", nil
	}
	var tc *tls.Conn
	var peer string
	err := withDeadline(ctx, c, func() error {
		var err error
		tc, peer, err = cfg.Auth.Server(c)
		return err
	})
	if err != nil {
		return nil, "", err
	}
	return tc, peer, nil
}
