// Package rdmaguest holds the tests that run inside the VM tier's RDMA
// guests (see package vm, TestRDMA): two QEMU guests with the generic
// Debian kernel, Soft-RoCE (rdma_rxe) on an e1000 NIC each, joined by a
// QEMU socket netdev. Its test binary is built with `go test -c -tags
// verbs` and cgo, and runs against libibverbs and the rxe provider copied
// into the initramfs. On a host the tests skip: they need the guests'
// kernel command line (and the verbs tag).
//
// This file holds what the guests and the host harness agree on.
//
// Concurrency and lifetime: one guest runs the server, the other the
// client; they meet only through the network, the server's listener first
// (the client retries its dial until the server is up).
package rdmaguest

// Kernel command line parameters, "ntvm.<name>=<value>" (read from
// /proc/cmdline; /init's setup script reads ntvm.ip too).
const (
	ParamIP   = "ntvm.ip"   // this guest's address/prefix on eth0, e.g. 10.11.0.1/24
	ParamRole = "ntvm.role" // "server" or "client"
	ParamPeer = "ntvm.peer" // the client's target, host:port of the server's listener
	ParamMsgs = "ntvm.msgs" // messages the client sends and checks
)

// Port is the server's TCP bootstrap port.
const Port = 18515
