package proc

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// CapNetBindService is CAP_NET_BIND_SERVICE's bit in a capability set
// (linux/capability.h): binding ports below 1024.
const CapNetBindService = 10

// FirstUnprivilegedPort is the lowest port anyone may listen on; the ports
// below need MayBindPrivileged, as the kernel's own rule for its sockets.
const FirstUnprivilegedPort = 1024

// MayBindPrivileged reports whether the process c names may listen on a
// port below FirstUnprivilegedPort: uid 0, or CAP_NET_BIND_SERVICE in its
// effective set (read from /proc, so the process must be alive and in
// this pid namespace). The error says why not.
func MayBindPrivileged(c Cred) error {
	if c.UID == 0 {
		return nil
	}
	caps, err := EffectiveCaps(c.PID)
	if err != nil {
		return fmt.Errorf("uid %d is not root, and pid %d's capabilities are unknown: %w", c.UID, c.PID, err)
	}
	if caps&(1<<CapNetBindService) == 0 {
		return fmt.Errorf("uid %d is not root, and pid %d lacks CAP_NET_BIND_SERVICE", c.UID, c.PID)
	}
	return nil
}

// capEff returns the CapEff line of a /proc/<pid>/status listing.
func capEff(status io.Reader) (uint64, error) {
	sc := bufio.NewScanner(status)
	for sc.Scan() {
		key, value, ok := strings.Cut(sc.Text(), ":")
		if ok && key == "CapEff" {
			v, err := strconv.ParseUint(strings.TrimSpace(value), 16, 64)
			if err != nil {
				return 0, fmt.Errorf("CapEff %q: %w", strings.TrimSpace(value), err)
			}
			return v, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("no CapEff line")
}
