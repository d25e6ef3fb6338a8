package ctlapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
)

// countingBody records how many bytes a decoder read of a request body.
type countingBody struct {
	r *bytes.Reader
	n int
}

func (c *countingBody) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

func (c *countingBody) Close() error { return nil }

// decodeAs runs Decode on body, as ntmon's and ntproxy's handlers do on a
// local caller's request: it reads at most 64 KiB, fails only with an
// *Error of CodeBadRequest, and what it accepts encodes and decodes back
// to a value of the same encoding (omitempty makes an empty list and none
// one).
func decodeAs[T any](t *testing.T, body []byte) {
	req := httptest.NewRequest(http.MethodPost, "http://local"+PathResolve, nil)
	cb := &countingBody{r: bytes.NewReader(body)}
	req.Body = cb
	var v T
	err := Decode(req, &v)
	if cb.n > 64<<10 {
		t.Fatalf("read %d bytes of the body, limit %d", cb.n, 64<<10)
	}
	if err != nil {
		var e *Error
		if !errors.As(err, &e) || e.Code != CodeBadRequest {
			t.Fatalf("error %v is not a bad request", err)
		}
		return
	}
	again, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("encode %+v: %v", v, err)
	}
	req = httptest.NewRequest(http.MethodPost, "http://local"+PathResolve, bytes.NewReader(again))
	var w T
	if len(again) <= 64<<10 {
		if err := Decode(req, &w); err != nil {
			t.Fatalf("decode %s: %v", again, err)
		}
		if b, err := json.Marshal(w); err != nil || !bytes.Equal(b, again) {
			t.Fatalf("round trip changed %s into %s (%v)", again, b, err)
		}
	}
}

// FuzzDecode feeds arbitrary request bodies, as any local process may
// send them to ntmon's or ntproxy's API socket, to the decoder of every
// request type.
func FuzzDecode(f *testing.F) {
	for _, v := range []any{
		ResolveRequest{UID: 1000, Target: "b", Port: 6379, Transports: []string{PathNTB, PathTCP}},
		ResolveRequest{UID: -1, Target: "10.0.0.2", Port: 65535},
		AdmitRequest{Peer: "a", Port: 80},
		ListenRequest{UID: 0, PID: 1, Port: 22},
		ListenRequest{Port: 0},
		FaultRequest{Link: "ntb0", Down: true},
	} {
		b, err := json.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	for _, s := range []string{
		``, `{}`, `null`, `[]`, `{"uid":1e3}`, `{"port":9223372036854775808}`, `{"target":"\ud800"}`,
		`{"uid":1}{"uid":2}`, `{"uid":1,"bogus":2}`, `{"transports":[1]}`, `{"down":"yes"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		decodeAs[ResolveRequest](t, body)
		decodeAs[AdmitRequest](t, body)
		decodeAs[ListenRequest](t, body)
		decodeAs[FaultRequest](t, body)
	})
}
