package shm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"sync/atomic"

	"github.com/ntstack/ntstack/internal/prim/spingate"
	"golang.org/x/sys/unix"
)

// bell is the doorbell wake-up of a link opened by name: a FIFO per side
// beside the link file. An end that sleeps reading its FIFO says so in
// the peer's registers (regBells), and the peer then rings by writing a
// byte into it; one goroutine reads it through the runtime's poller and
// wakes every WaitDoorbell call, which waits on a channel. So a sleeping
// end holds no processor. A futex wait then was a blocking system call
// that kept its P, and while another P idled the runtime's sysmon polled
// every 20 µs for up to 10 ms before it took it back: a request a
// millisecond (ntbench -gap 1ms) cost ntb 46-49 % of a core unpinned and
// 29-31 % pinned against TCP's 21-27 %, where TCP's goroutines park on
// the poller as these now do (30-33 % and 21-23 %). Futex waits now give
// their P up first (proc.BlockingSyscall6); the FIFO is kept as measured.
//
// The poller is consulted only when no goroutine is runnable, though,
// so while a goroutine of the process spins its bells would be heard
// late. Every spin loop therefore sweeps the bells of its process before
// it yields (spingate.Sweep): a sweep wakes the waiters of a bell whose
// doorbell sequence word the peer moved, as the byte in the FIFO would
// once the poller looked. An application holding a memory link and
// direct links, or several attachments, hears them all while one of its
// connections spins. ntproxy keeps the futex wait (Options.FutexWait):
// there a wake-up through the poller (epoll, the pipe's read, the
// runtime's idle path) cost more CPU a request than the futex wait and
// sysmon's retake of its P together (docs/perf-log.md, 2026-12-02, issue
// 42). A memory link (NewMemLink: ntproxy's application links) has no
// directory for FIFOs; its creator may hand the other end a pipe instead
// (Options.Bell, fileBell), else both wait by futex.
type bell struct {
	fifo     *os.File // ours, opened read-write (never at end of file); nil if we wait by futex
	peerPath string   // the peer's

	peerMu sync.Mutex // held while peerFd is used, so it is never another file's
	peerFd int        // open on the peer's FIFO, -1 until it is

	// halves says which halves of the doorbell bits a byte read may be
	// for (see Device.ringHalves); nil until the device sets it, and then
	// every byte wakes every waiter.
	halves atomic.Pointer[func() (lo, hi bool)]

	// sleepers counts WaitDoorbell calls asleep on this bell; swept is
	// the doorbell sequence word of each half as the last sweep saw it.
	sleepers         atomic.Int32
	sweptLo, sweptHi atomic.Uint32

	mu sync.Mutex
	// mu protects the following fields: closed by the next byte for a
	// waiter on a low bit (bits 0-31) and on a high bit, and both by a
	// local wake. So, as with the futex words, a waiter for the session
	// bit (63) sleeps through the data path's rings.
	rungLo, rungHi chan struct{}
}

// bellPath is side's FIFO of the link file at link.
func bellPath(link string, side int) string { return fmt.Sprintf("%s.bell%d", link, side) }

// openBell prepares the bell of the link file at link for side: the
// peer's FIFO to ring, and, if read, this side's FIFO, made if need be,
// opened and read.
func openBell(link string, side int, read bool) (*bell, error) {
	b := &bell{peerPath: bellPath(link, 1-side), peerFd: -1}
	if !read {
		return b, nil
	}
	own := bellPath(link, side)
	if err := unix.Mkfifo(own, 0o660); err != nil && !errors.Is(err, unix.EEXIST) {
		return nil, fmt.Errorf("make doorbell FIFO: %w", err)
	}
	// Read-write: a FIFO read with no writer left reads end of file,
	// which the poller would report ready forever. os.OpenFile puts a
	// FIFO in the runtime's poller.
	f, err := os.OpenFile(own, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open doorbell FIFO: %w", err)
	}
	if fi, err := f.Stat(); err != nil || fi.Mode().Type() != os.ModeNamedPipe {
		f.Close()
		return nil, fmt.Errorf("doorbell FIFO %s: not a FIFO", own)
	}
	b.fifo, b.rungLo, b.rungHi = f, make(chan struct{}), make(chan struct{})
	go b.read()
	return b, nil
}

