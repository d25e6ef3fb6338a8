// Package shm is the emulated NTB fabric: two processes on one host attach
// the two ends of a link through a shared-memory file, and each sees the
// other's inbound window as its outbound window, with doorbells, scratchpads
// and link state that behave like a real NTB port's. It is ntstack's default
// backend, used by the demo, the tests and the benchmarks; processes in
// different network namespaces share it as long as they share /dev/shm.
//
// The layout of the link's memory is drawn in layout.go. For a link
// opened by name that memory is a sealed memfd the two processes hand each
// other over Unix sockets beside a lock file in Options.Dir, so that
// nobody can truncate it under a mapping (rendezvous_linux.go). Doorbells
// are counters in the memory; a sleeping peer is woken through its FIFO
// beside the lock file (name.bell0, name.bell1), which it reads through
// the Go runtime's poller, or, for a memory link without a directory,
// through a pipe its creator hands over or a futex word in the memory
// (see bell_linux.go). The link is up
// from the moment both sides are attached; it is suspect while the peer's
// heartbeat stands still, and goes down when the peer's process is gone,
// it detaches, either end forces the link down, or it stays silent past
// Options.SilentTimeout (layout.go, Liveness).
//
// Concurrency: a Device is safe for concurrent use. Lifetime: the window
// slices are unmapped by Close; using them afterwards faults, so owners
// close the Device after everything that holds a window.
package shm

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ntstack/ntstack/internal/prim/shmem"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/internal/closeguard"
	"github.com/ntstack/ntstack/ntb/internal/doorbell"
)

// Defaults for Options.
const (
	DefaultDir               = "/dev/shm/ntstack"
	DefaultWindowSize        = 16 << 20
	DefaultHeartbeatInterval = 50 * time.Millisecond
	DefaultHeartbeatTimeout  = 500 * time.Millisecond
	DefaultSilentTimeout     = 10 * time.Second
)

// Side selects which end of a link to attach.
type Side int

const (
	// AnySide, the zero value, claims side 0 if it is free, else side 1.
	AnySide Side = iota
	Side0
	Side1
)

// Options configure Open. The zero value attaches any free side of a link
// with a 16 MiB window per side under /dev/shm/ntstack.
type Options struct {
	Dir               string
	Side              Side
	WindowSize        int // per side; both ends must agree
	HeartbeatInterval time.Duration
	// HeartbeatTimeout is how long the peer's heartbeat may stand still
	// before the link turns suspect (an up link, LinkEvent.Suspect): the
	// peer is attached but may be starved or stopped.
	HeartbeatTimeout time.Duration
	// SilentTimeout is how long it may stand still before the link goes
	// down with ntb.CauseSilent — the user timeout, of the order of TCP's
	// (DefaultSilentTimeout). Never shorter than HeartbeatTimeout.
	SilentTimeout time.Duration
	// FutexWait: sleep in futex waits on the doorbell word rather than
	// reading a FIFO through the runtime's poller (see bell_linux.go) —
	// for a process whose wake-ups cost less so, as ntproxy's do. A
	// memory link does unless Bell gives it a pipe to read.
	FutexWait bool
	// Bell, for OpenFile, is the memory link's pipe bell (see Bell).
	Bell Bell
	// Logf, if set, receives what the device did on its own: files of the
	// link's meeting point put back after they were removed or replaced,
	// a move onto the peer's memory.
	Logf func(format string, args ...any)
}

