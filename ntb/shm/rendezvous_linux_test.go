package shm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/ntbtest"
)

// logBuf collects a device's Logf lines.
type logBuf struct {
	mu    sync.Mutex
	lines []string
}

func (l *logBuf) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

func (l *logBuf) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

// memOf identifies d's link memory, which its monitor may replace (adopt).
func memOf(d *Device) [2]uint64 {
	d.fmu.Lock()
	defer d.fmu.Unlock()
	return fileID(d.file)
}

func fileID(f *os.File) [2]uint64 {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return [2]uint64{}
	}
	return [2]uint64{st.Dev, st.Ino}
}

// touchAll reads and writes every page of b: a page past the end of a
// truncated file would kill the test with SIGBUS.
func touchAll(b []byte) {
	for i := 0; i < len(b); i += pageSize {
		b[i] = b[i] + 1
	}
}

// The link's memory cannot be truncated, by path or through /proc, nor
// its seals removed; truncating the lock file at the link's path changes
// nothing, and both ends keep the link up and their windows mapped.
func TestTruncateRefused(t *testing.T) {
	dir := testDir(t)
	a, b := openPair(t, Options{Dir: dir, WindowSize: 64 << 10})
	defer a.Close()
	defer b.Close()
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	ntbtest.WaitLink(t, b, ntb.LinkUp, ntbtest.LivenessTimeout)

	// Through /proc, as any process allowed to open another's descriptors.
	a.fmu.Lock()
	f, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), a.file.Fd()), os.O_RDWR, 0)
	a.fmu.Unlock()
	require.NoError(t, err)
	defer f.Close()
	require.ErrorIs(t, f.Truncate(0), unix.EPERM, "shrinking the link memory")
	require.ErrorIs(t, f.Truncate(int64(fileSize(128<<10))), unix.EPERM, "growing the link memory")
	_, err = unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, unix.F_SEAL_WRITE)
	require.ErrorIs(t, err, unix.EPERM, "sealing it further")
	// The file at the link's path holds no memory.
	require.NoError(t, os.Truncate(filepath.Join(dir, "l"), 0))
	touchAll(a.InboundWindow())
	touchAll(a.OutboundWindow())
	touchAll(b.InboundWindow())
	require.Equal(t, ntb.LinkUp, a.Link())
	require.Equal(t, ntb.LinkUp, b.Link())
}

// A link's directory removed whole under a running pair (a rack torn down
// while an end lingers) is not made again: the link stays up, and once
// both ends have closed nothing is left behind.
func TestRemovedDirStaysRemoved(t *testing.T) {
	dir := testDir(t)
	var logA, logB logBuf
	o := Options{Dir: dir, WindowSize: 64 << 10}
	oa, ob := o, o
	oa.Logf, ob.Logf = logA.logf, logB.logf
	a, err := Open("l", oa)
	require.NoError(t, err)
	b, err := Open("l", ob)
	require.NoError(t, err)
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)

	require.NoError(t, os.RemoveAll(dir))
	a.checkNow()
	b.checkNow()
	waitfor.True(t, "both ends' log of the removal", func() bool {
		return logA.has("link directory") && logB.has("link directory")
	})
	require.Equal(t, ntb.LinkUp, a.Link(), "removing the directory does not touch the link")
	require.NoError(t, a.Close())
	require.NoError(t, b.Close())
	_, err = os.Stat(dir)
	require.ErrorIs(t, err, os.ErrNotExist, "the directory was made again")
}

// A link's files removed under a running pair are put back and logged; an
// end that restarts then finds the other's memory, and the link comes up.
func TestRemovedFilesPutBack(t *testing.T) {
	dir := testDir(t)
	var logA logBuf
	o := Options{Dir: dir, WindowSize: 64 << 10}
	oa := o
	oa.Logf = logA.logf
	a, err := Open("l", oa)
	require.NoError(t, err)
	defer a.Close()
	b, err := Open("l", o)
	require.NoError(t, err)
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)

	require.NoError(t, Remove(dir, "l"))
	waitfor.True(t, "the lock file and a's socket put back", func() bool {
		_, err1 := os.Stat(filepath.Join(dir, "l"))
		_, err2 := os.Stat(sockPath(filepath.Join(dir, "l"), 0))
		return err1 == nil && err2 == nil
	})
	waitfor.True(t, "a's log of the removal", func() bool { return logA.has("link socket") && logA.has("removed; serving") })
	t.Logf("a logged: %q", logA.lines)
	require.Equal(t, ntb.LinkUp, a.Link(), "removing the files does not touch the link")

	// b restarts: it finds a's memory.
	require.NoError(t, b.Close())
	ntbtest.WaitLink(t, a, ntb.LinkDown, ntbtest.LivenessTimeout)
	o.Side = Side1
	b, err = Open("l", o)
	require.NoError(t, err)
	defer b.Close()
	require.True(t, memOf(a) == memOf(b), "the restarted end maps the survivor's memory")
	ntbtest.WaitLink(t, a, ntb.LinkUp, ntbtest.LivenessTimeout)
	ntbtest.WaitLink(t, b, ntb.LinkUp, ntbtest.LivenessTimeout)

	// A replaced socket is put back too.
	sock := sockPath(filepath.Join(dir, "l"), 0)
	require.NoError(t, os.Remove(sock))
	require.NoError(t, os.WriteFile(sock, nil, 0o600))
	waitfor.True(t, "a's log of the replacement", func() bool { return logA.has("replaced; serving") })
	waitfor.True(t, "a's socket served again", func() bool {
		f, side, err := fetch(sock)
		if err != nil {
			return false
		}
		defer f.Close()
		return side == 0 && fileID(f) == memOf(a)
	})

	// The last end to close takes the lock file and the sockets with it;
	// only the FIFOs stay, for Remove.
	require.NoError(t, b.Close())
	require.NoError(t, a.Close())
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	for _, e := range entries {
		require.Contains(t, e.Name(), ".bell", "left behind after both ends closed")
	}
}

