// Package ctlapi is the local control API between a host's daemons and
// their command-line clients: ntproxy asks ntmon for routes, admissions and
// ports; `ntmon status` and ntmon's metrics read ntproxy's snapshot. Both
// APIs are HTTP with JSON bodies over Unix sockets under the host's state
// directory (config.MonitorSocket, config.AdminSocket).
//
// Errors carry a stable numeric Code, so that a client in another process
// (or another build) can tell "denied by the ACL" from "peer down" without
// parsing text. Codes are never renumbered; new ones are appended.
package ctlapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/ntstack/ntstack/internal/wire/errcode"
)

// Code is a stable error code crossing a process boundary (package
// errcode, which socklike shares without linking this package).
type Code = errcode.Code

// Error codes. The numbers are part of the protocol.
const (
	OK             = errcode.OK
	CodeBadRequest = errcode.CodeBadRequest
	CodeUnknown    = errcode.CodeUnknown
	CodeDenied     = errcode.CodeDenied
	CodeNoPath     = errcode.CodeNoPath
	CodePortInUse  = errcode.CodePortInUse
	CodeRefused    = errcode.CodeRefused
	CodeInternal   = errcode.CodeInternal
	CodeVersion    = errcode.CodeVersion
	CodeQuota      = errcode.CodeQuota
	CodeUnavail    = errcode.CodeUnavail
	CodeTimeout    = errcode.CodeTimeout
	CodeNoDirect   = errcode.CodeNoDirect
)

// Error is an error with a stable code. Its JSON form is the body of every
// failed API call.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"error"`
}

func (e *Error) Error() string {
	if e.Message == "" {
		return e.Code.String()
	}
	return e.Code.String() + ": " + e.Message
}

