package socklike

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestHTTP runs an unmodified net/http server and client over the fabric:
// the server serves a socklike Listener, the client dials through a
// Dialer plugged into http.Transport.
func TestHTTP(t *testing.T) {
	a, b := endpoints(t, Config{})
	lc := ListenConfig{Endpoint: b}
	ln, err := lc.Listen(context.Background(), "ntb", ":80")
	require.NoError(t, err)
	body := bytes.Repeat([]byte("ntstack "), 1<<17) // 1 MiB
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost { // echo, read first: HTTP/1 is not full duplex
			in, _ := io.ReadAll(r.Body)
			w.Write(in)
			return
		}
		w.Write(body)
	})}
	go srv.Serve(ln)
	defer srv.Close()

	d := &Dialer{Endpoint: a, Timeout: 5 * time.Second}
	client := &http.Client{Transport: &http.Transport{DialContext: d.DialContext}, Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	for range 20 { // keep-alive: the same connection carries many requests
		resp, err := client.Get("http://peer/")
		require.NoError(t, err)
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.True(t, bytes.Equal(body, got))
	}
	resp, err := client.Post("http://peer:80/echo", "application/octet-stream", bytes.NewReader(body[:100000]))
	require.NoError(t, err)
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, body[:100000], got)

	require.NoError(t, srv.Shutdown(context.Background()))
}