func (o *Options) setDefaults() {
	if o.Dir == "" {
		o.Dir = DefaultDir
	}
	if o.WindowSize == 0 {
		o.WindowSize = DefaultWindowSize
	}
	if o.HeartbeatInterval == 0 {
		o.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if o.HeartbeatTimeout == 0 {
		o.HeartbeatTimeout = DefaultHeartbeatTimeout
	}
	if o.SilentTimeout == 0 {
		o.SilentTimeout = DefaultSilentTimeout
	}
	o.SilentTimeout = max(o.SilentTimeout, o.HeartbeatTimeout)
}

// Device is one end of an emulated link.
type Device struct {
	name   string
	side   int
	window int
	logFn  func(format string, args ...any)
	mem    []byte // the whole link memory, mapped shared

	fmu sync.Mutex
	// fmu protects the following field where another goroutine than the
	// monitor reads it (runServe sends it); the monitor replaces it
	// (adopt), and reads it unlocked. file is the link memory, opened by
	// this end alone (its side lock is on this open file description).
	file *os.File

	// For a link opened by name (path != ""), the meeting point: the lock
	// file at path as it was opened, and the socket that serves the
	// memory (rendezvous_linux.go). Set up by Open, then the monitor's.
	path             string
	lockFile         *os.File
	lockDev, lockIno uint64
	dirGone          bool // checkPaths found the meeting point's directory removed, and said so
	srv              *server

	local  shmem.Mem // our registers (written by the peer)
	remote shmem.Mem // the peer's registers (written by us)
	in     []byte
	out    []byte

	gen         uint64 // our attach generation
	interval    time.Duration
	idle        time.Duration // the interval while this end's user is idle (idleInterval)
	timeout     time.Duration // the peer's heartbeat stands still this long: suspect
	silentAfter time.Duration // and this long: down (CauseSilent)
	// seenGen is the peer generation the monitor last looked at; a
	// WaitDoorbell that finds another in our registers has the monitor
	// look at once (noticePeer), so an arrival or a detach is seen at the
	// peer's wake-up rather than at our next beat.
	seenGen atomic.Uint64
	idlers  atomic.Int32  // Idle(true) calls not yet ended
	busy    chan struct{} // Idle(false) wakes the monitor
	now     chan struct{} // checkNow: the monitor looks at once

	links *ntb.LinkTracker
	stop  chan struct{}
	done  chan struct{}

	forceDown atomic.Bool
	silent    atomic.Bool // fault injection: stop heartbeating

	// kick is a process-private word, in its own anonymous mapping, that
	// local events (close, link change, cancellation) bump to wake the
	// futex waits of WaitDoorbell; they sleep on it and the shared
	// doorbell word at once.
	kick   []byte
	wakeup atomic.Uint64 // WaitDoorbell's sleeps that ended (tests)
	// bell, for a link opened by name, rings the peer's FIFO when the
	// peer says it sleeps reading it, and holds ours if we do (see
	// bell_linux.go); for a memory link the same over Options.Bell's
	// pipe, or nil.
	bell *bell

	// guard is held by every method that touches the mapping, and Close
	// unmaps it only once they have left.
	guard closeguard.Guard
	mask  doorbell.Mask
	bells doorbell.Counters

	mu sync.Mutex
	// mu protects the following fields.
	ringSeq   uint32 // our count of rings of bits 0-31, the peer's futex word
	ringSeqHi uint32 // of bits 32-63, the peer's other futex word
}

var (
	_ ntb.Device      = (*Device)(nil)
	_ ntb.LinkWatcher = (*Device)(nil)
	_ ntb.Liveness    = (*Device)(nil)
)

// Open attaches one end of the link called name: the memory its peer
// serves, or new memory if no peer answers (see rendezvous_linux.go).
func Open(name string, o Options) (_ *Device, err error) {
	o.setDefaults()
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return nil, fmt.Errorf("open link %q: invalid name", name)
	}
	if o.WindowSize <= 0 || o.WindowSize%pageSize != 0 {
		return nil, fmt.Errorf("open link %q: window size %d is not a positive multiple of %d", name, o.WindowSize, pageSize)
	}
	d := newDevice(name, o)
	d.path = filepath.Join(o.Dir, name)
	defer func() {
		if err != nil {
			d.release()
			err = fmt.Errorf("open link %q: %w", name, err)
		}
	}()
	if err := d.openLockFile(); err != nil {
		return nil, err
	}
	// The monitor replaces d.lockFile if the path comes to name another
	// file; the lock is on this one.
	lf := d.lockFile
	if err := lockByte(lf, lockInit, true); err != nil {
		return nil, fmt.Errorf("lock link file: %w", err)
	}
	locked := true
	defer func() {
		if locked {
			unlockByte(lf, lockInit)
		}
	}()
	// Which sides are served, and with what memory.
	var served [2]*os.File
	defer func() {
		for _, f := range served {
			if f != nil {
				f.Close()
			}
		}
	}()
	for s := range 2 {
		if f, side, c, err := fetchHeld(sockPath(d.path, s)); err == nil {
			defer c.Close() // after start: tells the server we are here (runServe)
			if side != s {
				f.Close()
				continue
			}
			served[s] = f
		}
	}
	switch o.Side {
	case AnySide:
		switch {
		case served[0] == nil:
			d.side = 0
		case served[1] == nil:
			d.side = 1
		default:
			return nil, errors.New("both ends are attached by other processes")
		}
	case Side0, Side1:
		d.side = int(o.Side - Side0)
		if served[d.side] != nil {
			return nil, fmt.Errorf("side %d is attached by another process", d.side)
		}
	default:
		return nil, fmt.Errorf("invalid side %d", o.Side)
	}
	mem := served[1-d.side]
	if mem != nil {
		if err := checkLinkMemory(mem, o.WindowSize); err != nil {
			return nil, fmt.Errorf("the other end's link memory: %w", err)
		}
		d.logf("%s/%d: attached to the link memory side %d serves", name, d.side, 1-d.side)
	} else {
		d.logf("%s/%d: new link memory: no process serves side %d's", name, d.side, 1-d.side)
		if mem, err = newLinkMemory(name, o.WindowSize); err != nil {
			return nil, err
		}
		defer mem.Close()
	}
	if d.file, err = reopen(mem); err != nil {
		return nil, err
	}
	if err := d.claim(Side(d.side) + Side0); err != nil {
		return nil, err
	}
	if err := d.attach(o); err != nil {
		return nil, err
	}
	if err := d.listen(); err != nil {
		return nil, err
	}
	unlockByte(lf, lockInit)
	locked = false
	d.start()
	return d, nil
}

