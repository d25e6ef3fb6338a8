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
func SendFile(c *net.UnixConn, msg []byte, f *os.File) error {
	oob := unix.UnixRights(int(f.Fd()))
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
	oob := make([]byte, unix.CmsgSpace(4*4))
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
	if len(fds) == 0 {
		return n, nil, nil
	}
	for _, fd := range fds[1:] {
		unix.Close(fd)
	}
	return n, os.NewFile(uintptr(fds[0]), name), nil
}

// Yield gives up the CPU to another runnable thread on it, if any
// (sched_yield). A goroutine that polls shared memory calls it now and then
// so that a process it waits for, sharing its CPU, runs now rather than at
// the next scheduler tick.
func Yield() { unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
