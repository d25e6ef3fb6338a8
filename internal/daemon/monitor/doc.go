// Package monitor is ntmon, a host's control-plane daemon, as a library:
// cmd/ntmon only wires flags and signals to it, and tests run several
// Monitors in one process.
//
// A Monitor
//   - keeps a session with every rack peer's ntmon over TLS 1.3, both
//     ends proving their host key (package hostauth; who the peer is comes
//     from its certificate, and its HELLO must say the same), or over plain
//     TCP on a host configured auth.insecure (the peer
//     protocol in frame.go: a HELLO exchange carrying magic, protocol
//     version, capabilities, link metadata and the host's RDMA listener or
//     why it has none, then heartbeats), dialing
//     each configured peer with backoff and accepting peers that dial it;
//     one session per peer pair survives, the one dialed by the lexically
//     smaller host name;
//   - serves the local API (package ctlapi) over HTTP on a Unix socket in
//     the state directory: route resolution (shared memory, NTB, RDMA or
//     the TCP fallback, and why, with the hops a connection may fail over
//     between), admission of inbound connections against
//     the ACL, port reservations and status, each request answered for
//     its connection's SO_PEERCRED identity, never one its body names
//     (caller.go: root, ntproxy relaying, may name its applications');
//   - exports Prometheus metrics built, at each scrape, from ntproxy's
//     snapshot and the peer table.
//
// Concurrency: every exported method of Monitor is safe for concurrent
// use. A Monitor's goroutines (the peer acceptor, one dialer per peer, two
// per live session, the HTTP servers) all start in Start and all end
// before Close returns.
//
// Lifetime: New binds every listener (so a port or socket conflict is an
// error from New, and tests can read the bound addresses) but starts
// nothing; Start or Run starts it; Close stops it and is idempotent. A
// Monitor cannot be restarted after Close. New removes a stale socket file
// left by a dead ntmon but refuses to take over one a live ntmon serves.
// Port reservations live in memory only: a restarted ntmon starts with
// none, and ntproxy is expected to re-register its listeners.
package monitor
