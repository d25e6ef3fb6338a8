// Package appproto is the protocol between an application and its host's
// ntproxy ("attached mode").
//
// An application connects to ntproxy's Unix socket and sends a Hello. The
// proxy checks the caller's credentials (SO_PEERCRED), creates a private
// memory link for it (an emulated NTB link in a memfd) and answers with a
// Welcome that carries the link's descriptor (SCM_RIGHTS) and, when
// ntproxy has shared-pool mode on, its shared buffer pool's (internal/prim/pool;
// its geometry in the Welcome). Both sides then
// run socklike over that link; the Unix socket stays open and carries
// nothing more — its closing is how each side learns the other has gone.
//
// Over the memory link, the application asks for things by opening a
// connection to one of the proxy's service ports and writing one request
// frame; the proxy answers with one reply frame:
//
//	PortDial:   DialRequest  → DialReply, then the connection carries the
//	            application's stream to the remote end — unless the reply
//	            grants a pool slot (shared-pool mode) or a direct link,
//	            which carry it instead.
//	PortListen: ListenRequest → ListenReply; the connection stays open for
//	            as long as the listener lives. For every connection that
//	            arrives the proxy opens a connection to the application's
//	            AppPort and writes an Incoming frame before the stream.
//
// Request frames are a 4-byte little-endian length (at most MaxFrame) and
// a JSON body. Every decoder here takes peer-written bytes: it validates
// and never panics (fuzzed). Errors carry errcode's stable codes.
package appproto

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/ntstack/ntstack/internal/wire/errcode"
)

// Version is the protocol version; a mismatch is refused with CodeVersion.
// Version 2 added the shared buffer pool, version 3 the early direct
// grant (DialRequest.Early, DialReply.Pending) and the memory link's
// doorbell pipe.
const Version = 3

// LinkHeartbeatTimeout is the heartbeat timeout of an application's memory
// link, at both ends. Its peer's death is known at once from the attach
// socket and the link file's locks; a short timeout would only declare a
// busy (not dead) process gone on a loaded machine.
const LinkHeartbeatTimeout = 10 * time.Second

// Service ports of the proxy's end of an application's memory link.
const (
	PortDial   = 1
	PortListen = 2
)

// PortContinue is the port of the application's end of its memory link
// on which the proxy opens a connection carrying on one of its direct
// connections (DialRequest.Continue), with an Incoming frame naming the
// direct link first.
const PortContinue = 3

// The Hello/Welcome datagrams on the Unix socket:
//
//	Hello   (app → proxy): magic u32 | version u16 | name length u16 | name
//	Welcome (proxy → app): magic u32 | version u16 | code u16 | app id u64 |
//	                       window u32 | pool slots u32 | pool ring u32 |
//	                       message length u16 | message
//	                       (+ when code is OK the link's descriptor, the
//	                       read end of its doorbell pipe (shm.Bell), then
//	                       the pool's when pool slots is not 0)
const (
	Magic = 0x5041_544e // "NTAP" little-endian

	offMagic   = 0
	offVersion = 4
	offHelloN  = 6
	helloFixed = 8
	offCode    = 6
	offAppID   = 8
	offWindow  = 16
	offSlots   = 20
	offRing    = 24
	offMsgN    = 28
	welcFixed  = 30

	MaxName     = 64
	MaxMessage  = 1024
	MaxDatagram = welcFixed + MaxMessage
	// MaxFrame bounds a request frame's JSON body.
	MaxFrame = 4096
)

var le = binary.LittleEndian

// Hello opens an attachment.
type Hello struct {
	Version uint16
	Name    string // the application's name, for status
}

// Encode returns the datagram.
func (h Hello) Encode() []byte {
	name := h.Name
	if len(name) > MaxName {
		name = name[:MaxName]
	}
	b := make([]byte, helloFixed+len(name))
	le.PutUint32(b[offMagic:], Magic)
	le.PutUint16(b[offVersion:], h.Version)
	le.PutUint16(b[offHelloN:], uint16(len(name)))
	copy(b[helloFixed:], name)
	return b
}