// NewMemLink creates an anonymous link file (a memfd) that no other process
// can open by name: its creator hands it to the peer process over a Unix
// socket (SCM_RIGHTS), and each side attaches with OpenFile. ntproxy gives
// every application such a private link.
func NewMemLink(name string) (*os.File, error) {
	// Sealing allowed: its creator seals the size once it is set (OpenFile
	// sizes it), so that the peer cannot shrink it under the creator's
	// mapping.
	fd, err := unix.MemfdCreate("ntstack-"+name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("create memory link %q: %w", name, err)
	}
	return os.NewFile(uintptr(fd), "memfd:ntstack-"+name), nil
}

// OpenFile attaches one end of the link held in f, a link file opened or
// received by the caller (see NewMemLink); o.Dir is ignored. The Device opens
// f afresh through /proc/self/fd, so its side lock is its own even when the
// peer holds a descriptor of the same open file; the caller keeps f.
func OpenFile(f *os.File, name string, o Options) (_ *Device, err error) {
	o.setDefaults()
	if o.WindowSize <= 0 || o.WindowSize%pageSize != 0 {
		return nil, fmt.Errorf("open link %q: window size %d is not a positive multiple of %d", name, o.WindowSize, pageSize)
	}
	d := newDevice(name, o)
	defer func() {
		if err != nil {
			d.release()
			err = fmt.Errorf("open link %q: %w", name, err)
		}
	}()
	if d.file, err = reopen(f); err != nil {
		return nil, err
	}
	if err := d.claim(o.Side); err != nil {
		return nil, err
	}
	if err := d.initFile(o.WindowSize); err != nil {
		return nil, err
	}
	if err := d.attach(o); err != nil {
		return nil, err
	}
	d.start()
	return d, nil
}

func newDevice(name string, o Options) *Device {
	return &Device{name: name, window: o.WindowSize, logFn: o.Logf, interval: o.HeartbeatInterval,
		busy: make(chan struct{}, 1), now: make(chan struct{}, 1),
		idle: idleInterval(o.HeartbeatInterval, o.HeartbeatTimeout), timeout: o.HeartbeatTimeout, silentAfter: o.SilentTimeout}
}

