package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/socklike"
)

// An application that aborts its connection, in proxy or shared-pool
// mode, resets the far application's, in either mode: the far end reads
// every byte written before the abort, then fails with ECONNRESET in a
// *net.OpError, never io.EOF. Both ends abort in turn, in all four pairs
// of modes, once with a stream the rings hold, read only after the abort
// (nothing written before it may be dropped), and once with one of many
// rings, read while it is written and while the reader writes too, until
// the reset fails its writes.
func TestAbortCarried(t *testing.T) {
	const ring = 64 << 10
	r := newRack(t, "", fmt.Sprintf("pool_ring = %d", ring))
	srv := attach(t, r.cb)
	client := attach(t, r.ca)
	mode := map[bool]string{false: "proxy", true: "pool"}
	for _, dialPool := range []bool{false, true} {
		for _, listenPool := range []bool{false, true} {
			ln, err := (&socklike.ListenConfig{Proxy: srv, Pool: listenPool}).Listen(context.Background(), "tcp", ":0")
			require.NoError(t, err)
			addr := fmt.Sprintf("b:%d", ln.Addr().(socklike.Addr).Port)
			for _, dialerAborts := range []bool{false, true} {
				for _, size := range []int{ring - 1000, 16*ring + 17} {
					name := fmt.Sprintf("listener_%s_aborts_to_dialer_%s_%d", mode[listenPool], mode[dialPool], size)
					if dialerAborts {
						name = fmt.Sprintf("dialer_%s_aborts_to_listener_%s_%d", mode[dialPool], mode[listenPool], size)
					}
					t.Run(name, func(t *testing.T) {
						c, err := (&socklike.Dialer{Proxy: client, Pool: dialPool}).Dial("tcp", addr)
						require.NoError(t, err)
						defer c.Close()
						s, err := ln.Accept()
						require.NoError(t, err)
						defer s.Close()
						require.Equal(t, mode[dialPool], c.(*socklike.Conn).Route().Mode)
						require.Equal(t, mode[listenPool], s.(*socklike.Conn).Route().Mode)
						aborter, reader := s, c
						if dialerAborts {
							aborter, reader = c, s
						}
						for _, x := range []net.Conn{c, s} {
							require.NoError(t, x.SetDeadline(time.Now().Add(time.Minute))) // a failure guard only
						}
						msg := make([]byte, size)
						rng := rand.New(rand.NewPCG(uint64(size), 7))
						for i := range msg {
							msg[i] = byte(rng.Uint32())
						}
						write := func() error {
							if _, err := aborter.Write(msg); err != nil {
								return err
							}
							return aborter.(*socklike.Conn).Abort()
						}
						var got []byte
						if size < ring {
							require.NoError(t, write())
							got, err = io.ReadAll(reader)
						} else {
							// Meanwhile the reader writes, unread, until
							// the reset fails its writes too.
							werr, rwerr := make(chan error, 1), make(chan error, 1)
							go func() { werr <- write() }()
							go func() {
								for b := make([]byte, 32<<10); ; {
									if _, err := reader.Write(b); err != nil {
										rwerr <- err
										return
									}
								}
							}()
							got, err = io.ReadAll(reader)
							require.NoError(t, <-werr)
							require.ErrorIs(t, <-rwerr, syscall.ECONNRESET, "the reader's writes")
						}
						require.Equal(t, len(msg), len(got), "bytes read before the reset")
						require.True(t, bytes.Equal(msg, got), "the bytes read differ from those written")
						var oe *net.OpError
						require.ErrorAs(t, err, &oe)
						require.ErrorIs(t, err, syscall.ECONNRESET)
					})
				}
			}
			ln.Close()
		}
	}
}
