// Package rdma is ntstack's off-rack transport: connections to hosts that
// are not on the NTB fabric, over RDMA where the hosts have it and over
// TCP where they do not. Both providers give the same thing, a net.Conn
// byte stream (Conn adds CloseWrite), so the proxy moves a connection
// between them, and between them and the NTB path, without caring which.
//
//	Provider  Available      Dial / Listen          data path
//	verbs     -tags verbs,   TCP bootstrap, then    RDMA write-with-immediate into the
//	          a device,      an RC queue pair       peer's registered ring (ring.go),
//	          active port                           credits back the same way
//	tcp       always         TCP                    records on the stream (record.go)
//
// Select(NewVerbs(cfg), NewTCP(cfg)) picks the first that works; a
// provider that cannot says why with an error matching ErrNotSupported.
// The verbs provider is cgo around libibverbs (libibverbs-dev) and is only
// compiled with the verbs build tag; default builds stay pure Go.
//
// Framing: both providers carry records with one 8-byte header (record.go).
// The verbs receiver ring mirrors the NTB ring: the sender writes records
// into the receiver's memory, the receiver polls only its own, and the
// receiver's consumer position comes back as a credit so the sender never
// overruns it. Connection setup is a hello over TCP (hello.go), which
// stays open beside a verbs connection to carry its goodbye. With
// Config.Auth that bootstrap socket runs TLS 1.3, both ends proving their
// host key before any hello (auth.go); Conn.Peer names the host proved.
//
// Semantics, identical for both providers and checked by nettest.TestConn
// in the unit tier: Read returns io.EOF after the peer's CloseWrite or
// Close and everything it wrote before; deadlines wake blocked calls with
// a *net.OpError whose Timeout is true and which matches
// os.ErrDeadlineExceeded; Close wakes blocked calls with net.ErrClosed;
// Write after CloseWrite, or to a peer that closed, fails with EPIPE; a
// peer that vanished without a goodbye shows as ECONNRESET.
//
// Concurrency: a connection serves one Read and one Write at a time
// (further callers queue), and deadlines, CloseWrite and Close from any
// goroutine. A verbs connection runs two goroutines (runPoller, which
// drains its completion queue a batch per cgo call, and runSide, which
// waits for the peer's goodbye); both end in Close.
//
// Lifetime pitfalls:
//   - Close a verbs connection: it holds a queue pair, registered rings and
//     a reference to the device, and Close may wait up to Config.Linger
//     for written data to reach the peer (like SO_LINGER), so call it
//     from a goroutine that may block that long.
//   - The verbs device opens at the first Dial or Listen and closes when
//     the provider (Verbs.Close) and its last connection are closed.
//   - Both ends of a verbs connection must use the same Config.RingSize.
//   - Write returns once the data is in the ring, before the peer reads it;
//     Close then delivers it. A Write cut short by a deadline reports
//     exactly the bytes that will arrive.
package rdma
