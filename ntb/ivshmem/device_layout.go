package ivshmem

import "github.com/ntstack/ntstack/internal/prim/shmem"

// The Device backend lays one NTB link out in the ivshmem region (a guest's
// BAR2, a host Client's Mem). The region has no registers of its own beyond
// the doorbell, so the first 16 KiB emulate them:
//
//	offset          size   what                                   written by
//	0               4 KiB  header                                 whoever finds it zero
//	4 KiB           4 KiB  presence table, 128 slots x 32 bytes   slot i: the attachment with peer id i
//	8 KiB           4 KiB  registers of side 0                    the holder of side 1
//	12 KiB          4 KiB  registers of side 1                    the holder of side 0
//	16 KiB          W      inbound window of side 0               side 1 (its outbound window)
//	16 KiB + W      W      inbound window of side 1               side 0 (its outbound window)
//	16 KiB + 2W     rest   unused (less than 8 KiB)
//
// W = (region size - 16 KiB) / 2, rounded down to a multiple of 4 KiB, so
// both windows are page aligned and every end computes the same W from the
// same region. A 4 MiB region (QEMU wants a power of two) gives W =
// 2 MiB - 8 KiB; the smallest usable region, 24 KiB, gives W = 4 KiB.
//
// Header. Stamped by the first attachment that finds the magic zero (a new
// server's region is zero); every value is a function of the region size
// alone, so two attachments stamping at once write the same bytes, and the
// magic is stored last. Every attachment checks all of it and refuses a
// mismatch (ErrLayout):
//
//	off  size  field
//	  0     4  magic "NTBI"
//	  4     4  layout version
//	  8     8  region size in bytes
//	 16     8  window size W
//	 24     4  presence slots (128)
//
// Presence slot of peer id i, written only by the attachment whose Port
// has id i (the ivshmem server hands each connected peer a distinct id), and
// read by everyone. It exists because ivshmem, unlike an NTB port, has no
// notion of sides: it is how attachments agree on who holds which side
// without a lock or a compare-and-swap (see "Side claim" in device.go):
//
//	off  size  field
//	  0     8  generation: random, odd, new at every attach; 0 = detached
//	  8     8  heartbeat count, +1 every HeartbeatInterval
//	 16     4  state: 0 idle, 1+S claiming side S, 3+S holding side S
//	 20    12  reserved
//
// Registers of side S. Like a real NTB port's doorbell and scratchpad
// registers, every word is written by the holder P of the other side and
// only read by S ("poll local, write remote"):
//
//	off  size  field
//	  0     4  P's peer id + 1 (0: nobody holds the other side); whom S rings
//	  4     4  1 while P sleeps in WaitDoorbell: S must ring P's doorbell
//	  8     8  P's generation (must equal P's presence slot's)
//	 16     8  ack: the generation of S that P has accepted (link handshake)
//	 24    40  reserved
//	 64   256  doorbell counters, 64 x uint32: P adds one to bit i's counter to ring it
//	320   256  scratchpads, 64 x uint32
//
// Each 4 KiB block holds 576 bytes; the rest is reserved so that each side's
// registers sit on their own page, as they would behind a BAR.
const (
	devMagic   = 0x4942544e // "NTBI" little endian
	devVersion = 1
	devPage    = 4096

	devHdrMagic      = 0
	devHdrVersion    = 4
	devHdrRegionSize = 8
	devHdrWindowSize = 16
	devHdrSlots      = 24

	devOffPresence = devPage
	devSlotSize    = 32
	devSlots       = devPage / devSlotSize // 128 peer ids: 0..127
	devSlotGen     = 0
	devSlotBeat    = 8
	devSlotState   = 16

	devStateIdle  = 0
	devStateClaim = 1 // + side
	devStateHold  = 3 // + side

	devOffRegs        = 2 * devPage // + side*devPage
	devRegPeerID      = 0
	devRegPeerWaiting = 4
	devRegPeerGen     = 8
	devRegPeerAck     = 16
	devRegDoorbells   = 64
	devRegScratchpads = 320

	devDoorbellBits   = shmem.DoorbellBits
	devScratchpadRegs = 64

	devOffWindows = 4 * devPage
	devMinRegion  = devOffWindows + 2*devPage

	// devVector is the Port vector the backend rings and waits on; other
	// vectors are left alone.
	devVector = 0
)

func devSlotOffset(id int) int   { return devOffPresence + id*devSlotSize }
func devRegsOffset(side int) int { return devOffRegs + side*devPage }

// devWindowSize is W for a region of size bytes (0 if it is too small).
func devWindowSize(size int) int {
	if size < devMinRegion {
		return 0
	}
	return (size - devOffWindows) / 2 &^ (devPage - 1)
}

func devWindowOffset(side, window int) int { return devOffWindows + side*window }
