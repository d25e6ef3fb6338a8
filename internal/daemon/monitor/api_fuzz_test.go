package monitor

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// FuzzAPI sends arbitrary request bodies, as any local process may, to
// ntmon's local API (resolve, admit, listen, unlisten, and a path it does
// not serve). Every answer must be JSON: a failure an *Error with a code
// other than OK, a success the path's reply — a route to a configured host
// over a known path, or a port in 1..65535 that the port table then holds
// for the caller named.
func FuzzAPI(f *testing.F) {
	for _, s := range []struct {
		path uint8
		v    any
	}{
		{0, ctlapi.ResolveRequest{UID: 1000, Target: "b", Port: 6379}},
		{0, ctlapi.ResolveRequest{UID: 0, Target: "a", Port: 80, Transports: []string{ctlapi.PathTCP}}},
		{0, ctlapi.ResolveRequest{Target: "nowhere", Port: 70000}},
		{1, ctlapi.AdmitRequest{Peer: "b", Port: 22}},
		{1, ctlapi.AdmitRequest{Peer: "zz", Port: 0}},
		{2, ctlapi.ListenRequest{UID: 1000, PID: 1, Port: 0}},
		{2, ctlapi.ListenRequest{UID: 0, PID: -1, Port: 65535}},
		{3, ctlapi.ListenRequest{PID: 0, Port: 49152}},
		{4, struct{}{}},
	} {
		b, err := json.Marshal(s.v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(s.path, b)
	}
	f.Add(uint8(2), []byte(`{"port":-1}`))
	f.Add(uint8(0), []byte(`{"target":"b","port":80,"transports":["carrier pigeon"]}`))
	f.Add(uint8(0), []byte(`not json`))
	m, err := New(fuzzConfig(f), Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { m.Close() })
	h := m.apiHandler()
	paths := []string{ctlapi.PathResolve, ctlapi.PathAdmit, ctlapi.PathListen, ctlapi.PathUnlisten, "/v1/nothing"}
	f.Fuzz(func(t *testing.T, path uint8, body []byte) {
		m.ports = newPortTable() // each execution starts with no reservation
		p := paths[int(path)%len(paths)]
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "http://local"+p, bytes.NewReader(body)))
		if rec.Code != http.StatusOK {
			var e ctlapi.Error
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Code == ctlapi.OK {
				t.Fatalf("%s: HTTP %d with %q", p, rec.Code, rec.Body.Bytes())
			}
			return
		}
		dec := json.NewDecoder(bytes.NewReader(rec.Body.Bytes()))
		dec.DisallowUnknownFields()
		switch p {
		case ctlapi.PathResolve:
			var r ctlapi.Route
			if err := dec.Decode(&r); err != nil {
				t.Fatalf("route %q: %v", rec.Body.Bytes(), err)
			}
			if _, ok := m.peers[r.Host]; !ok && r.Host != m.cfg.Host {
				t.Fatalf("route to %q, not a configured host", r.Host)
			}
			switch r.Path {
			case ctlapi.PathSHM, ctlapi.PathNTB, ctlapi.PathRDMA, ctlapi.PathTCP:
			default:
				t.Fatalf("route over %q", r.Path)
			}
		case ctlapi.PathListen:
			var r ctlapi.ListenReply
			if err := dec.Decode(&r); err != nil {
				t.Fatalf("listen reply %q: %v", rec.Body.Bytes(), err)
			}
			var req ctlapi.ListenRequest
			_ = json.Unmarshal(body, &req)
			if r.Port < 1 || r.Port > 65535 {
				t.Fatalf("listening on port %d", r.Port)
			}
			held := m.ports.list()
			if len(held) != 1 || held[0].Port != r.Port || held[0].UID != req.UID || held[0].PID != req.PID {
				t.Fatalf("port %d for %+v; table %+v", r.Port, req, held)
			}
		case ctlapi.PathAdmit, ctlapi.PathUnlisten:
			var r struct{}
			if err := dec.Decode(&r); err != nil {
				t.Fatalf("%s reply %q: %v", p, rec.Body.Bytes(), err)
			}
		default:
			t.Fatalf("%s answered HTTP 200", p)
		}
	})
}
