package capture

import (
	"net/url"
	"strconv"
	"time"

	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// Path is ntproxy's capture endpoint on its admin socket:
//
//	GET /v1/capture?link=ntb0&conn=3&snap=512&count=100&duration=10s
//
// link (required) is a rack link's name or its peer's host name; conn,
// snap, count and duration are optional (Request). The reply is a pcapng
// stream (ContentType) that goes on until count frames were written, the
// duration elapsed or the client hung up, and ends with the interface's
// statistics. A request that cannot start is answered with a JSON
// *ctlapi.Error instead, as every admin call: CodeBadRequest,
// CodeUnknown (no such link) or CodeQuota (MaxCaptures under way).
const Path = "/v1/capture"

// ContentType is the media type of a capture stream.
const ContentType = "application/x-pcapng"

// MaxCaptures bounds the captures one ntproxy serves at once: each costs
// every frame of its link a call and a copy.
const MaxCaptures = 4

// Request is a capture request.
type Request struct {
	Link     string        // link name or peer host
	Conn     uint32        // the capturing ntproxy's socklike connection id (0: all)
	Snap     int           // payload bytes kept per frame (0: DefaultSnap)
	Count    int           // frames to write (0: no limit)
	Duration time.Duration // how long (0: no limit)
}

// Query encodes r as Path's query string.
func (r Request) Query() url.Values {
	q := url.Values{"link": {r.Link}}
	if r.Conn != 0 {
		q.Set("conn", strconv.FormatUint(uint64(r.Conn), 10))
	}
	if r.Snap != 0 {
		q.Set("snap", strconv.Itoa(r.Snap))
	}
	if r.Count != 0 {
		q.Set("count", strconv.Itoa(r.Count))
	}
	if r.Duration != 0 {
		q.Set("duration", r.Duration.String())
	}
	return q
}

// ParseRequest decodes and checks Path's query string.
func ParseRequest(q url.Values) (Request, error) {
	bad := func(format string, args ...any) (Request, error) {
		return Request{}, ctlapi.Errorf(ctlapi.CodeBadRequest, "capture: "+format, args...)
	}
	r := Request{Link: q.Get("link")}
	if r.Link == "" {
		return bad("link is required")
	}
	if s := q.Get("conn"); s != "" {
		v, err := strconv.ParseUint(s, 10, 20) // socklike ids are 20 bits
		if err != nil {
			return bad("conn %q: %v", s, err)
		}
		r.Conn = uint32(v)
	}
	var err error
	if s := q.Get("snap"); s != "" {
		if r.Snap, err = strconv.Atoi(s); err != nil || r.Snap < MinSnap || r.Snap > MaxSnap {
			return bad("snap %q: want %d..%d", s, MinSnap, MaxSnap)
		}
	}
	if s := q.Get("count"); s != "" {
		if r.Count, err = strconv.Atoi(s); err != nil || r.Count < 0 {
			return bad("count %q: want a number of frames", s)
		}
	}
	if s := q.Get("duration"); s != "" {
		if r.Duration, err = time.ParseDuration(s); err != nil || r.Duration < 0 {
			return bad("duration %q: want a Go duration such as 10s", s)
		}
	}
	return r, nil
}
