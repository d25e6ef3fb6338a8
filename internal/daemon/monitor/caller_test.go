package monitor

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/proc"
	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// callAs sends a request to n's API handler as if its connection's
// SO_PEERCRED said cred, and decodes the reply into reply (nil: discard).
// It returns the error code.
func callAs(t *testing.T, n *node, cred proc.Cred, path string, req, reply any) ctlapi.Code {
	t.Helper()
	method, body := http.MethodGet, []byte(nil)
	if req != nil {
		var err error
		body, err = json.Marshal(req)
		require.NoError(t, err)
		method = http.MethodPost
	}
	hr := httptest.NewRequest(method, "http://local"+path, bytes.NewReader(body))
	hr = hr.WithContext(context.WithValue(hr.Context(), callerKey{}, callerCred{cred: cred}))
	w := httptest.NewRecorder()
	n.m.apiHandler().ServeHTTP(w, hr)
	if w.Code != http.StatusOK {
		var e ctlapi.Error
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &e), "%s", w.Body)
		t.Logf("%s as uid %d: %v", path, cred.UID, &e)
		return e.Code
	}
	if reply != nil {
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), reply))
	}
	return ctlapi.OK
}

// A non-root caller is itself whatever its body says: it cannot release
// another user's reservation, pose as root for a port below 1024, or see
// another user's reservations; root (ntproxy relaying) can do all three.
func TestAPIIdentityFromPeerCred(t *testing.T) {
	n := start(t, baseConfig(t, "a"), nil)
	root := proc.Cred{UID: 0, PID: os.Getpid()}
	// A process that has exited has no capabilities to read.
	gone := exec.Command("true")
	require.NoError(t, gone.Run())
	nobody := proc.Cred{UID: 65534, PID: gone.Process.Pid}

	// Root's reservation, as ntproxy relays it for a root application.
	var rep ctlapi.ListenReply
	require.Equal(t, ctlapi.OK, callAs(t, n, root, ctlapi.PathListen, ctlapi.ListenRequest{UID: 0, PID: os.Getpid(), Port: 7000}, &rep))
	// Root may take a port below 1024.
	require.Equal(t, ctlapi.OK, callAs(t, n, root, ctlapi.PathListen, ctlapi.ListenRequest{Port: 80}, &rep))
	// Another user cannot release it, with any pid in its body.
	for _, pid := range []int{0, os.Getpid()} {
		code := callAs(t, n, nobody, ctlapi.PathUnlisten, ctlapi.ListenRequest{UID: 0, PID: pid, Port: 7000}, nil)
		require.Equal(t, ctlapi.CodeDenied, code)
	}
	// Nor reserve port 22 by claiming to be pid 1 of root.
	require.Equal(t, ctlapi.CodeDenied, callAs(t, n, nobody, ctlapi.PathListen, ctlapi.ListenRequest{UID: 0, PID: 1, Port: 22}, nil))
	// It reserves ports as itself, whatever its body says.
	require.Equal(t, ctlapi.OK, callAs(t, n, nobody, ctlapi.PathListen, ctlapi.ListenRequest{UID: 0, PID: 1, Port: 7001}, &rep))
	var st ctlapi.Status
	require.Equal(t, ctlapi.OK, callAs(t, n, root, ctlapi.PathStatus, nil, &st))
	require.Equal(t, []ctlapi.ListenEntry{{Port: 80, UID: 0, PID: 0}, {Port: 7000, UID: 0, PID: os.Getpid()}, {Port: 7001, UID: 65534, PID: nobody.PID}}, st.Listening)
	// It sees only its own reservation.
	require.Equal(t, ctlapi.OK, callAs(t, n, nobody, ctlapi.PathStatus, nil, &st))
	require.Equal(t, []ctlapi.ListenEntry{{Port: 7001, UID: 65534, PID: nobody.PID}}, st.Listening)
	// ... and releases it, which another non-root user cannot.
	require.Equal(t, ctlapi.CodeDenied, callAs(t, n, proc.Cred{UID: 1000, PID: nobody.PID}, ctlapi.PathUnlisten, ctlapi.ListenRequest{Port: 7001}, nil))
	require.Equal(t, ctlapi.OK, callAs(t, n, nobody, ctlapi.PathUnlisten, ctlapi.ListenRequest{UID: 0, PID: 12345, Port: 7001}, nil))
	// Root releases anyone's.
	require.Equal(t, ctlapi.OK, callAs(t, n, root, ctlapi.PathUnlisten, ctlapi.ListenRequest{Port: 7000}, nil))

	// Root relaying for a non-root application: the application's pid
	// decides a port below 1024.
	require.Equal(t, ctlapi.CodeDenied, callAs(t, n, root, ctlapi.PathListen, ctlapi.ListenRequest{UID: 65534, PID: nobody.PID, Port: 23}, nil))

	// A connection without credentials is refused.
	hr := httptest.NewRequest(http.MethodGet, "http://local"+ctlapi.PathStatus, nil)
	w := httptest.NewRecorder()
	n.m.apiHandler().ServeHTTP(w, hr)
	require.Equal(t, http.StatusForbidden, w.Code)
}

