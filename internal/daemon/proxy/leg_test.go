package proxy

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
)

// TestLegRepeatsAckOnNewTransport: an acknowledgement written on a
// transport that then failed may never have been read; the leg sends it
// again first thing on the next transport, or a peer whose unacked ring is
// full would wait for it forever.
func TestLegRepeatsAckOnNewTransport(t *testing.T) {
	s := &Server{logf: t.Logf, legs: map[legKey]*leg{}, conns: map[uint64]*pconn{}, apps: map[uint64]*app{}}
	appEnd, appPeer := net.Pipe()
	defer appPeer.Close()
	old, oldPeer := net.Pipe()
	defer oldPeer.Close()
	l := s.newLeg(&pconn{id: 1}, appEnd, config.Peer{Host: "b"}, legKey{"b", 1}, false, old, "ntb", 0)
	const acked = 5 << 20
	l.mu.Lock()
	l.ackWanted, l.ackSent = acked, acked // written on old, then old failed
	l.mu.Unlock()
	done := make(chan struct{})
	go func() { defer close(done); l.runSend() }()
	defer func() { l.close(nil); <-done }()

	ours, theirs := net.Pipe()
	defer theirs.Close()
	go io.Copy(io.Discard, oldPeer)
	require.NoError(t, l.install(ours, "tcp", 0))
	theirs.SetReadDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, legHdr)
	_, err := io.ReadFull(theirs, hdr)
	require.NoError(t, err, "no frame on the new transport")
	require.Equal(t, legAck, hdr[0])
	require.Equal(t, uint64(acked), binary.LittleEndian.Uint64(hdr[1:]))
	go io.Copy(io.Discard, theirs) // the reset at close
}