// attach maps the link memory d.file, on which d holds its side's lock,
// and announces this end in the peer's registers.
func (d *Device) attach(o Options) (err error) {
	d.mem, err = unix.Mmap(int(d.file.Fd()), 0, fileSize(o.WindowSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		d.mem = nil
		return fmt.Errorf("map link memory: %w", err)
	}
	d.kick, err = unix.Mmap(-1, 0, pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		d.kick = nil
		return fmt.Errorf("map wake word: %w", err)
	}
	peer := 1 - d.side
	d.local = d.mem[regsOffset(d.side) : regsOffset(d.side)+regsSize]
	d.remote = d.mem[regsOffset(peer) : regsOffset(peer)+regsSize]
	d.in = d.mem[windowOffset(d.side, o.WindowSize) : windowOffset(d.side, o.WindowSize)+o.WindowSize]
	d.out = d.mem[windowOffset(peer, o.WindowSize) : windowOffset(peer, o.WindowSize)+o.WindowSize]
	if d.path != "" {
		if d.bell, err = openBell(d.path, d.side, !o.FutexWait); err != nil {
			return err
		}
	} else if o.Bell != (Bell{}) {
		if d.bell, err = fileBell(o.Bell); err != nil {
			return err
		}
	}
	d.mu.Lock()
	d.stampRegsLocked()
	if d.bell.reads() {
		h := d.ringHalves
		d.bell.halves.Store(&h)
	}
	d.mu.Unlock()
	if d.bell.reads() {
		setSwept(d, true)
	}
	return nil
}

// stampRegsLocked announces this end in the peer's registers of the
// memory mapped now: a new generation, its bell, the link not forced down
// unless it is; and resumes the doorbell counters where they are, so that
// rings meant for an earlier attachment do not look pending.
func (d *Device) stampRegsLocked() {
	d.bells.Attach(d.local, d.remote, regDoorbells)
	d.ringSeq = loadFutex(d.remote, regDoorbellSeq)
	d.ringSeqHi = loadFutex(d.remote, regDoorbellHi)
	// A generation unlike any earlier one tells the peer we are new.
	d.gen = rand.Uint64() | 1
	d.remote.Store64(regGeneration, d.gen)
	var down uint32
	if d.forceDown.Load() {
		down = 1
	}
	d.remote.Store32(regPeerDown, down)
	var bells uint32
	if d.bell.reads() {
		bells = 1
	}
	d.remote.Store32(regBells, bells)
}

// start runs the monitor, and tells a peer already attached that this
// end arrived: a wake-up where it sleeps, whose WaitDoorbell then finds
// our new generation (noticePeer), so its link comes up now rather than
// at its next beat. (A peer of a link opened by name also hears it from
// its socket, see runServe.)
func (d *Device) start() {
	d.links = ntb.NewLinkTracker()
	d.stop = make(chan struct{})
	d.done = make(chan struct{})
	d.seenGen.Store(d.local.Load64(regGeneration))
	go d.runMonitor()
	d.bumpSeqs(^uint64(0))
	d.wakePeer(^uint64(0))
}

func (d *Device) logf(format string, args ...any) {
	if d.logFn != nil {
		d.logFn(format, args...)
	}
}

// claim takes the lock of the requested side.
func (d *Device) claim(s Side) error {
	var sides []int
	switch s {
	case AnySide:
		sides = []int{0, 1}
	case Side0, Side1:
		sides = []int{int(s - Side0)}
	default:
		return fmt.Errorf("invalid side %d", s)
	}
	for _, side := range sides {
		err := d.lock(lockSide+side, false)
		if err == nil {
			d.side = side
			return nil
		}
		if !errors.Is(err, unix.EAGAIN) && !errors.Is(err, unix.EACCES) {
			return fmt.Errorf("claim side %d: %w", side, err)
		}
	}
	if s == AnySide {
		return errors.New("both ends are attached by other processes")
	}
	return fmt.Errorf("side %d is attached by another process", s-Side0)
}

// initFile sizes and stamps the memory of a new memory link, or checks an
// existing one. Memory with another layout is rebuilt only if nobody holds
// its other end.
func (d *Device) initFile(window int) error {
	if err := d.lock(lockInit, true); err != nil {
		return fmt.Errorf("lock link file: %w", err)
	}
	defer d.unlock(lockInit)
	var hdr [16]byte
	if n, _ := d.file.ReadAt(hdr[:], 0); n == len(hdr) && le.Uint32(hdr[offFileMagic:]) != 0 {
		mismatch := checkHeader(hdr, window)
		if mismatch == "" {
			var st unix.Stat_t
			if err := unix.Fstat(int(d.file.Fd()), &st); err != nil {
				return fmt.Errorf("stat link memory: %w", err)
			}
			if st.Size < int64(fileSize(window)) {
				mismatch = fmt.Sprintf("%d bytes, a %d-byte window needs %d", st.Size, window, fileSize(window))
			}
		}
		if mismatch == "" {
			return nil
		}
		if d.lock(lockSide+1-d.side, false) != nil {
			return fmt.Errorf("link file %s: %s, and its other end is attached", d.file.Name(), mismatch)
		}
		d.unlock(lockSide + 1 - d.side)
	}
	// New (or abandoned and mismatched): zero it at the right size.
	if err := d.file.Truncate(0); err != nil {
		return err
	}
	if err := d.file.Truncate(int64(fileSize(window))); err != nil {
		return err
	}
	return stampHeader(d.file, window)
}

// checkHeader says how the link header hdr (written by whoever created
// the file) differs from one for a window of the given size, or "" if it
// does not.
func checkHeader(hdr [16]byte, window int) string {
	magic, version, size := le.Uint32(hdr[offFileMagic:]), le.Uint32(hdr[offFileVersion:]), le.Uint64(hdr[offFileWindow:])
	switch {
	case magic != fileMagic:
		return fmt.Sprintf("magic %#x is not an ntstack link", magic)
	case version != fileVersion:
		return fmt.Sprintf("layout version %d, this build speaks %d", version, fileVersion)
	case size != uint64(window):
		return fmt.Sprintf("window size %d, this end asks for %d", size, window)
	}
	return ""
}

func (d *Device) lock(b int, wait bool) error { return lockByte(d.file, b, wait) }
func (d *Device) unlock(b int)                { unlockByte(d.file, b) }

// lockByte takes an open-file-description write lock on byte b of f.
func lockByte(f *os.File, b int, wait bool) error {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: int64(b), Len: 1}
	cmd := unix.F_OFD_SETLK
	if wait {
		cmd = unix.F_OFD_SETLKW
	}
	return unix.FcntlFlock(f.Fd(), cmd, &lk)
}