// A non-root caller's status holds its own applications, listeners and
// connections only, the links without per-partition traffic, and no
// gateway; root's holds everything.
func TestVisibleTo(t *testing.T) {
	full := func() ctlapi.Status {
		return ctlapi.Status{
			Listening: []ctlapi.ListenEntry{{Port: 80, UID: 0, PID: 1}, {Port: 7001, UID: 1000, PID: 10}},
			Proxy: &ctlapi.Snapshot{
				Links:     []ctlapi.LinkStat{{Name: "l", State: "up", Window: 4096, Partitions: []ctlapi.PartitionStat{{Index: 0, Conns: 2, BytesTX: 100, BytesRX: 50, MsgsTX: 3, MsgsRX: 2}}}},
				Apps:      []ctlapi.AppStat{{ID: 1, UID: 0, PID: 1}, {ID: 2, UID: 1000, PID: 10}},
				Listeners: []ctlapi.ListenStat{{App: 1, Port: 80}, {App: 2, Port: 7001}},
				Conns:     []ctlapi.ConnStat{{ID: 5, App: 1, BytesTX: 100}, {ID: 6, App: 2, BytesTX: 7}},
				Gateway:   []ctlapi.GatewayStat{{Kind: "forward", BytesIn: 9}},
			},
		}
	}
	st := full()
	visibleTo(&st, 0)
	require.Equal(t, full(), st)

	visibleTo(&st, 1000)
	require.Contains(t, st.Scope, "uid 1000 only")
	var text strings.Builder
	require.NoError(t, WriteStatus(&text, &st))
	require.Contains(t, text.String(), "view: uid 1000 only")
	require.Equal(t, []ctlapi.ListenEntry{{Port: 7001, UID: 1000, PID: 10}}, st.Listening)
	require.Equal(t, []ctlapi.AppStat{{ID: 2, UID: 1000, PID: 10}}, st.Proxy.Apps)
	require.Equal(t, []ctlapi.ListenStat{{App: 2, Port: 7001}}, st.Proxy.Listeners)
	require.Equal(t, []ctlapi.ConnStat{{ID: 6, App: 2, BytesTX: 7}}, st.Proxy.Conns)
	require.Equal(t, []ctlapi.PartitionStat{{Index: 0}}, st.Proxy.Links[0].Partitions)
	require.Equal(t, "up", st.Proxy.Links[0].State)
	require.Nil(t, st.Proxy.Gateway)

	st = full()
	visibleTo(&st, 4242)
	require.Empty(t, st.Listening)
	require.Empty(t, st.Proxy.Apps)
	require.Empty(t, st.Proxy.Conns)
}

// The API's connections carry their SO_PEERCRED identity: this test
// process's, root or not.
func TestAPIConnCred(t *testing.T) {
	n := start(t, baseConfig(t, "a"), nil)
	var rep ctlapi.ListenReply
	require.NoError(t, n.client.Call(context.Background(), ctlapi.PathListen, ctlapi.ListenRequest{UID: 4321, PID: os.Getpid(), Port: 7002}, &rep))
	st := n.status(t)
	want := ctlapi.ListenEntry{Port: 7002, UID: 4321, PID: os.Getpid()} // root asserts for anyone
	if os.Getuid() != 0 {
		want = ctlapi.ListenEntry{Port: 7002, UID: os.Getuid(), PID: os.Getpid()}
	}
	require.Equal(t, []ctlapi.ListenEntry{want}, st.Listening)
}

// One remote address has at most maxHandshakesPerIP connections in their
// HELLO exchange: the next is closed at once, without a word; once one of
// them ends, a connection from it is served again.
func TestPeerHandshakesBoundedPerIP(t *testing.T) {
	la := listen(t)
	a := baseConfig(t, "a")
	a.Monitor.PeerTimeout.Duration = time.Minute // the silent ones stay pending
	start(t, a, la)
	silent := make([]net.Conn, maxHandshakesPerIP)
	for i := range silent {
		silent[i] = rawPeer(t, la.Addr())
	}
	// Each silent connection is in its exchange once its successor is
	// accepted; the listener takes them in order, so the one after them
	// all meets the bound.
	over := rawPeer(t, la.Addr())
	require.Empty(t, readUntilClosed(t, over), "refused without a frame")

	silent[0].Close()
	waitfor.True(t, "a connection from the address served again", func() bool {
		c, err := net.Dial("tcp", la.Addr().String())
		if err != nil {
			return false
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(waitFor))
		// A served connection gets the server's half of the TLS handshake
		// (which then refuses this certificate-less client); a refused one
		// is closed before a byte.
		err = tls.Client(c, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}).Handshake()
		var alert tls.AlertError
		return err == nil || errors.As(err, &alert)
	})
}
