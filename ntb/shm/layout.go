package shm

import "github.com/ntstack/ntstack/internal/prim/shmem"

// A link's memory is one file, mapped shared by the two processes that
// attach its ends (side 0 and side 1): for a link opened by name, a memfd
// with its size sealed, which the ends hand each other through sockets
// beside the lock file /dev/shm/ntstack/<name> (rendezvous_linux.go); for a
// memory link, the memfd its creator passes on (NewMemLink).
//
//	file offset        size   what
//	0                  4 KiB  link header (written once, by whoever creates the file)
//	4 KiB              4 KiB  registers of side 0 (written by side 1)
//	8 KiB              4 KiB  registers of side 1 (written by side 0)
//	12 KiB             W      inbound window of side 0 (side 1's outbound)
//	12 KiB + W         W      inbound window of side 1 (side 0's outbound)
//
// Link header:
//
//	off  size  field
//	  0     4  magic "NTBL"
//	  4     4  layout version
//	  8     8  window size W (bytes, a multiple of 4 KiB)
//
// Registers of side S. Every word is written by the peer P and only read
// by S, like a real NTB port's doorbell and scratchpad registers:
//
//	off  size  field
//	  0     4  doorbell sequence, bits 0-31: P adds one after every ring of one of them; S sleeps on it (futex) unless it bells
//	  4     4  P bells: 1 when P sleeps reading its FIFO (see bell_linux.go), so S rings there
//	  8     8  P's attach generation (0 = P detached)
//	 16     8  P's heartbeat count
//	 24     4  1 while P forces the link down (fault injection)
//	 28     4  doorbell sequence, bits 32-63: as the word at 0, for the upper bits
//	 32    32  reserved
//	 64   256  doorbell counters, 64 x uint32: P adds one to bit i's counter to ring it
//	320   256  scratchpads, 64 x uint32
//
// Two sequence words, so that a futex sleeper waits only on the half of
// the bits it wants: the rings of the data path (partition's rings take
// the low bits) wake no thread that waits only for an upper bit (the
// session bit, 63), which with one word woke at every record.
//
// Side claims use open-file-description byte-range locks on the link's
// memory (byte 1+S: side S), which the kernel drops when a process exits,
// so a crashed side can be claimed again at once; byte 0 serialises the
// ends' set-up (on the lock file, for a link opened by name).
//
// Liveness. Every HeartbeatInterval each side adds one to its count in the
// peer's registers and checks the peer: whether a process still holds the
// peer's side lock (the kernel answers, F_OFD_GETLK, and drops the lock the
// moment a process dies), whether the peer detached or forced the link down,
// and how long its heartbeat has stood still. A peer that exits or crashes
// (ntb.CauseGone), detaches (ntb.CauseClosed) or pulls the link
// (ntb.CauseHardware) is therefore seen within one interval (50 ms by
// default; 100 ms while the user is idle, see Device.Idle), and sooner
// when it wakes us to say so. A heartbeat that stands still is no proof of
// death — a loaded machine fires Go timers hundreds of milliseconds late,
// and a stopped or starved process holds its lock — so past
// HeartbeatTimeout (500 ms) the link only turns suspect, and it goes down
// (ntb.CauseSilent) only past SilentTimeout (10 s, a user timeout like
// TCP's). A peer that attaches is up at once: the one that arrives finds
// the other attached at its first look, and wakes it (its socket, its
// doorbell) so that it looks too.
// The interval is set by idle cost: on this VM class every timer wake-up
// costs ~150-200 µs of CPU, so a 10 ms beat alone would cost 1.4% of a core
// per process; 50 ms costs ~0.5%, 100 ms half that.
const (
	fileMagic   = 0x4c42544e // "NTBL"
	fileVersion = 3          // 2: the bell word; 3: the upper bits' sequence word

	offFileMagic   = 0
	offFileVersion = 4
	offFileWindow  = 8

	pageSize   = 4096
	headerSize = pageSize
	regsSize   = pageSize
	offRegs    = headerSize // + side*regsSize
	offWindows = headerSize + 2*regsSize

	regDoorbellSeq = 0
	regBells       = 4
	regGeneration  = 8
	regHeartbeat   = 16
	regPeerDown    = 24
	regDoorbellHi  = 28
	regDoorbells   = 64
	regScratchpads = 320

	doorbellBits   = shmem.DoorbellBits
	lowBits        = uint64(1)<<32 - 1 // the bits regDoorbellSeq counts; regDoorbellHi counts the others
	scratchpadRegs = 64

	lockInit = 0 // byte offsets used as lock ranges
	lockSide = 1
)

func regsOffset(side int) int           { return offRegs + side*regsSize }
func windowOffset(side, window int) int { return offWindows + side*window }
func fileSize(window int) int           { return offWindows + 2*window }