// DecodeHello parses a Hello datagram.
func DecodeHello(b []byte) (Hello, error) {
	if len(b) < helloFixed {
		return Hello{}, fmt.Errorf("hello: %d bytes, want at least %d", len(b), helloFixed)
	}
	if m := le.Uint32(b[offMagic:]); m != Magic {
		return Hello{}, fmt.Errorf("hello: magic %#x is not ntstack's", m)
	}
	n := int(le.Uint16(b[offHelloN:]))
	if n > MaxName || helloFixed+n != len(b) {
		return Hello{}, fmt.Errorf("hello: name length %d in a %d-byte datagram", n, len(b))
	}
	return Hello{Version: le.Uint16(b[offVersion:]), Name: string(b[helloFixed:])}, nil
}

// Welcome answers a Hello.
type Welcome struct {
	Version uint16
	Code    errcode.Code
	AppID   uint64
	Window  uint32 // each side's window of the memory link
	// PoolSlots and PoolRing are the shared buffer pool's geometry (0
	// slots: no pool, shared-pool mode is off).
	PoolSlots, PoolRing uint32
	Message             string // why, when Code is not OK
}

// Encode returns the datagram.
func (w Welcome) Encode() []byte {
	msg := w.Message
	if len(msg) > MaxMessage {
		msg = msg[:MaxMessage]
	}
	b := make([]byte, welcFixed+len(msg))
	le.PutUint32(b[offMagic:], Magic)
	le.PutUint16(b[offVersion:], w.Version)
	le.PutUint16(b[offCode:], uint16(w.Code))
	le.PutUint64(b[offAppID:], w.AppID)
	le.PutUint32(b[offWindow:], w.Window)
	le.PutUint32(b[offSlots:], w.PoolSlots)
	le.PutUint32(b[offRing:], w.PoolRing)
	le.PutUint16(b[offMsgN:], uint16(len(msg)))
	copy(b[welcFixed:], msg)
	return b
}

// DecodeWelcome parses a Welcome datagram.
func DecodeWelcome(b []byte) (Welcome, error) {
	if len(b) < welcFixed {
		return Welcome{}, fmt.Errorf("welcome: %d bytes, want at least %d", len(b), welcFixed)
	}
	if m := le.Uint32(b[offMagic:]); m != Magic {
		return Welcome{}, fmt.Errorf("welcome: magic %#x is not ntstack's", m)
	}
	n := int(le.Uint16(b[offMsgN:]))
	if n > MaxMessage || welcFixed+n != len(b) {
		return Welcome{}, fmt.Errorf("welcome: message length %d in a %d-byte datagram", n, len(b))
	}
	return Welcome{
		Version:   le.Uint16(b[offVersion:]),
		Code:      errcode.Code(le.Uint16(b[offCode:])),
		AppID:     le.Uint64(b[offAppID:]),
		Window:    le.Uint32(b[offWindow:]),
		PoolSlots: le.Uint32(b[offSlots:]),
		PoolRing:  le.Uint32(b[offRing:]),
		Message:   string(b[welcFixed:]),
	}, nil
}

// DialRequest asks the proxy to connect to Target:Port. With Direct the
// proxies grant the two applications a window slice of their own (a
// dedicated link) and step off the data path: the reply names the slice,
// and the request's connection stays open as the lease on it.
type DialRequest struct {
	Target   string `json:"target"`
	Port     int    `json:"port"`
	Priority int    `json:"priority"`
	Direct   bool   `json:"direct,omitempty"`
	// Early, with Direct, asks for the slice as soon as this proxy has
	// granted it: a first reply with Pending set names it, so that the
	// application attaches its end while the proxies bring in the far
	// one, and the verdict follows as a second reply.
	Early bool `json:"early,omitempty"`
	// Pool asks for shared-pool mode: the connection's bytes go through a
	// slot of the application's pool (the reply's Pool), not the memory
	// link. ntproxy settles for proxy mode, and says so in the reply's
	// Reason, when no slot is free or the connection stays on this host.
	Pool bool `json:"pool,omitempty"`
	// Transports restricts and orders the paths ("ntb", "rdma", "tcp").
	Transports []string `json:"transports,omitempty"`
	// Continue names a direct link of the application's whose connection
	// goes on through the proxies while the link is down: the far proxy
	// hands the connection to the application at the link's other end
	// with Incoming.Continue, not to its listener's Accept.
	Continue string `json:"continue,omitempty"`
	// Reuse, with Direct, names a live direct link of the application's
	// (one whose lease it holds) to the same listener: the connection is
	// stream Stream of that link, not a link of its own. Both proxies
	// still authorize the dial and hold its lease; no quota is charged
	// (the link's lease holds the link's).
	Reuse  string `json:"reuse,omitempty"`
	Stream int    `json:"stream,omitempty"`
}