// An end that restarts while the other's socket is gone makes memory of
// its own; the pair meets again on side 0's memory, whichever side
// survived, and side 1 says so.
func TestSplitMemoryConverges(t *testing.T) {
	for _, survivor := range []Side{Side0, Side1} {
		t.Run(fmt.Sprintf("survivor side %d", survivor-Side0), func(t *testing.T) {
			dir := testDir(t)
			var logs [2]logBuf
			// The survivor looks at its files only when told (checkNow):
			// its next beat is far off, so the newcomer surely opens while
			// the survivor's socket is gone.
			s := int(survivor - Side0)
			o := Options{Dir: dir, WindowSize: 64 << 10, Side: survivor, HeartbeatInterval: time.Minute, HeartbeatTimeout: 10 * time.Minute, Logf: logs[s].logf}
			old, err := Open("l", o)
			require.NoError(t, err)
			defer old.Close()
			// Its first beat, which looks at the files, is done once it counted.
			waitfor.True(t, "the survivor's first beat", func() bool { return old.remote.Load64(regHeartbeat) != 0 })
			require.NoError(t, os.Remove(sockPath(filepath.Join(dir, "l"), s)))
			nu, err := Open("l", Options{Dir: dir, WindowSize: 64 << 10, Side: Side1 - survivor + Side0, Logf: logs[1-s].logf})
			require.NoError(t, err)
			defer nu.Close()
			require.False(t, memOf(old) == memOf(nu), "the newcomer found nobody and made its own memory")

			// The survivor puts its socket back; side 1 moves onto side 0's memory.
			waitfor.True(t, "both ends up on one memory", func() bool {
				old.checkNow()
				return old.Link() == ntb.LinkUp && nu.Link() == ntb.LinkUp
			})
			require.True(t, memOf(old) == memOf(nu))
			require.True(t, logs[1].has("moved onto it"), "side 1 logs the move: %q", logs[1].lines)
			require.False(t, logs[0].has("moved onto it"), "side 0 keeps its memory: %q", logs[0].lines)
			// Both map the one memory: what one writes the other reads, and
			// a ring wakes the other.
			for i, pair := range [][2]*Device{{old, nu}, {nu, old}} {
				from, to := pair[0], pair[1]
				require.NoError(t, from.SetPeerScratchpad(5, uint32(0xabc0+i)))
				v, err := to.Scratchpad(5)
				require.NoError(t, err)
				require.Equal(t, uint32(0xabc0+i), v)
				from.OutboundWindow()[100] = byte(7 + i)
				require.Equal(t, byte(7+i), to.InboundWindow()[100])
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				require.NoError(t, from.RingPeer(1<<9))
				bits, err := to.WaitDoorbell(ctx, 1<<9)
				cancel()
				require.NoError(t, err)
				require.Equal(t, uint64(1<<9), bits)
				to.ClearDoorbells(1 << 9)
			}
			for _, d := range []*Device{old, nu} {
				touchAll(d.InboundWindow())
				touchAll(d.OutboundWindow())
			}
		})
	}
}

// Memory served by something other than a link end is refused: a file
// whose size can change under the mapping, or nothing at all.
func TestUnsealedMemoryRefused(t *testing.T) {
	dir := testDir(t)
	link := filepath.Join(dir, "l")
	window := 64 << 10
	plain, err := os.OpenFile(filepath.Join(dir, "plain"), os.O_RDWR|os.O_CREATE, 0o600)
	require.NoError(t, err)
	defer plain.Close()
	require.NoError(t, plain.Truncate(int64(fileSize(window))))
	require.NoError(t, stampHeader(plain, window))

	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: sockPath(link, 0), Net: "unix"})
	require.NoError(t, err)
	defer ln.Close()
	served := make(chan struct{})
	go func() {
		defer close(served)
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			c.WriteMsgUnix([]byte{0}, unix.UnixRights(int(plain.Fd())), nil)
			c.Close()
		}
	}()
	_, err = Open("l", Options{Dir: dir, WindowSize: window, Side: Side1})
	require.ErrorContains(t, err, "not sealed")
	ln.Close()
	<-served

	// An unsealed memfd is refused the same way.
	fd, err := unix.MemfdCreate("t", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	mf := os.NewFile(uintptr(fd), "memfd")
	defer mf.Close()
	require.NoError(t, mf.Truncate(int64(fileSize(window))))
	require.NoError(t, stampHeader(mf, window))
	err = checkLinkMemory(mf, window)
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "not sealed"), err.Error())
	require.False(t, errors.Is(checkLinkMemory(mf, window), nil))
}
