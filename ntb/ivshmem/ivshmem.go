package ivshmem

import (
	"errors"
	"fmt"
)

// Protocol constants (QEMU docs/specs/ivshmem-spec.rst).
const (
	protocolVersion = 0
	shmMarker       = -1
	msgSize         = 8 // every message is one little-endian int64

	// MaxPeers is the number of peer ids, 0..65535: the Doorbell register
	// carries the destination id in its upper 16 bits.
	MaxPeers = 1 << 16

	// MaxVectors bounds the vectors per peer. Each connected peer costs
	// the server Vectors eventfds and every client Vectors fds per peer;
	// QEMU's ivshmem-doorbell device exposes one MSI-X vector per doorbell
	// vector and this is far above anything the tests use.
	MaxVectors = 1024
)

// ErrProtocol is matched (errors.Is) by every error caused by a server
// message that breaks the protocol.
var ErrProtocol = errors.New("ivshmem protocol violation")

// ErrNoPeer is returned by Ring for a peer id that is not connected.
var ErrNoPeer = errors.New("no such peer")

func protoErr(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrProtocol}, args...)...)
}

// ServerConfig configures a Server.
type ServerConfig struct {
	SocketPath string // Unix socket to listen on; must not exist yet
	ShmPath    string // file created (or truncated) to Size; empty: a memfd
	Size       int64  // size of the shared memory in bytes, > 0
	Vectors    int    // doorbell vectors per peer; 0 means 1
}

// PeerEvent reports that a peer connected (Up, all its vectors received)
// or disconnected (its eventfds are already closed).
type PeerEvent struct {
	ID int
	Up bool
}
