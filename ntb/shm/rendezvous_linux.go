package shm

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"
)

// The memory of a link opened by name is a memfd, never a file at a path:
// a file on a tmpfs can be truncated by anyone who may open it, and a
// process that touches a page past the new end of its mapping dies of
// SIGBUS. A memfd's size is sealed (F_SEAL_SHRINK, F_SEAL_GROW, F_SEAL_SEAL)
// before anybody else sees it, and files made by open(2) cannot take seals.
// Each end serves the memory it maps over a Unix socket beside the lock
// file, which the other end's process reaches through the shared
// directory whatever network namespace it is in:
//
//	<Dir>/<name>        lock file, empty: byte 0 serialises Open
//	<Dir>/<name>.sock0  side 0's process hands its link memory (SCM_RIGHTS)
//	<Dir>/<name>.sock1  side 1's
//	<Dir>/<name>.bell0  FIFOs, see bell_linux.go
//	<Dir>/<name>.bell1
//
// Open takes the lock, asks both sockets, and maps the memory its peer
// serves, or creates a new one if no peer answers. The side locks and the
// liveness checks (layout.go) sit on the memfd itself, which nobody can
// remove or replace. The files in Dir are only a meeting point: removed or
// replaced under a running pair, they are put back by each end's monitor
// at its next beat, and logged; the link never notices. If an end restarts
// meanwhile and, finding nobody, creates memory of its own, the two ends
// hold different memory: each end whose peer is not attached to its memory
// asks the peer's socket, and side 1 moves onto side 0's memory (adopt),
// so the pair meets again within a few beats.

// fetchTimeout bounds a request to a socket whose server does not answer.
const fetchTimeout = time.Second

// sealsWanted are the seals of every link memory: its size is fixed for
// good, its contents stay writable.
const sealsWanted = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL

// sockPath is where side serves the memory of the link whose lock file is
// at link.
func sockPath(link string, side int) string { return fmt.Sprintf("%s.sock%d", link, side) }

// newLinkMemory creates the memory of a link: fileSize(window) bytes, the
// header stamped, the size sealed.
func newLinkMemory(name string, window int) (_ *os.File, err error) {
	fd, err := unix.MemfdCreate("ntstack-"+name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("create link memory: %w", err)
	}
	f := os.NewFile(uintptr(fd), "memfd:ntstack-"+name)
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	if err := f.Truncate(int64(fileSize(window))); err != nil {
		return nil, fmt.Errorf("size link memory: %w", err)
	}
	if err := stampHeader(f, window); err != nil {
		return nil, fmt.Errorf("stamp link memory: %w", err)
	}
	if err := sealSize(f); err != nil {
		return nil, err
	}
	return f, nil
}

// sealSize fixes the size of f, a memfd made with MFD_ALLOW_SEALING.
func sealSize(f *os.File) error {
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, sealsWanted); err != nil {
		return fmt.Errorf("seal the size of %s: %w", f.Name(), err)
	}
	return nil
}

func stampHeader(f *os.File, window int) error {
	var hdr [16]byte
	le.PutUint32(hdr[offFileMagic:], fileMagic)
	le.PutUint32(hdr[offFileVersion:], fileVersion)
	le.PutUint64(hdr[offFileWindow:], uint64(window))
	_, err := f.WriteAt(hdr[:], 0)
	return err
}

// checkLinkMemory verifies that f, received from another process, is link
// memory this end may map: its size sealed, that size, and its header.
func checkLinkMemory(f *os.File, window int) error {
	seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("link memory takes no seals (not a memfd): %w", err)
	}
	if seals&sealsWanted != sealsWanted {
		return fmt.Errorf("link memory size not sealed (seals %#x)", seals)
	}
	var hdr [16]byte
	if _, err := f.ReadAt(hdr[:], 0); err != nil {
		return fmt.Errorf("read link header: %w", err)
	}
	magic, version, size := le.Uint32(hdr[offFileMagic:]), le.Uint32(hdr[offFileVersion:]), le.Uint64(hdr[offFileWindow:])
	switch {
	case magic != fileMagic:
		return fmt.Errorf("magic %#x is not an ntstack link", magic)
	case version != fileVersion:
		return fmt.Errorf("layout version %d, this build speaks %d", version, fileVersion)
	case size != uint64(window):
		return fmt.Errorf("window size %d, this end asks for %d", size, window)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("stat link memory: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != int64(fileSize(window)) {
		return fmt.Errorf("link memory of %d bytes, a %d-byte window needs %d", st.Size, window, fileSize(window))
	}
	return nil
}

// fetch asks the process serving sock for its link memory and which side
// it holds. The descriptor is unchecked (checkLinkMemory).
func fetch(sock string) (*os.File, int, error) {
	f, side, c, err := fetchHeld(sock)
	if c != nil {
		c.Close()
	}
	return f, side, err
}

