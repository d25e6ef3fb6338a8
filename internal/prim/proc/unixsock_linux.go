package proc

import (
	"errors"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// Cred is the identity of the process at the other end of a Unix socket,
// as the kernel recorded it when the socket connected.
type Cred struct {
	PID, UID, GID int
}

// PeerCred returns the credentials of c's peer (SO_PEERCRED).
func PeerCred(c *net.UnixConn) (Cred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return Cred{}, fmt.Errorf("peer credentials: %w", err)
	}
	var uc *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		uc, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return Cred{}, fmt.Errorf("peer credentials: %w", err)
	}
	if serr != nil {
		return Cred{}, fmt.Errorf("peer credentials: %w", serr)
	}
	return Cred{PID: int(uc.Pid), UID: int(uc.Uid), GID: int(uc.Gid)}, nil
}

// SendFile writes msg on c with f's descriptor attached (SCM_RIGHTS).
func SendFile(c *net.UnixConn, msg []byte, f *os.File) error { return SendFiles(c, msg, f) }

// SendFiles writes msg on c with the files' descriptors attached, in order.
func SendFiles(c *net.UnixConn, msg []byte, files ...*os.File) error {
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	oob := unix.UnixRights(fds...)
	n, oobn, err := c.WriteMsgUnix(msg, oob, nil)
	if err == nil && (n != len(msg) || oobn != len(oob)) {
		err = errors.New("short write")
	}
	if err != nil {
		return fmt.Errorf("send descriptor: %w", err)
	}
	return nil
}

// RecvFile reads one message of at most len(buf) bytes from c and the
// descriptor that came with it, if any (nil otherwise). Extra descriptors
// are closed; a truncated message or descriptor list is an error.
func RecvFile(c *net.UnixConn, buf []byte, name string) (int, *os.File, error) {
	n, files, err := RecvFiles(c, buf, name)
	if err != nil || len(files) == 0 {
		return n, nil, err
	}
	return n, files[0], nil
}

// RecvFiles is RecvFile for up to len(names) descriptors, named in order;
// it returns those that came.
func RecvFiles(c *net.UnixConn, buf []byte, names ...string) (int, []*os.File, error) {
	oob := make([]byte, unix.CmsgSpace(4*(len(names)+4)))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return 0, nil, fmt.Errorf("receive descriptor: %w", err)
	}
	var fds []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return 0, nil, fmt.Errorf("receive descriptor: %w", err)
		}
		for _, m := range msgs {
			got, err := unix.ParseUnixRights(&m)
			if err == nil {
				fds = append(fds, got...)
			}
		}
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		for _, fd := range fds {
			unix.Close(fd)
		}
		return 0, nil, errors.New("receive descriptor: message truncated")
	}
	var files []*os.File
	for i, fd := range fds {
		if i >= len(names) {
			unix.Close(fd)
			continue
		}
		files = append(files, os.NewFile(uintptr(fd), names[i]))
	}
	return n, files, nil
}

// Yield gives up the CPU to another runnable thread on it, if any
// (sched_yield). A goroutine that polls shared memory calls it now and then
// so that a process it waits for, sharing its CPU, runs now rather than at
// the next scheduler tick.
func Yield() { unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