// DirectLink is a window slice granted for one direct connection: in the
// emulated fabric, a link file Name under Dir with Window bytes per side.
// The listening application attaches side 1, listens on DirectPort and
// then writes DirectReady; the dialing one attaches side 0 (on a Pending
// reply, before the far side may have) and dials it. A dial that arrives
// before the far side listens is refused, and dialed again once the
// verdict is OK: the far side wrote DirectReady before that.
//
// A link carries more connections than the one that opened it (stream
// 0): stream k > 0 is a later connection between the same two
// applications on the live link (DialRequest.Reuse). Nobody attaches
// anything for it: the listening application listens on
// StreamPort(k) of the link it holds, writes DirectReady, and the dialing
// one dials that port once the verdict is OK.
type DirectLink struct {
	Name   string `json:"name"`
	Dir    string `json:"dir"`
	Window int    `json:"window"`
	Stream int    `json:"stream,omitempty"`
}

// DirectPort is the port a direct link's first connection uses.
const DirectPort = 1

// MaxStream is the highest stream number of a direct link.
const MaxStream = 65535 - DirectPort

// StreamPort is the port stream k of a direct link uses (0 < k <=
// MaxStream; stream 0 uses DirectPort).
func StreamPort(k int) int { return DirectPort + k }

// StreamName names stream k of direct link name: the link's own name for
// stream 0, which opened it. Leases, status and DialRequest.Continue name
// a connection so.
func StreamName(name string, k int) string {
	if k == 0 {
		return name
	}
	return name + "~" + strconv.Itoa(k)
}

// DirectReady is the byte a listening application writes on the Incoming
// connection once it listens on its direct link.
const DirectReady = 'R'

// The bytes ntproxy writes on a direct connection's lease when the NTB
// link under the direct link goes down and comes back: a direct link is
// a slice of that link's window, so it fails and returns with it.
const (
	LeaseLinkDown = 'D'
	LeaseLinkUp   = 'U'
)

// PoolGrant names the slot of the application's pool a shared-pool
// connection uses.
type PoolGrant struct {
	Slot int `json:"slot"`
}

// DialReply answers a DialRequest. On OK the connection is established.
//
// Between two proxies (the answer to a RackOpen) Window is the answering
// leg's receive buffer: the opener never has more unacknowledged bytes
// than that in flight, and Frame the largest data payload the answering
// leg takes in one frame (0: 64 KiB, what proxies took before they said).
// RackOpen.Window and RackOpen.Frame say the same the other way.
type DialReply struct {
	Code   errcode.Code `json:"code"`
	Error  string       `json:"error,omitempty"`
	Local  string       `json:"local,omitempty"`
	Remote string       `json:"remote,omitempty"`
	Path   string       `json:"path,omitempty"`
	Reason string       `json:"reason,omitempty"`
	Direct *DirectLink  `json:"direct,omitempty"`
	// Pending: the first of two replies to an Early direct dial; Direct
	// is granted and the far side is being brought in. The second reply
	// is the verdict (OK, or the failure: the application then drops
	// its end of the link).
	Pending bool       `json:"pending,omitempty"`
	Pool    *PoolGrant `json:"pool,omitempty"`
	RxSeq   uint64     `json:"rx_seq,omitempty"` // answer to a resume
	Window  int        `json:"window,omitempty"`
	Frame   int        `json:"frame,omitempty"`
}