// fetchHeld is fetch that also returns the connection, open: the server
// takes its closing for the news that this end has attached (runServe),
// so Open closes it once its monitor runs.
func fetchHeld(sock string) (_ *os.File, _ int, _ net.Conn, err error) {
	// Where no socket is, nobody serves: a look at the path costs a
	// fraction of a failed dial, which Open makes for every side nobody
	// has attached.
	if _, err := os.Lstat(sock); err != nil {
		return nil, 0, nil, err
	}
	c, err := net.DialTimeout("unix", sock, fetchTimeout)
	if err != nil {
		return nil, 0, nil, err
	}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	uc := c.(*net.UnixConn)
	uc.SetDeadline(time.Now().Add(fetchTimeout))
	var b [1]byte
	oob := make([]byte, unix.CmsgSpace(4*4)) // room to see a sender that sends more than one
	n, oobn, _, _, err := uc.ReadMsgUnix(b[:], oob)
	if err != nil {
		return nil, 0, nil, fmt.Errorf("read %s: %w", sock, err)
	}
	var fds []int
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if got, err := unix.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	if n != 1 || len(fds) != 1 || b[0] > 1 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return nil, 0, nil, fmt.Errorf("%s: no link memory in the answer (%d bytes, %d descriptors)", sock, n, len(fds))
	}
	uc.SetDeadline(time.Time{})
	return os.NewFile(uintptr(fds[0]), "memfd from "+sock), int(b[0]), c, nil
}

// sameFile reports whether a and b are one file.
func sameFile(a, b *os.File) bool {
	var sa, sb unix.Stat_t
	if unix.Fstat(int(a.Fd()), &sa) != nil || unix.Fstat(int(b.Fd()), &sb) != nil {
		return false
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino
}

// server serves this end's link memory on its socket.
type server struct {
	ln       *net.UnixListener
	dev, ino uint64 // the socket file it listens on
	done     chan struct{}
}

// listen serves the link memory on this side's socket, replacing whatever
// is at its path: the caller knows nobody answers there.
func (d *Device) listen() error {
	path := sockPath(d.path, d.side)
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("serve link memory: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return fmt.Errorf("serve link memory: %w", err)
	}
	ln.SetUnlinkOnClose(false) // Close removes it only if it is still ours
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		ln.Close()
		return fmt.Errorf("serve link memory: %w", err)
	}
	if err := os.Chmod(path, 0o660); err != nil {
		ln.Close()
		return fmt.Errorf("serve link memory: %w", err)
	}
	srv := &server{ln: ln, dev: st.Dev, ino: st.Ino, done: make(chan struct{})}
	go d.runServe(srv)
	d.srv = srv
	return nil
}

