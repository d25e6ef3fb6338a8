package rdma

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// Connection setup runs over a TCP connection, the bootstrap socket (TLS
// over it with Config.Auth, auth.go): both
// ends send a hello at once and read the other's. The verbs provider
// exchanges what rdma_cm would (queue pair number, PSN, LID, GID, MTU, the
// receive ring's address, rkey and size), moves its queue pair to RTS and
// sends ctlReady; each end waits for the peer's ctlReady before it
// returns the connection, so no write reaches a queue pair that is not yet
// ready to receive. The bootstrap socket then stays open as the verbs
// connection's side channel: Close sends ctlBye on it with the position up
// to which the peer has all data, and its EOF without a ctlBye tells a
// peer that crashed from one that closed. Plain TCP was chosen over
// rdma_cm: one less library and daemon dependency, and the side channel
// is wanted anyway.
//
// Hello, helloSize bytes, little-endian; fields after provider are zero
// for the tcp provider:
//
//	off  size  field
//	  0     4  helloMagic "NTRD"
//	  4     1  helloVersion
//	  5     1  provider: provTCP, provVerbs
//	  6     2  reserved, zero
//	  8     8  ring size (bytes)
//	 16     8  ring address (as the peer's rkey names it)
//	 24     4  ring rkey
//	 28     4  queue pair number (24 bits)
//	 32     4  initial packet sequence number (24 bits)
//	 36     2  LID (InfiniBand; 0 on RoCE)
//	 38     1  path MTU (enum ibv_mtu, 1..5)
//	 39     1  flags: helloGRH, the GID is valid and routes need a GRH
//	 40    16  GID
//	 56     8  reserved, zero
//
// Control message, ctlSize bytes:
//
//	off  size  field
//	  0     4  ctlMagic "NTCT"
//	  4     1  type: ctlReady, ctlBye
//	  5     1  flags: ctlReset (bye: not every written byte was delivered)
//	  6     2  reserved, zero
//	  8     8  bye: the sender's final position, all data up to it delivered
const (
	helloSize    = 64
	helloMagic   = 0x4452544e // "NTRD"
	helloVersion = 1
	helloGRH     = 1

	provTCP   = 1
	provVerbs = 2

	ctlSize  = 16
	ctlMagic = 0x5443544e // "NTCT"
	ctlReady = 1
	ctlBye   = 2
	ctlReset = 1

	// maxPSN: packet sequence numbers are 24 bits.
	maxPSN = 1<<24 - 1
)

// hello is one side's half of the handshake.
type hello struct {
	provider byte
	ringSize uint64
	ringAddr uint64
	rkey     uint32
	qpn      uint32
	psn      uint32
	lid      uint16
	mtu      byte
	grh      bool
	gid      [16]byte
}

func (h *hello) marshal() []byte {
	b := make([]byte, helloSize)
	binary.LittleEndian.PutUint32(b[0:], helloMagic)
	b[4] = helloVersion
	b[5] = h.provider
	binary.LittleEndian.PutUint64(b[8:], h.ringSize)
	binary.LittleEndian.PutUint64(b[16:], h.ringAddr)
	binary.LittleEndian.PutUint32(b[24:], h.rkey)
	binary.LittleEndian.PutUint32(b[28:], h.qpn)
	binary.LittleEndian.PutUint32(b[32:], h.psn)
	binary.LittleEndian.PutUint16(b[36:], h.lid)
	b[38] = h.mtu
	if h.grh {
		b[39] = helloGRH
	}
	copy(b[40:56], h.gid[:])
	return b
}