func unlockByte(f *os.File, b int) {
	lk := unix.Flock_t{Type: unix.F_UNLCK, Whence: 0, Start: int64(b), Len: 1}
	_ = unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
}

// wakeLocal wakes this process's WaitDoorbell callers so they re-check.
func (d *Device) wakeLocal() {
	if d.bell.reads() {
		d.bell.wake()
		return
	}
	add32(d.kick, 0, 1)
	futexWakePrivate(d.kick, 0)
}

// Name is the link name and side, e.g. "demo/0".
func (d *Device) Name() string { return fmt.Sprintf("%s/%d", d.name, d.side) }

// Side is the end of the link this Device holds: 0 or 1.
func (d *Device) Side() int { return d.side }

// Port is the same as Side.
func (d *Device) Port() int { return d.side }

func (d *Device) InboundWindow() []byte  { return d.in }
func (d *Device) OutboundWindow() []byte { return d.out }

// WindowShared reports true (ntb.SharedWindow): both ends map the same
// memory, and a write lands whatever the link's state. The memory under
// the windows changes only when an end moves onto its peer's link memory
// (adopt), which happens only after one end restarted, and a restarted
// end has no connections to resume.
func (d *Device) WindowShared() bool { return true }

func (d *Device) DoorbellCount() int { return doorbellBits }