// runServe hands the link memory to every process that connects, until
// the listener closes. Accept errors (out of descriptors) back off. A
// process that attaches the other end holds its connection open until it
// has (see Open), so its closing has the monitor look at once: the link
// comes up when the peer arrives, not at our next beat. A connection held
// longer than fetchTimeout is dropped.
func (d *Device) runServe(srv *server) {
	defer close(srv.done)
	var backoff time.Duration
	for {
		c, err := srv.ln.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			d.logf("%s: serve link memory: %v; retrying in %v", d.Name(), err, backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		d.fmu.Lock()
		var rights []byte
		if d.file != nil {
			rights = unix.UnixRights(int(d.file.Fd()))
		}
		c.SetWriteDeadline(time.Now().Add(fetchTimeout))
		sent := false
		if rights != nil {
			_, _, err = c.WriteMsgUnix([]byte{byte(d.side)}, rights, nil)
			sent = err == nil
		}
		d.fmu.Unlock()
		if sent {
			var b [1]byte
			c.SetReadDeadline(time.Now().Add(fetchTimeout))
			_, _ = c.Read(b[:]) // end of file once the fetcher has attached, or gave up
			d.checkNow()
		}
		c.Close()
	}
}

// closeServer stops serving and removes the socket if it is still ours.
func (d *Device) closeServer() {
	srv := d.srv
	if srv == nil {
		return
	}
	d.srv = nil
	srv.ln.Close()
	<-srv.done
	path := sockPath(d.path, d.side)
	var st unix.Stat_t
	if unix.Stat(path, &st) == nil && st.Dev == srv.dev && st.Ino == srv.ino {
		os.Remove(path)
	}
}

// checkPaths puts back the files of the meeting point removed or replaced
// under a running link, and says so. Monitor goroutine only. A directory
// removed whole is left so: the fabric was taken down (a rack's teardown,
// an operator's rm -r), and putting the files back would create it again
// and leave it behind once this end closes.
func (d *Device) checkPaths() {
	if d.path == "" {
		return
	}
	if _, err := os.Stat(filepath.Dir(d.path)); err != nil {
		if !d.dirGone {
			d.logf("%s: link directory %s removed; its files are not put back (the link memory is a sealed memfd and did not move)", d.Name(), filepath.Dir(d.path))
		}
		d.dirGone = true
		return
	}
	d.dirGone = false
	var st unix.Stat_t
	if err := unix.Stat(d.path, &st); err != nil || d.lockDev != st.Dev || d.lockIno != st.Ino {
		why := "replaced"
		if err != nil {
			why = "removed"
		}
		if err := d.openLockFile(); err != nil {
			d.logf("%s: link file %s %s; cannot put it back: %v", d.Name(), d.path, why, err)
		} else {
			d.logf("%s: link file %s %s; put back (the link memory is a sealed memfd and did not move)", d.Name(), d.path, why)
		}
	}
	sock := sockPath(d.path, d.side)
	if srv := d.srv; srv != nil {
		why := ""
		if err := unix.Stat(sock, &st); err != nil {
			why = "removed"
		} else if srv.dev != st.Dev || srv.ino != st.Ino {
			why = "replaced"
		}
		if why == "" {
			return
		}
		d.closeServer()
		if err := d.listen(); err != nil {
			d.logf("%s: link socket %s %s; cannot serve it again: %v", d.Name(), sock, why, err)
		} else {
			d.logf("%s: link socket %s %s; serving the link memory there again", d.Name(), sock, why)
		}
	}
}

// leave removes the lock file if no end is left attached: it holds
// nothing, and the ends put it back while they run, so without this a
// link whose owners removed its files (a direct link) would leave one
// behind. Close only, once this end no longer serves.
func (d *Device) leave() {
	if d.lockFile == nil || d.file == nil {
		return
	}
	if lockByte(d.lockFile, lockInit, true) != nil {
		return
	}
	defer unlockByte(d.lockFile, lockInit)
	if d.peerAttached() {
		return
	}
	var st unix.Stat_t
	if unix.Stat(d.path, &st) == nil && st.Dev == d.lockDev && st.Ino == d.lockIno {
		os.Remove(d.path)
	}
}

// openLockFile opens (creating it if need be) the lock file at d.path and
// keeps it, so that checkPaths can tell when the path names another file.
func (d *Device) openLockFile() error {
	if err := os.MkdirAll(filepath.Dir(d.path), 0o770); err != nil {
		return err
	}
	f, err := os.OpenFile(d.path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW, 0o660)
	if err != nil {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		f.Close()
		return fmt.Errorf("%s is not a regular file", d.path)
	}
	if d.lockFile != nil {
		d.lockFile.Close()
	}
	d.lockFile, d.lockDev, d.lockIno = f, st.Dev, st.Ino
	return nil
}

// meetPeer is the monitor's look for a peer not attached to our memory:
// it asks the peer's socket, and if the peer serves other memory, side 1
// moves onto it (side 0 waits for its peer to do so). It says what it
// found, for the link's reason ("" if nothing), and whether it moved.
func (d *Device) meetPeer() (string, bool) {
	if d.path == "" {
		return "", false
	}
	f, side, err := fetch(sockPath(d.path, 1-d.side))
	if err != nil {
		return "", false
	}
	defer f.Close()
	d.fmu.Lock()
	same := sameFile(f, d.file)
	d.fmu.Unlock()
	if side != 1-d.side || same {
		return "", false
	}
	if d.side == 0 {
		return "the peer serves other link memory; waiting for it to move onto ours", false
	}
	if err := checkLinkMemory(f, d.window); err != nil {
		d.logf("%s: the peer serves link memory this end refuses: %v", d.Name(), err)
		return "the peer serves link memory this end refuses: " + err.Error(), false
	}
	if err := d.adopt(f); err != nil {
		d.logf("%s: move onto the peer's link memory: %v", d.Name(), err)
		return "cannot move onto the peer's link memory: " + err.Error(), false
	}
	d.logf("%s: the peer serves other link memory (an end restarted while the other's socket was missing); moved onto it", d.Name())
	return "moved onto the peer's link memory", true
}

// adopt maps f, link memory checked by the caller, in place of ours, at
// the same addresses, so that every slice handed out stays valid, and
// claims our side of it. The link is down meanwhile (the peer is not
// attached to our memory), so no session runs; a straggler of the last
// one writes into the new memory, whose owner formats its window before
// it lets a new session in. Monitor goroutine only.
func (d *Device) adopt(f *os.File) error {
	own, err := reopen(f)
	if err != nil {
		return err
	}
	if err := claimSideLock(own, d.side); err != nil {
		own.Close()
		return fmt.Errorf("claim side %d: %w", d.side, err)
	}
	if err := remapShared(d.mem, int(own.Fd())); err != nil {
		own.Close()
		return err
	}
	d.fmu.Lock()
	old := d.file
	d.file = own
	d.fmu.Unlock()
	old.Close() // drops our locks on the memory we left
	d.mu.Lock()
	d.stampRegsLocked()
	d.mu.Unlock()
	d.wakeLocal() // futex sleepers wait on the old memory's words
	return nil
}

// reopen opens f afresh through /proc/self/fd: a descriptor of its own open
// file description, so that our byte-range locks are ours even while
// another process holds a descriptor of the same description.
func reopen(f *os.File) (*os.File, error) {
	own, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("reopen descriptor: %w", err)
	}
	return own, nil
}

// claimSideLock takes side's lock on f without waiting.
func claimSideLock(f *os.File, side int) error {
	lk := unix.Flock_t{Type: unix.F_WRLCK, Whence: 0, Start: int64(lockSide + side), Len: 1}
	return unix.FcntlFlock(f.Fd(), unix.F_OFD_SETLK, &lk)
}
