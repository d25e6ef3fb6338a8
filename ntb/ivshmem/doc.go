// Package ivshmem is ntstack's backend on QEMU's ivshmem-doorbell device
// (QEMU docs/specs/ivshmem-spec.rst): the ntb.Device of NewDevice (BAR2
// split into a header, a presence table, two register blocks and the two
// windows; see device.go), over a Port — PCIPort, the PCI device through
// vfio inside a guest, or Client, the host-side end of the peer protocol —
// and the project's own ivshmem server, which the VM test tier uses to join
// guests through one shared-memory window and eventfd doorbells. The server
// hands out peer ids, the shared-memory fd and one eventfd per peer and
// vector.
//
// Protocol. A Unix stream socket; the connection is one-way. Every message
// from server to client is one int64, little endian, with at most one fd
// attached (SCM_RIGHTS). Clients send nothing; a client that sends a byte
// is disconnected. With N vectors, a new client C sees:
//
//	server -> C                      fd
//	0            protocol version    -
//	id(C)        C's own peer id     -
//	-1           shared memory       memfd or /dev/shm file
//	id(P) x N    for each peer P     P's eventfd for vector 0..N-1, in order
//	id(C) x N    C itself, last      C's eventfd for vector 0..N-1, in order
//	...then, for as long as C stays connected:
//	id(Q) x N    peer Q connected    Q's eventfds, as above
//	id(Q)        peer Q disconnected -
//
// and every client already connected receives "id(C) x N" with C's
// eventfds. Peer ids are 0..65535 (the doorbell register gives them 16
// bits), allocated lowest-free. To ring peer P's vector v, write the 8-byte
// integer 1 in native byte order to P's vector-v eventfd; P's owner reads
// its own eventfd to consume the interrupt.
//
// Concurrency. All methods of Server and Client are safe for concurrent
// use, except that at most one goroutine may Wait on a given vector of a
// Client at a time. The server sends a new client's handshake and the
// announcements to the others under one lock, so every client sees peers
// connect and disconnect in one global order.
//
// Lifetime. The server owns the shared-memory fd and every peer's eventfds
// and closes a peer's eventfds when it disconnects; the shared-memory file
// under /dev/shm (if one was named) is left in place. QEMU sets O_NONBLOCK
// on the eventfds it receives, and that flag is shared with the server's
// copies (same open file description): nothing here ever blocks reading an
// eventfd it does not own. A client keeps working (Ring, Wait, Mem) after
// the server goes away, as the spec allows, but hears of no more peers.
// Mem's slice is valid until the Client is closed.
package ivshmem
