// Package guest holds the tests that run inside the VM tier's QEMU guests
// (see package vm, one directory up). Its test binary, built with
// `go test -c` and CGO_ENABLED=0, is appended to the guests' initramfs; the
// guest's /init runs the tests the kernel command line names, as root, with
// VFIO loaded and an emulated IOMMU, against QEMU's ivshmem-doorbell device.
// On a host the tests skip: they need the guest's device and command line.
//
// This file holds what the guests and the host harness agree on: the
// kernel command line parameters and where in the shared memory (the
// device's BAR2, the server's file on the host) each test leaves the words
// the host checks after the guests have exited.
//
// Concurrency and lifetime: each guest runs one test binary at a time; the
// tests of two guests on one ivshmem server meet only through the shared
// memory and the doorbells, and every handshake word is written by exactly
// one side (the owner named in the layout below).
package guest

// Kernel command line parameters, "ntvm.<name>=<value>". The kernel passes
// dotted parameters to no one, so /init and the tests read /proc/cmdline.
const (
	ParamRun     = "ntvm.run"     // comma-separated bin:TestName to run, in order (/init)
	ParamShm     = "ntvm.shm"     // size of the shared memory in bytes
	ParamVectors = "ntvm.vectors" // doorbell vectors per peer
	ParamRounds  = "ntvm.rounds"  // doorbell round trips (TestDoorbell)
	ParamMsgs    = "ntvm.msgs"    // messages per direction (TestStack)
)

// Console markers. /init prints one result line per test it runs and an
// end line; the host harness waits for them.
const (
	MarkerResult = "NTVM-RESULT" // NTVM-RESULT <bin>:<Test> PASS|FAIL rc=<n>
	MarkerEnd    = "NTVM-END"    // /init is about to power off
	MarkerMetric = "NTVM-METRIC" // NTVM-METRIC <scenario> <key>=<value> ...
)

// Layout of the shared memory for TestProbe and TestDoorbell. Peer ids are
// 0 and 1 (the server hands out the lowest free id, and each scenario has
// its own server). Words are 64-bit little-endian, written atomically by
// their one owner; every word sits in its own 64-byte line.
//
//	offset   size      owner    contents
//	0x0000   8         peer 0   ReadyMagic once its MSI-X vectors are routed
//	0x0040   8         peer 1   ReadyMagic, likewise
//	0x0080   8         peer 0   round trips completed (written at the end)
//	0x00c0   8         peer 1   round trips answered (written at the end)
//	0x0100   32        peer 0   ProbeMarker (TestProbe, through BAR2)
//	0x1000   8+Payload peer 0   ping: sequence number, then the payload
//	0x2000   8+Payload peer 1   pong: sequence number, then the payload
//
// A ping's payload is written before its sequence number; the doorbell is
// rung after both. 0x3000 bytes in all: the scenarios' 1 MiB holds it.
const (
	lineSize       = 0x40
	OffReady       = 0x0000 // + peer*lineSize
	OffDone        = 0x0080 // + peer*lineSize
	OffProbeMarker = 0x0100
	OffPing        = 0x1000
	OffPong        = 0x2000
	PayloadSize    = 256
	LayoutSize     = 0x3000

	ReadyMagic  = 0x4e54564d52454459 // "NTVMREDY"
	ProbeMarker = "ntstack vm probe wrote this"
)

// OffReadyOf is where peer's ready word lives.
func OffReadyOf(peer int) int { return OffReady + peer*lineSize }

// OffDoneOf is where peer's completion count lives.
func OffDoneOf(peer int) int { return OffDone + peer*lineSize }
