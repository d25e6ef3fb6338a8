package monitor

// The peer protocol's wire format. Every message between two ntmons is one
// frame:
//
//	 0               4       5
//	+---------------+-------+---------------------------+
//	| length (u32)  | type  | body (length-1 bytes)     |
//	+---------------+-------+---------------------------+
//	  little-endian   u8      JSON, one object, per type
//
// length counts the type byte and the body, so it is at least 1 and at
// most MaxFrame. A reader checks the length before it allocates anything,
// so a hostile length costs at most MaxFrame bytes. Bodies are JSON for
// simplicity and debuggability (a few frames a second per peer); the
// decoders below accept exactly one JSON object of the expected shape and
// nothing after it.
//
// Frames travel inside a TLS 1.3 session authenticated both ways with the
// hosts' keys (plain TCP only on an auth.insecure host), so every byte
// below comes from the host the certificate proved.
//
// The first frame each way is HELLO: the dialer sends its own, the
// acceptor answers with its HELLO or with an ERROR, then both exchange
// HEARTBEATs every monitor.heartbeat. ERROR and BYE end a session.

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
)

// Frame layout constants.
const (
	// frameHeader is the length prefix.
	frameHeader = 4
	// MaxFrame caps a frame's length field (type byte + body). A HELLO
	// lists a handful of links and addresses, a few hundred bytes; 64 KiB
	// leaves room for a rack's worth of them and bounds what a hostile
	// peer can make us allocate.
	MaxFrame = 64 << 10
)

// FrameType is a frame's type byte.
type FrameType uint8

// Frame types. The numbers are part of the protocol.
const (
	FrameHello     FrameType = 1 // Hello: first frame each way
	FrameHeartbeat FrameType = 2 // Heartbeat: liveness, every monitor.heartbeat
	FrameError     FrameType = 3 // ErrorBody: refusal or protocol error, then close
	FrameBye       FrameType = 4 // ErrorBody: orderly close (shutting down, replaced)
)

func (t FrameType) String() string {
	switch t {
	case FrameHello:
		return "HELLO"
	case FrameHeartbeat:
		return "HEARTBEAT"
	case FrameError:
		return "ERROR"
	case FrameBye:
		return "BYE"
	}
	return fmt.Sprintf("type %d", uint8(t))
}

func (t FrameType) known() bool { return t >= FrameHello && t <= FrameBye }

// Frame is one decoded frame. Body aliases the buffer it was read into.
type Frame struct {
	Type FrameType
	Body []byte
}

// ErrFrame is wrapped by every framing or body decoding error: the
// connection it came from is no longer in sync and must be closed.
var ErrFrame = errors.New("bad frame")

// ReadFrame reads one frame from r. It allocates at most MaxFrame bytes,
// and only after the length has been checked.
func ReadFrame(r io.Reader) (Frame, error) {
	var hdr [frameHeader]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return Frame{}, fmt.Errorf("read frame header: %w: %w", ErrFrame, err)
		}
		return Frame{}, fmt.Errorf("read frame header: %w", err)
	}
	n, err := checkLength(binary.LittleEndian.Uint32(hdr[:]))
	if err != nil {
		return Frame{}, err
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return Frame{}, fmt.Errorf("read frame of %d bytes: %w: truncated", n, ErrFrame)
		}
		return Frame{}, fmt.Errorf("read frame of %d bytes: %w", n, err)
	}
	return parseFrame(buf)
}

// DecodeFrame decodes the first frame in b and returns it with the number
// of bytes it used. The frame's Body aliases b.
func DecodeFrame(b []byte) (Frame, int, error) {
	if len(b) < frameHeader {
		return Frame{}, 0, fmt.Errorf("decode frame: %w: %d bytes, short of the %d-byte header", ErrFrame, len(b), frameHeader)
	}
	n, err := checkLength(binary.LittleEndian.Uint32(b))
	if err != nil {
		return Frame{}, 0, err
	}
	if len(b)-frameHeader < n {
		return Frame{}, 0, fmt.Errorf("decode frame: %w: length %d, only %d bytes follow", ErrFrame, n, len(b)-frameHeader)
	}
	f, err := parseFrame(b[frameHeader : frameHeader+n])
	if err != nil {
		return Frame{}, 0, err
	}
	return f, frameHeader + n, nil
}

func checkLength(n uint32) (int, error) {
	if n == 0 {
		return 0, fmt.Errorf("decode frame: %w: zero length (no type byte)", ErrFrame)
	}
	if n > MaxFrame {
		return 0, fmt.Errorf("decode frame: %w: length %d over the %d-byte cap", ErrFrame, n, MaxFrame)
	}
	return int(n), nil
}

func parseFrame(b []byte) (Frame, error) {
	t := FrameType(b[0])
	if !t.known() {
		return Frame{}, fmt.Errorf("decode frame: %w: unknown %v", ErrFrame, t)
	}
	return Frame{Type: t, Body: b[1:]}, nil
}