// Bell is a memory link's doorbell wake-up in place of FIFOs beside a
// link file (see bell): the ends of a pipe, one end's to read and the
// other's to ring, which the link's creator makes and hands over with the
// link's memory. Read is this end's (nil: it sleeps by futex), Ring the
// peer's (nil: the peer sleeps by futex). OpenFile uses its own
// duplicates; the caller keeps the files.
type Bell struct {
	Read, Ring *os.File
}

// fileBell is the bell of a memory link over the pipe ends of b.
func fileBell(b Bell) (_ *bell, err error) {
	bl := &bell{peerFd: -1}
	defer func() {
		if err != nil {
			bl.close()
		}
	}()
	if b.Ring != nil {
		if bl.peerFd, err = unix.FcntlInt(b.Ring.Fd(), unix.F_DUPFD_CLOEXEC, 0); err != nil {
			bl.peerFd = -1
			return nil, fmt.Errorf("doorbell pipe: %w", err)
		}
		// A full pipe already holds a wake-up: a ring never blocks.
		if err := unix.SetNonblock(bl.peerFd, true); err != nil {
			return nil, fmt.Errorf("doorbell pipe: %w", err)
		}
	}
	if b.Read != nil {
		fd, err := unix.FcntlInt(b.Read.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("doorbell pipe: %w", err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			unix.Close(fd)
			return nil, errors.New("doorbell pipe: not a pipe")
		}
		// Non-blocking, so that os.NewFile puts it in the runtime's poller.
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("doorbell pipe: %w", err)
		}
		bl.fifo, bl.rungLo, bl.rungHi = os.NewFile(uintptr(fd), "doorbell pipe"), make(chan struct{}), make(chan struct{})
		go bl.read()
	}
	return bl, nil
}

// reads reports whether this side sleeps reading its FIFO.
func (b *bell) reads() bool { return b != nil && b.fifo != nil }

// read wakes the waiters whenever bytes arrive, until the FIFO closes.
//
// It reads through the runtime's poller until a read fails with EAGAIN.
// A read that drained the FIFO cannot skip that last read: each RawRead
// begins by clearing the descriptor's readiness, so a byte that came
// after the draining read would wait, unseen, for the next one.
func (b *bell) read() {
	buf := make([]byte, 256) // rings since the last read, drained at once
	rc, err := b.fifo.SyscallConn()
	if err != nil {
		b.wake()
		return
	}
	for {
		var n int
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			for n, rerr = unix.Read(int(fd), buf); errors.Is(rerr, unix.EINTR); {
				n, rerr = unix.Read(int(fd), buf)
			}
			return !errors.Is(rerr, unix.EAGAIN)
		})
		if err == nil && rerr == nil && n == 0 {
			err = io.EOF // no writer left (the FIFO is read-write: never)
		}
		err = errors.Join(err, rerr)
		lo, hi := true, true
		if h := b.halves.Load(); h != nil && err == nil {
			lo, hi = (*h)()
		}
		b.wakeHalves(lo, hi)
		if err != nil {
			return
		}
	}
}

// wake wakes every waiter (a local event: close, link change, unmasking).
func (b *bell) wake() { b.wakeHalves(true, true) }

// wakeHalves wakes the waiters on a low bit if lo, on a high bit if hi.
func (b *bell) wakeHalves(lo, hi bool) {
	b.mu.Lock()
	if lo {
		close(b.rungLo)
		b.rungLo = make(chan struct{})
	}
	if hi {
		close(b.rungHi)
		b.rungHi = make(chan struct{})
	}
	b.mu.Unlock()
}

// waiting returns the channels the next wake of a waiter on a low bit and
// on a high bit closes; take them before looking at what the wait is for.
func (b *bell) waiting() (lo, hi <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.rungLo, b.rungHi
}

