package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"

	"github.com/ntstack/ntstack/internal/daemon/capture"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// Packet capture of rack links (internal/daemon/capture). A capture taps one
// link's transport.Endpoint — every frame of every connection on it, or one
// connection's — and streams pcapng from the admin socket (capture.Path)
// to `ntmon capture`. Up to capture.MaxCaptures run at once in a process,
// each with its own tap and bounded queue: a capture whose reader falls
// behind drops frames (counted in the file), it never slows the link.
// Frames on a rack link carry the proxies' leg frames, so records are
// flagged capture.FlagLeg.

// captures counts the captures under way in this process.
var captures atomic.Int32

// linkNamed finds a rack link by its name or its peer's host name.
func (s *Server) linkNamed(name string) *rackLink {
	if l := s.links[name]; l != nil {
		return l
	}
	for _, l := range s.links {
		if l.peer.Link == name {
			return l
		}
	}
	return nil
}

// Capture writes a pcapng capture of the rack link req.Link to w until
// req.Count frames were written, req.Duration elapsed, or ctx or the Server
// ends; flushed, if set, is called after w was written and nothing was
// waiting. An error before anything was written is a *ctlapi.Error
// (CodeUnknown, CodeQuota, CodeBadRequest).
func (s *Server) Capture(ctx context.Context, req capture.Request, w io.Writer, flushed func()) (int, capture.End, error) {
	l := s.linkNamed(req.Link)
	if l == nil {
		return 0, "", ctlapi.Errorf(ctlapi.CodeUnknown, "capture: no rack link or peer %q", req.Link)
	}
	if captures.Add(1) > capture.MaxCaptures {
		captures.Add(-1)
		return 0, "", ctlapi.Errorf(ctlapi.CodeQuota, "capture: %d captures under way already", capture.MaxCaptures)
	}
	defer captures.Add(-1)
	tap, err := capture.StartTap(l.ep, capture.TapOptions{Link: l.peer.Link, Leg: true, Conn: req.Conn, Snap: req.Snap})
	if err != nil {
		return 0, "", ctlapi.Errorf(ctlapi.CodeBadRequest, "%v", err)
	}
	defer tap.Stop()
	filter := ""
	if req.Conn != 0 {
		filter = fmt.Sprintf("conn %d", req.Conn)
	}
	cw, err := capture.NewWriter(w, l.peer.Link, tap.Snap(), filter)
	if err != nil {
		return 0, "", err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	s.logf("capture of link %s (%s) started", l.peer.Link, filter)
	n, end, err := capture.Copy(ctx, tap, cw, capture.Limits{Count: req.Count, Duration: req.Duration}, flushed)
	s.logf("capture of link %s: %d frames, %d dropped, %s", l.peer.Link, n, tap.Dropped(), end)
	return n, end, err
}

// serveCapture answers capture.Path: the stream, or a JSON error if the
// capture cannot start.
func (s *Server) serveCapture(w http.ResponseWriter, r *http.Request) {
	req, err := capture.ParseRequest(r.URL.Query())
	if err != nil {
		ctlapi.Reply(w, nil, err)
		return
	}
	sw := &streamWriter{w: w}
	rc := http.NewResponseController(w)
	_, _, err = s.Capture(r.Context(), req, sw, func() { _ = rc.Flush() })
	if err != nil && !sw.started {
		ctlapi.Reply(w, nil, err)
	}
}

// streamWriter sends the capture's headers before its first byte, so a
// capture that fails to start can still answer with an error.
type streamWriter struct {
	w       http.ResponseWriter
	started bool
}

func (sw *streamWriter) Write(p []byte) (int, error) {
	if !sw.started {
		sw.started = true
		sw.w.Header().Set("Content-Type", capture.ContentType)
		sw.w.WriteHeader(http.StatusOK)
	}
	return sw.w.Write(p)
}