// AppendFrame appends the encoding of a frame of type t whose body is the
// JSON encoding of v.
func AppendFrame(dst []byte, t FrameType, v any) ([]byte, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return dst, fmt.Errorf("encode %v: %w", t, err)
	}
	if 1+len(body) > MaxFrame {
		return dst, fmt.Errorf("encode %v: %d-byte body over the %d-byte frame cap", t, len(body), MaxFrame-1)
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(1+len(body)))
	dst = append(dst, byte(t))
	return append(dst, body...), nil
}

// WriteFrame writes one frame in a single Write.
func WriteFrame(w io.Writer, t FrameType, v any) error {
	b, err := AppendFrame(nil, t, v)
	if err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("write %v: %w", t, err)
	}
	return nil
}

// Magic opens every HELLO: a connection that does not start with it is not
// an ntmon.
const Magic = "ntstack-ntmon"

// ProtocolVersion is the peer protocol this build speaks. Peers must speak
// the same version; a HELLO with another is refused with an ERROR frame.
const ProtocolVersion = 1

// Hello is the body of a HELLO frame: who the sender is and what it offers.
type Hello struct {
	Magic     string      `json:"magic"`
	Version   int         `json:"version"`
	Host      string      `json:"host"`
	Caps      []string    `json:"caps"`
	Links     []HelloLink `json:"links"`
	Addresses []string    `json:"addresses"`
	// RDMA is the sender's ntproxy's RDMA listener (host:port) while it
	// has a usable RDMA device; else RDMAWhy says why not.
	RDMA    string `json:"rdma,omitempty"`
	RDMAWhy string `json:"rdma_why,omitempty"`
}

// HelloLink is one NTB link the sender has configured.
type HelloLink struct {
	Name       string `json:"name"`
	Peer       string `json:"peer"` // the host at the other end, in the sender's config
	Window     int    `json:"window"`
	Partitions int    `json:"partitions"`
}

// Heartbeat is the body of a HEARTBEAT frame.
type Heartbeat struct {
	Seq uint64 `json:"seq"`
}

// ErrorBody is the body of ERROR and BYE frames.
type ErrorBody struct {
	Message string `json:"message"` // for people: logs and status
	// Reason classifies an ERROR for the receiving program ("" = none).
	Reason string `json:"reason,omitempty"`
}

// ErrorBody reasons.
const (
	// reasonDuplicate: the peers already have a session and keep the
	// other one (see Monitor.register). The loser does not count it as a
	// failure.
	reasonDuplicate = "duplicate"
)

// Limits on a HELLO's contents, far above any real rack and well inside
// MaxFrame; they keep a hostile HELLO from filling the status output.
const (
	maxHelloItems = 256
	maxNameLen    = 255
	maxWhyLen     = 1024
)

// DecodeBody decodes a frame body into v: exactly one JSON object and
// nothing after it. Unknown fields are ignored so that a newer peer's HELLO
// still yields its version, which is then refused with a clear message.
func DecodeBody(f Frame, v any) error {
	if b := bytes.TrimLeft(f.Body, " \t\r\n"); len(b) == 0 || b[0] != '{' {
		return fmt.Errorf("decode %v body: %w: not a JSON object", f.Type, ErrFrame)
	}
	dec := json.NewDecoder(bytes.NewReader(f.Body))
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("decode %v body: %w: %w", f.Type, ErrFrame, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("decode %v body: %w: data after the JSON object", f.Type, ErrFrame)
	}
	return nil
}

// DecodeHello decodes and sanity-checks a HELLO body. It does not check
// the magic or the version: the caller refuses those with a message that
// names both sides.
func DecodeHello(f Frame) (Hello, error) {
	var h Hello
	if f.Type != FrameHello {
		return h, fmt.Errorf("decode hello: %w: got %v", ErrFrame, f.Type)
	}
	if err := DecodeBody(f, &h); err != nil {
		return h, err
	}
	if len(h.Caps) > maxHelloItems || len(h.Links) > maxHelloItems || len(h.Addresses) > maxHelloItems {
		return h, fmt.Errorf("decode hello: %w: more than %d caps, links or addresses", ErrFrame, maxHelloItems)
	}
	long := len(h.Host) > maxNameLen || len(h.Magic) > maxNameLen
	for _, s := range h.Caps {
		long = long || len(s) > maxNameLen
	}
	for _, s := range h.Addresses {
		long = long || len(s) > maxNameLen
	}
	for _, l := range h.Links {
		long = long || len(l.Name) > maxNameLen || len(l.Peer) > maxNameLen
		if l.Window < 0 || l.Partitions < 0 {
			return h, fmt.Errorf("decode hello: %w: link %q: negative window or partitions", ErrFrame, l.Name)
		}
	}
	if long {
		return h, fmt.Errorf("decode hello: %w: a name longer than %d bytes", ErrFrame, maxNameLen)
	}
	if len(h.RDMAWhy) > maxWhyLen {
		return h, fmt.Errorf("decode hello: %w: rdma_why longer than %d bytes", ErrFrame, maxWhyLen)
	}
	if h.RDMA != "" {
		if _, _, err := net.SplitHostPort(h.RDMA); err != nil || len(h.RDMA) > maxNameLen {
			return h, fmt.Errorf("decode hello: %w: rdma address %.64q: want host:port", ErrFrame, h.RDMA)
		}
	}
	return h, nil
}
