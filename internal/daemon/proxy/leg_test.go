package proxy

import (
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/capture"
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
	l := s.newLeg(&pconn{id: 1}, appEnd, config.Peer{Host: "b"}, legKey{"b", 1}, false, old, "ntb", legLimits{})
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

// TestLegResendsResetOnNewTransport: the reset that ends an application's
// short stream, written on a transport that then failed, may never have
// been read. After the resume the leg sends again what the peer lacks,
// then the reset; it keeps the transport open for the peer's frames, and
// ends (closing the application's end) once the peer ends the transport.
func TestLegResendsResetOnNewTransport(t *testing.T) {
	s := &Server{logf: t.Logf, legs: map[legKey]*leg{}, conns: map[uint64]*pconn{}, apps: map[uint64]*app{}}
	appEnd, appPeer := net.Pipe()
	defer appPeer.Close()
	old, oldPeer := net.Pipe()
	defer oldPeer.Close()
	go io.Copy(io.Discard, oldPeer)
	l := s.newLeg(&pconn{id: 1}, appEnd, config.Peer{Host: "b"}, legKey{"b", 1}, false, old, "ntb", legLimits{})
	l.mu.Lock()
	l.tx.commit(copy(l.tx.free(5, 5), "hello"))
	// All of it and the reset written on old, then old failed.
	l.sent, l.finQueued, l.resetQueued, l.finSent, l.resetSent = 5, true, true, true, true
	l.mu.Unlock()
	done := make(chan struct{})
	go func() { defer close(done); l.runSend() }()
	defer func() { l.close(nil); <-done }()

	ours, theirs := net.Pipe()
	defer theirs.Close()
	require.NoError(t, l.install(ours, "tcp", 0))
	theirs.SetDeadline(time.Now().Add(5 * time.Second)) // a failure guard only
	frame := make([]byte, legHdr+5)
	_, err := io.ReadFull(theirs, frame)
	require.NoError(t, err, "no data frame on the new transport")
	require.Equal(t, legData, frame[0])
	require.Equal(t, uint64(0), binary.LittleEndian.Uint64(frame[1:]))
	require.Equal(t, "hello", string(frame[legHdr:]))
	_, err = io.ReadFull(theirs, frame[:legHdr])
	require.NoError(t, err, "no reset after the data")
	require.Equal(t, legReset, frame[0])

	_, err = theirs.Write(putLegHdr(frame, legData, 0, 2)[:legHdr])
	require.NoError(t, err)
	_, err = theirs.Write([]byte("hi"))
	require.NoError(t, err, "the transport stays open for the peer's frames")
	require.NoError(t, theirs.Close())
	appPeer.SetReadDeadline(time.Now().Add(5 * time.Second)) // a failure guard only
	_, err = appPeer.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the leg ends once the peer ends the transport")
}

// TestLegFrameSize: a leg sends data frames as large as its peer said it
// takes (legLimits.frame), and legOldPayload to a peer that did not say.
func TestLegFrameSize(t *testing.T) {
	require.Equal(t, capture.LegMaxPayload, legMaxPayload, "the capture format reads the frames legs send")
	for _, tc := range []struct {
		name string
		lim  legLimits
		want int
	}{
		{"peer says nothing", legLimits{}, legOldPayload},
		{"peer takes legMaxPayload", legLimits{frame: legMaxPayload}, legMaxPayload},
		{"peer takes more", legLimits{frame: 4 * legMaxPayload}, legMaxPayload},
		{"peer takes less", legLimits{frame: 16 << 10}, 16 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Server{logf: t.Logf, legs: map[legKey]*leg{}, conns: map[uint64]*pconn{}, apps: map[uint64]*app{}}
			appEnd, appPeer := net.Pipe()
			defer appPeer.Close()
			c, peer := net.Pipe()
			defer peer.Close()
			l := s.newLeg(&pconn{id: 1}, appEnd, config.Peer{Host: "b"}, legKey{"b", 1}, false, c, "ntb", tc.lim)
			data := make([]byte, 2*legMaxPayload)
			for i := range data {
				data[i] = byte(i * 7)
			}
			l.mu.Lock()
			require.True(t, l.tx.put(data))
			l.mu.Unlock()
			done := make(chan struct{})
			go func() { defer close(done); l.runSend() }()
			defer func() { l.close(nil); <-done }()

			peer.SetReadDeadline(time.Now().Add(5 * time.Second))
			var got []byte
			for len(got) < len(data) {
				hdr := make([]byte, legHdr)
				_, err := io.ReadFull(peer, hdr)
				require.NoError(t, err)
				require.Equal(t, legData, hdr[0])
				require.Equal(t, uint64(len(got)), binary.LittleEndian.Uint64(hdr[1:]))
				n := int(binary.LittleEndian.Uint32(hdr[9:]))
				require.Equal(t, min(tc.want, len(data)-len(got)), n, "frame at %d", len(got))
				p := make([]byte, n)
				_, err = io.ReadFull(peer, p)
				require.NoError(t, err)
				got = append(got, p...)
			}
			require.Equal(t, data, got)
			go io.Copy(io.Discard, peer) // the reset at close
		})
	}
}