// ring writes a byte into the peer's FIFO, opening it first if need be.
// With no reader there (the peer is not attached) there is nobody to wake;
// a full FIFO already holds a wake-up. It reports false if the peer's
// path is not a FIFO: nothing reads there, and a regular file would grow
// by a byte a ring.
func (b *bell) ring() bool {
	b.peerMu.Lock()
	defer b.peerMu.Unlock()
	if b.peerFd < 0 {
		if b.peerPath == "" {
			return false // a pipe's write end, closed: nothing reads there
		}
		fd, err := unix.Open(b.peerPath, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			return true
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFIFO {
			unix.Close(fd)
			return false
		}
		b.peerFd = fd
	}
	if _, err := unix.Write(b.peerFd, []byte{1}); errors.Is(err, unix.EPIPE) {
		// The peer's reader went; its successor opens the FIFO anew.
		unix.Close(b.peerFd)
		b.peerFd = -1
	}
	return true
}

// close closes both ends; the reader ends and wakes the waiters.
func (b *bell) close() error {
	var err error
	if b.fifo != nil {
		err = b.fifo.Close()
	}
	b.peerMu.Lock()
	if b.peerFd >= 0 {
		unix.Close(b.peerFd)
		b.peerFd = -1
	}
	b.peerMu.Unlock()
	return err
}

// swept lists the devices whose waiters sleep on a bell, for sweepBells;
// copied on write under mu.
var swept struct {
	mu   sync.Mutex
	devs atomic.Pointer[[]*Device]
}

func init() { spingate.OnSweep(sweepBells) }

// sweepBells sweeps every device of the process that sleeps on a bell.
func sweepBells() {
	if p := swept.devs.Load(); p != nil {
		for _, d := range *p {
			d.sweep()
		}
	}
}

// sweep wakes the waiters asleep on d's bell, if any, on each half of the
// doorbell bits whose sequence word moved since the last sweep: the peer
// rang them, and the byte it wrote into the FIFO waits for the runtime's
// poller. A waiter woken for nothing looks and sleeps again, as for a
// byte.
func (d *Device) sweep() {
	b := d.bell
	if b.sleepers.Load() == 0 || !d.guard.Enter() {
		return
	}
	lo, hi := loadFutex(d.local, regDoorbellSeq), loadFutex(d.local, regDoorbellHi)
	d.guard.Exit()
	rangLo := b.sweptLo.Load() != lo && b.sweptLo.Swap(lo) != lo
	rangHi := b.sweptHi.Load() != hi && b.sweptHi.Swap(hi) != hi
	if rangLo || rangHi {
		b.wakeHalves(rangLo, rangHi)
	}
}

// setSwept adds d to the swept devices if add, else removes it.
func setSwept(d *Device, add bool) {
	swept.mu.Lock()
	defer swept.mu.Unlock()
	var devs []*Device
	if p := swept.devs.Load(); p != nil {
		for _, e := range *p {
			if e != d {
				devs = append(devs, e)
			}
		}
	}
	if add {
		devs = append(devs, d)
	}
	swept.devs.Store(&devs)
}

// waitBell is WaitDoorbell asleep on the bell's channel.
func (d *Device) waitBell(ctx context.Context, want uint64, linkSeq uint64) (uint64, error) {
	lo, hi := want&lowBits != 0 || want == 0, want&^lowBits != 0 || want == 0
	d.bell.sleepers.Add(1)
	defer d.bell.sleepers.Add(-1)
	for {
		rungLo, rungHi := d.bell.waiting()
		if !lo {
			rungLo = nil
		}
		if !hi {
			rungHi = nil
		}
		d.noticePeer()
		if done, p, err := d.waitOver(ctx, want, linkSeq); done {
			return p, err
		}
		select {
		case <-rungLo:
		case <-rungHi:
		case <-ctx.Done():
		}
		d.wakeup.Add(1)
	}
}

// ringHalves says which of the bell's waiters a byte just read is for
// (see bell.halves): those on the halves of the bits pending; all of them
// if none is (the peer woke us with no ring: it arrived or left, for
// noticePeer) or the peer's generation changed.
func (d *Device) ringHalves() (lo, hi bool) {
	if !d.guard.Enter() {
		return true, true
	}
	defer d.guard.Exit()
	p := d.bells.Pending()
	if p == 0 || d.local.Load64(regGeneration) != d.seenGen.Load() {
		return true, true
	}
	return p&lowBits != 0, p&^lowBits != 0
}
