package proxy

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/socklike"
)

// waitLinkState waits until dev's link is in state s.
func waitLinkState(t *testing.T, dev ntb.Device, s ntb.LinkState) {
	t.Helper()
	require.Eventually(t, func() bool { return dev.Link() == s }, 10*time.Second, time.Millisecond, "link %s never %s", dev.Name(), s)
}

// A dial whose NTB link is down takes the fallback at once and says why;
// once the link is back, dials take it again.
func TestDialFollowsLink(t *testing.T) {
	port := 20000 + rand.IntN(20000)
	r := newRack(t, fmt.Sprintf(`fallback = "{peer}:%d"`, port), fmt.Sprintf(`fallback = "{self}:%d"`, port))
	_, client := echoRack(t, r)
	dev := r.a.links["b"].ep.Device().(*shm.Device)
	waitLinkState(t, dev, ntb.LinkUp)
	route := func(c any) socklike.Route { return c.(interface{ Route() socklike.Route }).Route() }

	c, err := (&socklike.Dialer{Proxy: client}).Dial("tcp", "b:80")
	require.NoError(t, err)
	require.Equal(t, ctlapi.PathNTB, route(c).Path)
	roundTrip(t, c, 1, 4096)
	c.Close()

	// Once the link has been up, a dial does not give it linkGrace.
	waitfor.True(t, "link ab marked as having been up", r.a.links["b"].everUp.Load)
	dev.ForceLinkDown()
	waitLinkState(t, dev, ntb.LinkDown)
	start := time.Now()
	c, err = (&socklike.Dialer{Proxy: client}).Dial("tcp", "b:80")
	took := time.Since(start)
	require.NoError(t, err)
	require.Equal(t, ctlapi.PathTCP, route(c).Path)
	require.Contains(t, route(c).Reason, "NTB link ab down (forced down)")
	// At once, not after the dial's timeout: dialTimeout/2 holds on a
	// loaded machine (-race, a TLS handshake starved of CPU).
	require.Less(t, took, dialTimeout/2, "a dial with the NTB link down takes the fallback at once, not after the dial timeout; took %v", took)
	t.Logf("dial with the link down: %v, reason %q", took, route(c).Reason)
	roundTrip(t, c, 2, 4096)
	c.Close()

	dev.ForceLinkUp()
	waitLinkState(t, dev, ntb.LinkUp)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		start := time.Now()
		c, err := (&socklike.Dialer{Proxy: client}).Dial("tcp", "b:80")
		if !assert.NoError(ct, err, "dial failed after %v", time.Since(start)) {
			return
		}
		defer c.Close()
		assert.Equal(ct, ctlapi.PathNTB, route(c).Path, "dial took %v, route %+v", time.Since(start), route(c))
	}, 10*time.Second, 10*time.Millisecond, "dials take the NTB link again once it is up")
}

// With no other transport, a dial whose link is down fails after
// linkGrace, naming the link's state, rather than at the dial timeout.
func TestDialLinkDownNoFallback(t *testing.T) {
	r := newRack(t, "")
	_, client := echoRack(t, r)
	dev := r.a.links["b"].ep.Device().(*shm.Device)
	waitLinkState(t, dev, ntb.LinkUp)
	// Once the link has been up, a dial does not give it linkGrace.
	waitfor.True(t, "link ab marked as having been up", r.a.links["b"].everUp.Load)
	dev.ForceLinkDown()
	waitLinkState(t, dev, ntb.LinkDown)
	start := time.Now()
	_, err := (&socklike.Dialer{Proxy: client}).Dial("tcp", "b:80")
	took := time.Since(start)
	require.Error(t, err)
	require.Contains(t, err.Error(), "NTB link ab down (forced down)")
	require.Less(t, took, dialTimeout/2, "a dial with no path left fails after the link's grace, not the dial timeout; took %v", took)
}