// Errorf makes an *Error.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// CodeOf returns err's code: OK for nil, CodeInternal for an error that
// carries none.
func CodeOf(err error) Code {
	if err == nil {
		return OK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return CodeInternal
}

// Paths of ntmon's API.
const (
	PathResolve  = "/v1/resolve"
	PathAdmit    = "/v1/admit"
	PathListen   = "/v1/listen"
	PathUnlisten = "/v1/unlisten"
	PathStatus   = "/v1/status"
	// PathSnapshot and PathFault are ntproxy's admin API.
	PathSnapshot = "/v1/snapshot"
	PathFault    = "/v1/fault"
)

// Path names, as reported for every connection.
const (
	PathSHM  = "shm"  // both ends on this host: shared memory, no NTB
	PathNTB  = "ntb"  // a rack peer over its NTB link
	PathRDMA = "rdma" // off the rack over RDMA
	PathTCP  = "tcp"  // off the rack over TCP, the last resort
)

// ResolveRequest asks how a local user may reach target:port.
type ResolveRequest struct {
	// UID is the user asking, honoured from a root caller only (ntproxy
	// relaying for an application): ntmon takes anyone else's from the
	// connection's SO_PEERCRED.
	UID    int    `json:"uid"`
	Target string `json:"target"` // host name or virtual address
	Port   int    `json:"port"`
	// Transports restricts and orders the paths this connection may take
	// ("ntb", "rdma", "tcp"; empty: the host's configured order).
	Transports []string `json:"transports,omitempty"`
}

// Route is how to reach a host, and why that way.
type Route struct {
	Host   string `json:"host"`   // the host that owns the target
	Path   string `json:"path"`   // PathSHM, PathNTB, ...
	Link   string `json:"link"`   // NTB link name, for PathNTB
	Addr   string `json:"addr"`   // the peer ntproxy's listener, for PathRDMA and PathTCP
	Reason string `json:"reason"` // why this path, in words
	// Hops are the transports the connection may use, in order (Path
	// among them): where it moves when its transport fails, and back.
	Hops []Hop `json:"hops,omitempty"`
}

// Hop is one transport to a peer: an NTB link (Addr names it) or the peer
// ntproxy's RDMA or TCP listener.
type Hop struct {
	Path string `json:"path"`
	Addr string `json:"addr"`
}

// AdmitRequest asks whether a connection from a rack peer may reach port.
type AdmitRequest struct {
	Peer string `json:"peer"`
	Port int    `json:"port"`
}

// ListenRequest reserves a port for a local user (0: allocate one), or
// releases one (PathUnlisten). UID and PID are the process asked for,
// honoured from a root caller only (ntproxy relaying for an application,
// whose identity it takes from SO_PEERCRED): ntmon answers anyone else as
// the connection's SO_PEERCRED identity, whatever the body says. A port
// below 1024 needs uid 0 or CAP_NET_BIND_SERVICE in that process.
type ListenRequest struct {
	UID  int `json:"uid"`
	PID  int `json:"pid"`
	Port int `json:"port"`
}

// ListenReply is the reserved port.
type ListenReply struct {
	Port int `json:"port"`
}

// Status is what `ntmon status` prints. A caller other than root gets
// its own user's part only: its reservations, applications, listeners and
// connections, the links without their partitions' traffic, no gateway.
type Status struct {
	Host    string `json:"host"`
	Version string `json:"version"`
	RDMA    string `json:"rdma"` // this host's RDMA listener, or "none: " and why
	// Security says how the channels to peers are authenticated, or
	// starts "WARNING: INSECURE" when they are not.
	Security  string        `json:"security"`
	Peers     []PeerStatus  `json:"peers"`
	Listening []ListenEntry `json:"listening"`
	Proxy     *Snapshot     `json:"proxy,omitempty"`
	ProxyErr  string        `json:"proxy_error,omitempty"`
	// Scope says whose part this is when it is not everything ("" for
	// root's view).
	Scope string `json:"scope,omitempty"`
}

// PeerStatus is one rack peer as ntmon sees it.
type PeerStatus struct {
	Host       string    `json:"host"`
	Control    string    `json:"control"`
	Up         bool      `json:"up"`
	Why        string    `json:"why"` // why it is up or down
	Version    int       `json:"version,omitempty"`
	Link       string    `json:"link,omitempty"`
	Window     int       `json:"window,omitempty"`     // the peer's advertised window
	Partitions int       `json:"partitions,omitempty"` // the peer's advertised partitions
	Caps       []string  `json:"caps,omitempty"`
	RDMA       string    `json:"rdma,omitempty"` // the peer ntproxy's RDMA listener, or "none: " and why
	LastSeen   time.Time `json:"last_seen"`
}

// ListenEntry is a reserved port.
type ListenEntry struct {
	Port int `json:"port"`
	UID  int `json:"uid"`
	PID  int `json:"pid"`
}

// Snapshot is ntproxy's live state.
type Snapshot struct {
	Host      string        `json:"host"`
	Links     []LinkStat    `json:"links"`
	Apps      []AppStat     `json:"apps"`
	Listeners []ListenStat  `json:"listeners"`
	Conns     []ConnStat    `json:"conns"`
	Gateway   []GatewayStat `json:"gateway,omitempty"`
	Trunks    []TrunkStat   `json:"trunks,omitempty"`
	// PathSwitches counts the transport changes of every leg since
	// ntproxy started (failovers and returns to the NTB).
	PathSwitches uint64 `json:"path_switches"`
}

// GatewayStat is one service of ntproxy's TCP gateway: a forward (local
// TCP port to a rack address) or an export (rack port to a local TCP
// server).
type GatewayStat struct {
	Kind      string `json:"kind"`           // "forward" or "export"
	Listen    string `json:"listen"`         // TCP address (forward) or ":port" (export)
	To        string `json:"to"`             // rack address (forward) or TCP server (export)
	Mode      string `json:"mode,omitempty"` // forward: "direct" or "proxy"
	Active    int64  `json:"active"`
	Total     int64  `json:"total"`     // connections accepted
	Failed    int64  `json:"failed"`    // ... whose other side could not be reached
	BytesIn   uint64 `json:"bytes_in"`  // from the TCP side onto the fabric
	BytesOut  uint64 `json:"bytes_out"` // from the fabric to the TCP side
	LastError string `json:"last_error,omitempty"`
	// Redirects counts connects the eBPF redirect sent to a forward.
	Redirects uint64 `json:"redirects,omitempty"`
}

// TrunkStat is one trunk of ntproxy's TCP gateway: the link it shares
// with the gateway of Peer for the connections its forwards carry there
// ("opened") or the peer's forwards carry here ("served").
type TrunkStat struct {
	Peer  string `json:"peer"`
	Link  string `json:"link,omitempty"`
	Role  string `json:"role"`  // "opened" or "served"
	State string `json:"state"` // "setting up", "up", "down" (its link is), "failed" or "ended"
	Ports []int  `json:"ports,omitempty"`
	Conns int    `json:"conns"` // carried connections open on it
	Error string `json:"error,omitempty"`
}

// LinkStat is one NTB link owned by ntproxy.
type LinkStat struct {
	Name       string          `json:"name"`
	Peer       string          `json:"peer"`
	State      string          `json:"state"` // "up" or "down"
	Window     int             `json:"window"`
	Partitions []PartitionStat `json:"partitions"`
}

// PartitionStat aggregates the connections placed on one partition.
type PartitionStat struct {
	Index   int    `json:"index"`
	Conns   int    `json:"conns"`
	BytesTX uint64 `json:"bytes_tx"`
	BytesRX uint64 `json:"bytes_rx"`
	MsgsTX  uint64 `json:"msgs_tx"`
	MsgsRX  uint64 `json:"msgs_rx"`
}

// AppStat is an attached application.
type AppStat struct {
	ID     uint64 `json:"id"`
	PID    int    `json:"pid"`
	UID    int    `json:"uid"`
	Name   string `json:"name"`
	Conns  int    `json:"conns"`
	Memory int64  `json:"memory"` // bytes of shared memory granted
}

// ListenStat is an application's listener.
type ListenStat struct {
	App     uint64 `json:"app"`
	Port    int    `json:"port"`
	Backlog int    `json:"backlog"`
}

// ConnStat is one proxied connection.
type ConnStat struct {
	ID         uint64 `json:"id"`
	App        uint64 `json:"app"`
	Local      string `json:"local"`
	Remote     string `json:"remote"`
	Dir        string `json:"dir"` // "out" (dialed) or "in" (accepted)
	Path       string `json:"path"`
	Mode       string `json:"mode,omitempty"` // "proxy", "pool" (shared-pool) or "direct"
	Reason     string `json:"reason"`
	Link       string `json:"link,omitempty"`
	Partition  int    `json:"partition"`
	BytesTX    uint64 `json:"bytes_tx"`
	BytesRX    uint64 `json:"bytes_rx"`
	MsgsTX     uint64 `json:"msgs_tx"`
	MsgsRX     uint64 `json:"msgs_rx"`
	QueueDepth int    `json:"queue_depth"`        // bytes buffered in the proxy
	Drops      uint64 `json:"drops"`              // always 0: nothing is dropped
	Switches   int    `json:"switches,omitempty"` // transport changes of its leg
	LastPause  string `json:"last_pause,omitempty"`
}

// FaultRequest injects a fault into one of ntproxy's emulated NTB links:
// Down pulls it (both ends see it down), !Down restores it.
type FaultRequest struct {
	Link string `json:"link"`
	Down bool   `json:"down"`
}

// Client calls one daemon's API over its Unix socket.
type Client struct {
	hc *http.Client
}

// NewClient returns a Client for the API served on the Unix socket path.
func NewClient(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		MaxIdleConnsPerHost: 4,
	}
	return &Client{hc: &http.Client{Transport: tr, Timeout: 5 * time.Second}}
}

