// Package errcode holds the stable numeric error codes that cross a process
// boundary: app ↔ ntproxy (appproto) and daemon ↔ daemon or CLI (ctlapi).
// A client in another process, or another build, tells "denied by the ACL"
// from "peer down" by the code, without parsing text.
//
// The package is a leaf: it imports only fmt, so socklike can decode an
// ntproxy answer without linking the daemons' HTTP or configuration code.
// Codes are never renumbered; new ones are appended.
package errcode

import "fmt"

// Code is a stable error code crossing a process boundary.
type Code uint16

// Error codes. The numbers are part of the protocol.
const (
	OK             Code = 0
	CodeBadRequest Code = 1  // malformed or invalid request
	CodeUnknown    Code = 2  // unknown host or address
	CodeDenied     Code = 3  // the access-control list denies it
	CodeNoPath     Code = 4  // no usable path to the host (peer or link down)
	CodePortInUse  Code = 5  // the port is already listened on
	CodeRefused    Code = 6  // nobody listens on the port
	CodeInternal   Code = 7  // a daemon-side failure
	CodeVersion    Code = 8  // protocol version mismatch
	CodeQuota      Code = 9  // a quota is exhausted
	CodeUnavail    Code = 10 // the daemon asked for is not running
	CodeTimeout    Code = 11 // the operation timed out
	CodeNoDirect   Code = 12 // direct mode asked for a host reachable only off the NTB fabric
)

var codeNames = map[Code]string{
	OK: "ok", CodeBadRequest: "bad request", CodeUnknown: "unknown host",
	CodeDenied: "denied by access control", CodeNoPath: "no path to host",
	CodePortInUse: "port in use", CodeRefused: "connection refused",
	CodeInternal: "internal error", CodeVersion: "version mismatch",
	CodeQuota: "quota exceeded", CodeUnavail: "daemon unavailable",
	CodeTimeout: "timed out", CodeNoDirect: "no direct path",
}

func (c Code) String() string {
	if s, ok := codeNames[c]; ok {
		return s
	}
	return fmt.Sprintf("code %d", uint16(c))
}
