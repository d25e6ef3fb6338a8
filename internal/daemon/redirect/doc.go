// Package redirect sends an unmodified application's TCP connects to
// ntproxy's gateway without reconfiguring the application: eBPF programs
// attached to a cgroup at the cgroup/connect4 and cgroup/connect6 hooks
// rewrite the destination of every connect() whose address and port match
// a rule, before the kernel starts the handshake. An application in the
// cgroup that dials the remote service (10.77.0.2:6379) reaches the gateway
// listening on 127.0.0.1:16379 instead, and the gateway carries the
// connection over the rack fabric.
//
// Attach loads the programs and attaches them to a cgroup2 directory; Set
// and Delete edit the rule table; Count and Counts report how many connects
// each rule redirected. Only stream sockets (SOCK_STREAM, i.e. TCP) are
// redirected; UDP connects pass untouched. The programs never refuse a
// connect: they rewrite it or leave it alone.
//
// IPv4 rules apply to AF_INET sockets (connect4) and also to dual-stack
// AF_INET6 sockets connecting to an IPv4-mapped address ::ffff:a.b.c.d
// (connect6), because both programs look rules up by the 16-byte IPv6 form
// of the destination. IPv6 rules apply in connect6. A rule's target has the
// family of its source; zoned (link-local) addresses are refused, since
// the hook cannot see the scope.
//
// # Rule map
//
// One BPF_MAP_TYPE_HASH of at most MaxRules entries, shared by both
// programs; Set fails once it is full. Set writes whole entries, Delete
// removes them, the programs read keys and targets and only ever write the
// count, with an atomic add.
//
//	key, 20 bytes (keySize):
//	0                            12            16       18       20
//	+----------------------------+-------------+--------+--------+
//	| 00 .. 00 ff ff  (IPv4) or  | a.b.c.d     | port   | 0 0    |
//	| IPv6 address bytes 0..11   | bytes 12..15| BE u16 | pad    |
//	+----------------------------+-------------+--------+--------+
//	  the destination the application dialled, network byte order
//
//	value, 32 bytes (valueSize):
//	0                                          16       18                24                 32
//	+------------------------------------------+--------+-----------------+------------------+
//	| target address, 16-byte form as in key   | port   | 0 (pad)         | count            |
//	|                                          | BE u16 |                 | u64, host order  |
//	+------------------------------------------+--------+-----------------+------------------+
//	  written by Set (count 0)                                            added to by the programs
//
// The kernel hands the programs bpf_sock_addr.user_ip4, user_ip6 and
// user_port in network byte order, user_port in the low 16 bits (the first
// two bytes in memory) of a u32. The programs copy these as memory, word by
// word, so keys and targets are compared and written without byte swaps;
// only the count, which the CPU adds to, is in host order. The value is 32
// bytes so the count is 8-byte aligned, as atomic adds require.
//
// # Concurrency
//
// Set, Delete, Count and Counts are safe to call concurrently with each
// other and with connects in progress; each is one or a few bpf(2) calls on
// the map. Set replaces an existing rule whole, which resets its count to
// zero. After Close they fail with an error matching os.ErrClosed.
//
// # Lifetime
//
// The programs are attached with bpf links (BPF_LINK_CREATE), not pinned:
// they stay attached while the Redirect's file descriptors are open. Close
// detaches them and frees the programs and the map; a process that crashes
// loses its descriptors and so its links, and the cgroup stops redirecting.
// On kernels older than 5.7, which lack cgroup bpf links, cilium/ebpf falls
// back to BPF_PROG_ATTACH with BPF_F_ALLOW_MULTI (or ALLOW_OVERRIDE); such
// an attachment is still removed by Close but outlives a crashed process
// until its cgroup is removed. The connect hooks themselves need 4.17. Other programs attached to the same cgroup keep running: with
// multi-attach each program sees the address the previous one wrote.
//
// A redirected socket's getpeername reports the gateway's address, not the
// address the application dialled. The gateway itself must not run in a
// cgroup whose rules match the addresses it dials, or it would dial itself.
//
// # Errors
//
// Where the kernel lacks the hooks, BPF is not permitted (no CAP_BPF and
// CAP_NET_ADMIN, or a seccomp or LSM policy refusing bpf(2)) or the path is
// not in a cgroup2 file system, Attach returns a *NotSupportedError, which
// matches ErrNotSupported and unwraps to the cause (ebpf.ErrNotSupported,
// os.ErrPermission). On systems other than Linux every call returns one.
package redirect

import (
	"github.com/ntstack/ntstack/internal/prim/errs"
)

// ErrNotSupported is matched (errors.Is) by every error that says the
// system cannot redirect connects: not Linux, no cgroup2, no cgroup sock_addr
// hooks or bpf links, no permission to load BPF programs.
var ErrNotSupported = errs.ErrNotSupported

// NotSupportedError reports what is missing. It matches ErrNotSupported
// and unwraps to the underlying cause, if any.
type NotSupportedError struct {
	What string // what is missing, e.g. "cgroup2 at /sys/fs/cgroup"
	Err  error  // the cause, or nil
}

func (e *NotSupportedError) Error() string {
	if e.Err == nil {
		return e.What + ": not supported"
	}
	return e.What + ": not supported: " + e.Err.Error()
}

// Is reports whether target is ErrNotSupported.
func (e *NotSupportedError) Is(target error) bool { return target == ErrNotSupported }

// Unwrap returns the cause.
func (e *NotSupportedError) Unwrap() error { return e.Err }