// Call sends req (nil: GET) to path and decodes the reply into reply
// (nil: discard). A failed call returns an *Error; an unreachable daemon
// is CodeUnavail.
func (c *Client) Call(ctx context.Context, path string, req, reply any) error {
	method, body := http.MethodGet, io.Reader(nil)
	if req != nil {
		b, err := json.Marshal(req)
		if err != nil {
			return Errorf(CodeBadRequest, "encode %s: %v", path, err)
		}
		method, body = http.MethodPost, bytes.NewReader(b)
	}
	hr, err := http.NewRequestWithContext(ctx, method, "http://local"+path, body)
	if err != nil {
		return Errorf(CodeBadRequest, "%s: %v", path, err)
	}
	resp, err := c.hc.Do(hr)
	if err != nil {
		return Errorf(CodeUnavail, "%s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return Errorf(CodeUnavail, "%s: %v", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e Error
		if json.Unmarshal(b, &e) != nil || e.Code == OK {
			return Errorf(CodeInternal, "%s: HTTP %d", path, resp.StatusCode)
		}
		return &e
	}
	if reply == nil {
		return nil
	}
	if err := json.Unmarshal(b, reply); err != nil {
		return Errorf(CodeInternal, "decode %s: %v", path, err)
	}
	return nil
}

// Close releases idle connections.
func (c *Client) Close() { c.hc.CloseIdleConnections() }

// Reply writes v as JSON, or err as an *Error with a status code.
func Reply(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		e, ok := err.(*Error)
		if !ok {
			var target *Error
			if errors.As(err, &target) {
				e = target
			} else {
				e = &Error{Code: CodeInternal, Message: err.Error()}
			}
		}
		status := http.StatusBadRequest
		switch e.Code {
		case CodeDenied:
			status = http.StatusForbidden
		case CodeUnknown:
			status = http.StatusNotFound
		case CodePortInUse:
			status = http.StatusConflict
		case CodeInternal:
			status = http.StatusInternalServerError
		case CodeNoPath, CodeUnavail:
			status = http.StatusServiceUnavailable
		}
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(e)
		return
	}
	_ = json.NewEncoder(w).Encode(v)
}

// Decode reads a JSON request body of at most 64 KiB into v.
func Decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Errorf(CodeBadRequest, "decode %s: %v", r.URL.Path, err)
	}
	return nil
}