// RingPeer adds one to the peer's counter of every bit set, then to the
// doorbell sequence of each half of the bits it rang, and wakes it if it
// sleeps.
func (d *Device) RingPeer(bits uint64) error {
	if !d.guard.Enter() {
		return ntb.ErrClosed
	}
	defer d.guard.Exit()
	d.bells.Ring(bits)
	d.bumpSeqs(bits)
	d.wakePeer(bits)
	return nil
}

// bumpSeqs moves the peer's sequence word of each half of bits forward
// (after the counters, and only forward).
func (d *Device) bumpSeqs(bits uint64) {
	d.mu.Lock()
	if bits&lowBits != 0 {
		d.ringSeq++
		storeFutex(d.remote, regDoorbellSeq, d.ringSeq)
	}
	if bits&^lowBits != 0 {
		d.ringSeqHi++
		storeFutex(d.remote, regDoorbellHi, d.ringSeqHi)
	}
	d.mu.Unlock()
}

// wakePeer wakes the peer's sleepers on bits where they sleep: its FIFO
// if it said it reads one (regBells, peer-written: any other value means
// the futex words) and the FIFO is one, else the doorbell word of each
// half of bits.
func (d *Device) wakePeer(bits uint64) {
	if d.local.Load32(regBells) == 1 && d.bell != nil && d.bell.ring() {
		return
	}
	if bits&lowBits != 0 {
		futexWake(d.remote, regDoorbellSeq)
	}
	if bits&^lowBits != 0 {
		futexWake(d.remote, regDoorbellHi)
	}
}

func (d *Device) Doorbells() uint64 {
	if !d.guard.Enter() {
		return 0
	}
	defer d.guard.Exit()
	return d.bells.Pending()
}

func (d *Device) ClearDoorbells(bits uint64) {
	if !d.guard.Enter() {
		return
	}
	defer d.guard.Exit()
	d.bells.Clear(bits)
}

func (d *Device) SetDoorbellMask(bits uint64) { d.mask.Update(bits, 0, nil) }

func (d *Device) ClearDoorbellMask(bits uint64) {
	d.mask.Update(0, bits, nil)
	if d.guard.Enter() {
		d.wakeLocal() // a newly unmasked bit may be pending
		d.guard.Exit()
	}
}

// WaitDoorbell sleeps until an unmasked bit of want is pending. On a link
// opened by name it sleeps on its bell (see bell_linux.go); otherwise on
// the peer's doorbell sequence word of each half of want's bits (both if
// want is 0) and on the local wake word at once, with no timeout: link
// changes, Close and ctx wake it through the latter.
func (d *Device) WaitDoorbell(ctx context.Context, want uint64) (uint64, error) {
	if !d.guard.Enter() {
		return 0, ntb.ErrClosed
	}
	defer d.guard.Exit()
	linkSeq := d.links.Seq()
	if d.bell.reads() {
		return d.waitBell(ctx, want, linkSeq)
	}
	stop := context.AfterFunc(ctx, func() {
		if d.guard.Enter() {
			d.wakeLocal()
			d.guard.Exit()
		}
	})
	defer stop()
	lo, hi := want&lowBits != 0 || want == 0, want&^lowBits != 0 || want == 0
	for {
		kick := loadFutex(d.kick, 0)
		seq, seqHi := loadFutex(d.local, regDoorbellSeq), loadFutex(d.local, regDoorbellHi)
		d.noticePeer()
		if done, p, err := d.waitOver(ctx, want, linkSeq); done {
			return p, err
		}
		switch {
		case lo && hi:
			futexWait3(d.local, regDoorbellSeq, seq, regDoorbellHi, seqHi, d.kick, 0, kick)
		case lo:
			futexWait2(d.local, regDoorbellSeq, seq, d.kick, 0, kick)
		default:
			futexWait2(d.local, regDoorbellHi, seqHi, d.kick, 0, kick)
		}
		d.wakeup.Add(1)
	}
}

// noticePeer has the monitor look at once if the peer's generation in
// our registers is not the one it last saw: the peer arrived, detached or
// was replaced, and woke us to say so.
func (d *Device) noticePeer() {
	if d.local.Load64(regGeneration) != d.seenGen.Load() {
		d.checkNow()
	}
}