// ListenRequest asks the proxy to accept connections to Port (0: any free
// port) and hand each to the application's AppPort on the memory link.
type ListenRequest struct {
	Port    int `json:"port"`
	AppPort int `json:"app_port"`
	Backlog int `json:"backlog"`
	// Pool: hand connections from rack peers over in shared-pool mode
	// (same-host ones, and any when no slot is free, in proxy mode).
	Pool bool `json:"pool,omitempty"`
}

// ListenReply answers a ListenRequest with the port listened on.
type ListenReply struct {
	Code  errcode.Code `json:"code"`
	Error string       `json:"error,omitempty"`
	Port  int          `json:"port,omitempty"`
}

// Incoming introduces an accepted connection to the application.
type Incoming struct {
	Local  string      `json:"local"`
	Remote string      `json:"remote"`
	Path   string      `json:"path"`
	Reason string      `json:"reason"`
	Direct *DirectLink `json:"direct,omitempty"`
	Pool   *PoolGrant  `json:"pool,omitempty"`
	// Continue: the connection carries on the direct connection of this
	// link's name (DialRequest.Continue).
	Continue string `json:"continue,omitempty"`
}

// WriteFrame writes v as one frame.
func WriteFrame(w io.Writer, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode frame: %w", err)
	}
	if len(body) > MaxFrame {
		return fmt.Errorf("encode frame: %d bytes, limit %d", len(body), MaxFrame)
	}
	b := make([]byte, 4+len(body))
	le.PutUint32(b, uint32(len(body)))
	copy(b[4:], body)
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("write frame: %w", err)
	}
	return nil
}

// ErrFrame is wrapped by every error about a malformed frame.
var ErrFrame = errors.New("malformed frame")

// ReadFrame reads one frame into v (unknown fields are an error).
func ReadFrame(r io.Reader, v any) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return fmt.Errorf("read frame: %w", err)
	}
	n := le.Uint32(hdr[:])
	if n == 0 || n > MaxFrame {
		return fmt.Errorf("read frame: %w: length %d outside 1..%d", ErrFrame, n, MaxFrame)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return fmt.Errorf("read frame: %w", err)
	}
	return DecodeFrame(body, v)
}

// DecodeFrame decodes a frame's body into v.
func DecodeFrame(body []byte, v any) error {
	if err := strictUnmarshal(body, v); err != nil {
		return fmt.Errorf("decode frame: %w: %v", ErrFrame, err)
	}
	return nil
}

// RackOpen is the first frame of a connection between two hosts' proxies
// over an NTB link: who is connecting, to which port. The listening proxy
// answers with a DialReply once the application there has the connection,
// or with the code that says why not.
//
// Every proxied connection between two proxies is a leg (internal/daemon/proxy):
// Token names it at both ends. A RackOpen with Resume set instead moves an
// existing leg (From, Resume) onto this connection — after its transport
// failed, or back to the NTB link — and RxSeq says how many of its bytes
// the sender has received; the answer's RxSeq says the same the other way.
//
// Secret is the leg's resume secret: random bytes the dialing proxy picks
// when it opens the leg, over a channel authenticated as its host, and
// presents again with every Resume. The token only names the leg; the
// secret, over a channel authenticated as the same host, moves it.
type RackOpen struct {
	From   string `json:"from"`
	Port   int    `json:"port"`
	Direct string `json:"direct,omitempty"` // the direct link's name
	Token  uint64 `json:"token,omitempty"`
	Resume uint64 `json:"resume,omitempty"`
	RxSeq  uint64 `json:"rx_seq,omitempty"`
	Window int    `json:"window,omitempty"` // the opener's receive buffer (see DialReply)
	Frame  int    `json:"frame,omitempty"`  // the opener's largest data payload (see DialReply)
	Secret []byte `json:"secret,omitempty"`

	// DirectWindow is the direct link's window per side, which the opener
	// chose (0: the far side's proxy.direct_window).
	DirectWindow int `json:"direct_window,omitempty"`

	// Continue: a proxied connection carrying on this direct link's
	// connection (DialRequest.Continue).
	Continue string `json:"continue,omitempty"`

	// Stream, with Direct: a later connection on that live link
	// (DialRequest.Reuse), not a new link.
	Stream int `json:"stream,omitempty"`
}