// parseHello decodes and validates the peer's hello for provider want.
func parseHello(b []byte, want byte) (hello, error) {
	if len(b) != helloSize || binary.LittleEndian.Uint32(b[0:]) != helloMagic {
		return hello{}, fmt.Errorf("hello: not an ntstack rdma peer: %w", ErrProviderMismatch)
	}
	if b[6] != 0 || b[7] != 0 || b[39]&^helloGRH != 0 || binary.LittleEndian.Uint64(b[56:]) != 0 {
		return hello{}, fmt.Errorf("hello: reserved bits set: %w", ErrProviderMismatch)
	}
	if b[4] != helloVersion {
		return hello{}, fmt.Errorf("hello: version %d, want %d: %w", b[4], helloVersion, ErrProviderMismatch)
	}
	h := hello{
		provider: b[5],
		ringSize: binary.LittleEndian.Uint64(b[8:]),
		ringAddr: binary.LittleEndian.Uint64(b[16:]),
		rkey:     binary.LittleEndian.Uint32(b[24:]),
		qpn:      binary.LittleEndian.Uint32(b[28:]),
		psn:      binary.LittleEndian.Uint32(b[32:]),
		lid:      binary.LittleEndian.Uint16(b[36:]),
		mtu:      b[38],
		grh:      b[39]&helloGRH != 0,
	}
	copy(h.gid[:], b[40:56])
	if h.provider != want {
		return hello{}, fmt.Errorf("hello: peer runs provider %d, want %d: %w", h.provider, want, ErrProviderMismatch)
	}
	if want != provVerbs {
		return h, nil
	}
	if err := checkRingSize(h.ringSize); err != nil {
		return hello{}, fmt.Errorf("hello: %w: %w", err, errProtocol)
	}
	if h.qpn > maxPSN || h.psn > maxPSN || h.mtu < 1 || h.mtu > 5 || h.ringAddr+h.ringSize < h.ringAddr {
		return hello{}, fmt.Errorf("hello: qpn %#x psn %#x mtu %d ring %#x+%d out of range: %w", h.qpn, h.psn, h.mtu, h.ringAddr, h.ringSize, errProtocol)
	}
	return h, nil
}

// ctlMsg is a control message on the verbs side channel.
type ctlMsg struct {
	typ   byte
	reset bool
	final uint64
}

func (m ctlMsg) marshal() []byte {
	b := make([]byte, ctlSize)
	binary.LittleEndian.PutUint32(b[0:], ctlMagic)
	b[4] = m.typ
	if m.reset {
		b[5] = ctlReset
	}
	binary.LittleEndian.PutUint64(b[8:], m.final)
	return b
}

func parseCtl(b []byte) (ctlMsg, error) {
	if len(b) != ctlSize || binary.LittleEndian.Uint32(b[0:]) != ctlMagic || b[6] != 0 || b[7] != 0 {
		return ctlMsg{}, fmt.Errorf("control message % x: %w", b, errProtocol)
	}
	m := ctlMsg{typ: b[4], reset: b[5]&ctlReset != 0, final: binary.LittleEndian.Uint64(b[8:])}
	if m.typ != ctlReady && m.typ != ctlBye {
		return ctlMsg{}, fmt.Errorf("control message type %d: %w", m.typ, errProtocol)
	}
	return m, nil
}

// exchangeHello sends ours and reads the peer's on c; ctx bounds both.
func exchangeHello(ctx context.Context, c net.Conn, ours hello) (hello, error) {
	var peer []byte
	err := withDeadline(ctx, c, func() error {
		errc := make(chan error, 1)
		go func() { _, err := c.Write(ours.marshal()); errc <- err }()
		peer = make([]byte, helloSize)
		_, rerr := io.ReadFull(c, peer)
		if werr := <-errc; werr != nil {
			return fmt.Errorf("send hello: %w", werr)
		}
		if rerr != nil {
			return fmt.Errorf("read hello: %w", rerr)
		}
		return nil
	})
	if err != nil {
		return hello{}, err
	}
	return parseHello(peer, ours.provider)
}

// withDeadline runs f with c's deadline set from ctx, and cut short when
// ctx is cancelled; the deadline is cleared afterwards.
func withDeadline(ctx context.Context, c net.Conn, f func() error) error {
	if d, ok := ctx.Deadline(); ok {
		if err := c.SetDeadline(d); err != nil {
			return err
		}
	}
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Unix(1, 0)) })
	err := f()
	if !stop() {
		return fmt.Errorf("%w (%w)", context.Cause(ctx), err)
	}
	if err != nil {
		return err
	}
	return c.SetDeadline(time.Time{})
}
