package appproto

import (
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/wire/errcode"
)

func TestRoundTrips(t *testing.T) {
	h, err := DecodeHello(Hello{Version: Version, Name: "kv-server"}.Encode())
	require.NoError(t, err)
	require.Equal(t, Hello{Version: Version, Name: "kv-server"}, h)

	w := Welcome{Version: Version, Code: errcode.CodeQuota, AppID: 7, Window: 1 << 22, Message: "too many"}
	got, err := DecodeWelcome(w.Encode())
	require.NoError(t, err)
	require.Equal(t, w, got)

	var buf bytes.Buffer
	require.NoError(t, WriteFrame(&buf, DialRequest{Target: "b", Port: 80, Priority: 3}))
	var dr DialRequest
	require.NoError(t, ReadFrame(&buf, &dr))
	require.Equal(t, DialRequest{Target: "b", Port: 80, Priority: 3}, dr)
}

func TestRejects(t *testing.T) {
	_, err := DecodeHello([]byte{1, 2, 3})
	require.Error(t, err)
	bad := Hello{Version: 1, Name: "x"}.Encode()
	bad[0] ^= 0xff
	_, err = DecodeHello(bad)
	require.ErrorContains(t, err, "magic")
	long := Hello{Version: 1, Name: "x"}.Encode()
	_, err = DecodeHello(append(long, 'y'))
	require.Error(t, err, "a name length that disagrees with the datagram")

	for _, raw := range [][]byte{
		{0, 0, 0, 0},                          // empty frame
		{0xff, 0xff, 0, 0},                    // over MaxFrame
		{2, 0, 0, 0, '{', '}'},                // fine framing, then:
		{5, 0, 0, 0, '{', '"', 'x', '"', '}'}, // bad JSON
	} {
		var dr DialRequest
		err := ReadFrame(bytes.NewReader(raw), &dr)
		if len(raw) == 6 {
			require.NoError(t, err)
			continue
		}
		require.Error(t, err)
	}
	var dr DialRequest
	err = ReadFrame(bytes.NewReader(append([]byte{14, 0, 0, 0}, `{"bogus": 1}  `...)), &dr)
	require.True(t, errors.Is(err, ErrFrame), "unknown fields are refused: %v", err)
}

func FuzzDecode(f *testing.F) {
	f.Add(Hello{Version: 1, Name: "app"}.Encode())
	f.Add(Welcome{Version: 1, AppID: 1, Window: 4096}.Encode())
	f.Add([]byte(`{"target":"b","port":80}`))
	f.Add([]byte(`{"target":"b","port":80,"priority":7,"direct":true,"pool":true,"transports":["tcp","ntb"]}`))
	f.Add([]byte(`{"port":0,"app_port":3,"backlog":128,"pool":true}`))
	f.Add([]byte(`{"local":"b:80","remote":"a:1","path":"ntb","reason":"r","pool":{"slot":2}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		if h, err := DecodeHello(b); err == nil {
			require.Equal(t, b, h.Encode())
		}
		if w, err := DecodeWelcome(b); err == nil {
			require.Equal(t, b, w.Encode())
		}
		// The frames an application sends its proxy, and the one the
		// proxy introduces a connection with: as ReadFrame reads them.
		if len(b) <= MaxFrame {
			framed := rawFrame(string(b))
			fuzzFrame[DialRequest](t, framed)
			fuzzFrame[ListenRequest](t, framed)
			fuzzFrame[Incoming](t, framed)
		}
	})
}