// waitOver is WaitDoorbell's look before each sleep: done, with what to
// return, once an unmasked bit of want is pending, the link changed since
// linkSeq, ctx ended or the device closed.
func (d *Device) waitOver(ctx context.Context, want uint64, linkSeq uint64) (bool, uint64, error) {
	p := d.bells.Pending() & want
	return doorbell.Done(ctx, d.guard.Closed(), p, d.mask.Load(), d.links.Seq() != linkSeq)
}

func (d *Device) ScratchpadCount() int { return scratchpadRegs }

func (d *Device) Scratchpad(i int) (uint32, error) {
	if i < 0 || i >= scratchpadRegs {
		return 0, fmt.Errorf("scratchpad %d of %d: out of range", i, scratchpadRegs)
	}
	if !d.guard.Enter() {
		return 0, ntb.ErrClosed
	}
	defer d.guard.Exit()
	return d.local.Load32(regScratchpads + 4*i), nil
}

func (d *Device) SetPeerScratchpad(i int, v uint32) error {
	if i < 0 || i >= scratchpadRegs {
		return fmt.Errorf("scratchpad %d of %d: out of range", i, scratchpadRegs)
	}
	if !d.guard.Enter() {
		return ntb.ErrClosed
	}
	defer d.guard.Exit()
	d.remote.Store32(regScratchpads+4*i, v)
	return nil
}

func (d *Device) Link() ntb.LinkState { return d.links.Link() }

// Suspect reports an up link whose peer's heartbeat has stood still
// longer than Options.HeartbeatTimeout (see ntb.Liveness).
func (d *Device) Suspect() bool { return d.links.Suspect() }

// LinkCause says why the link is down (see ntb.Liveness).
func (d *Device) LinkCause() ntb.Cause { return d.links.Cause() }

// LinkReason says why the link entered its current state.
func (d *Device) LinkReason() string { return d.links.Reason() }

func (d *Device) LinkEvents() <-chan ntb.LinkEvent { return d.links.Events() }

// LinkChanged returns a channel closed by the next link change (see
// ntb.LinkWatcher).
func (d *Device) LinkChanged() <-chan struct{} { return d.links.Changed() }

// Close detaches: the peer sees the link go down at its next check.
func (d *Device) Close() error {
	return d.guard.Close(func() {
		close(d.stop)
		<-d.done
	}, func() {
		d.links.CloseLocal(time.Now())
		d.remote.Store64(regGeneration, 0)
		d.wakePeer(^uint64(0))
		d.wakeLocal()
	}, func() error {
		d.closeServer()
		d.leave()
		return d.release()
	})
}

func (d *Device) release() error {
	var errs []error
	if d.bell.reads() {
		setSwept(d, false)
	}
	d.closeServer()
	if d.lockFile != nil {
		errs = append(errs, d.lockFile.Close())
		d.lockFile = nil
	}
	if d.mem != nil {
		errs = append(errs, unix.Munmap(d.mem))
		d.mem = nil
	}
	if d.kick != nil {
		errs = append(errs, unix.Munmap(d.kick))
		d.kick = nil
	}
	if d.bell != nil {
		errs = append(errs, d.bell.close())
	}
	if d.file != nil {
		errs = append(errs, d.file.Close()) // drops our locks
		d.file = nil
	}
	return errors.Join(errs...)
}

// Remove deletes the files of the link's meeting point: the lock file, the
// sockets and the doorbell FIFOs. Attached ends keep working (each has the
// other's FIFO open once it has rung it, which the session handshake
// does) and put back the lock file and their socket at their next beat,
// so that an end that restarts finds the other; each removes its socket
// when it closes.
func Remove(dir, name string) error {
	if dir == "" {
		dir = DefaultDir
	}
	link := filepath.Join(dir, name)
	var errs []error
	for _, path := range []string{link, sockPath(link, 0), sockPath(link, 1), bellPath(link, 0), bellPath(link, 1)} {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
