//go:build linux

package vm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/ntstack/ntstack/test/vm/guest"
)

// Scenario sizes. Every guest under TCG boots in ~2 s; the timeouts bound
// a hung guest, not a slow one. A test binary in a guest times out after
// 90 s (see initScript) and dumps its goroutines to the console, before
// guestTimeout stops the QEMU.
const (
	probeShm       = 1 << 20
	probeVectors   = 2
	doorbellRounds = 1000
	stackShm       = 4 << 20 // QEMU wants a power of two; the Device's windows get 2 MiB - 8 KiB each
	stackMsgs      = 10000
	guestTimeout   = 120 * time.Second
)

// TestProbe: one guest walks the VFIO path on its ivshmem device.
//
// vfio's own TestRealDevice runs after the probe (which binds the device to
// vfio-pci); /init sets its NTSTACK_VFIO_DEVICE.
func TestProbe(t *testing.T) {
	l := getLab(t)
	srv := startServer(t, probeVectors, probeShm)
	boot(t, l, guestSpec{
		name:    "probe",
		servers: []*ivshmemServer{srv},
		run:     []string{"guest:TestProbe", "vfio:TestRealDevice"},
		params:  []string{fmt.Sprintf("shm=%d", probeShm), fmt.Sprintf("vectors=%d", probeVectors)},
		timeout: guestTimeout,
	})
	mem := srv.shm(t)
	if !bytes.HasPrefix(mem[guest.OffProbeMarker:], []byte(guest.ProbeMarker)) {
		t.Errorf("the server's shared memory lacks the marker the guest wrote through BAR2")
	}
	if got := binary.LittleEndian.Uint64(mem[guest.OffReadyOf(0):]); got != guest.ReadyMagic {
		t.Errorf("ready word %#x, want %#x written through the port's Mem", got, uint64(guest.ReadyMagic))
	}
}

// TestDoorbell: two guests play doorbell ping-pong with the payload in
// BAR2 checked every round.
func TestDoorbell(t *testing.T) {
	l := getLab(t)
	srv := startServer(t, 2, probeShm)
	spec := func(name string) guestSpec {
		return guestSpec{
			name:    name,
			servers: []*ivshmemServer{srv},
			run:     []string{"guest:TestDoorbell"},
			params:  []string{fmt.Sprintf("rounds=%d", doorbellRounds)},
			timeout: guestTimeout,
		}
	}
	boot(t, l, spec("a"), spec("b"))
	mem := srv.shm(t)
	for peer := range 2 {
		if got := binary.LittleEndian.Uint64(mem[guest.OffDoneOf(peer):]); got != doorbellRounds {
			t.Errorf("peer %d reports %d round trips in the shared memory, want %d", peer, got, doorbellRounds)
		}
	}
}

// TestStack: two guests, socklike over ivshmem.NewDevice over the PCI
// port; one echoes, the other streams stackMsgs messages of 1..1024 bytes
// and checks every echo byte for byte.
func TestStack(t *testing.T) {
	l := getLab(t)
	srv := startServer(t, 1, stackShm)
	spec := func(name string) guestSpec {
		return guestSpec{
			name:    name,
			servers: []*ivshmemServer{srv},
			run:     []string{"guest:TestStack"},
			params:  []string{fmt.Sprintf("msgs=%d", stackMsgs)},
			timeout: guestTimeout,
		}
	}
	boot(t, l, spec("a"), spec("b"))
}

// TestConn: nettest.TestConn in one guest with two ivshmem devices on one
// server, the two ends of the link opened through VFIO in one process.
func TestConn(t *testing.T) {
	l := getLab(t)
	srv := startServer(t, 1, stackShm)
	boot(t, l, guestSpec{
		name:    "conn",
		servers: []*ivshmemServer{srv, srv},
		run:     []string{"guest:TestConn"},
		timeout: guestTimeout,
	})
}
