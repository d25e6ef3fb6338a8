package monitor

import (
	"errors"
	"os"
	"sort"
	"sync"
	"syscall"

	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// The range ports are allocated from when a listener asks for port 0: the
// IANA dynamic range, as the kernel's ephemeral ports.
const (
	EphemeralFirst = 49152
	EphemeralLast  = 65535
)

// portTable holds the host's port reservations, in memory only.
type portTable struct {
	// mu protects the following fields.
	mu   sync.Mutex
	held map[int]ctlapi.ListenEntry
	next int // where the next allocation starts looking
}

func newPortTable() *portTable {
	return &portTable{held: make(map[int]ctlapi.ListenEntry), next: EphemeralFirst}
}

// reserve reserves req.Port, or a free ephemeral port if it is 0.
func (t *portTable) reserve(req ctlapi.ListenRequest) (int, error) {
	if req.Port < 0 || req.Port > 65535 {
		return 0, ctlapi.Errorf(ctlapi.CodeBadRequest, "listen: port %d outside 0..65535", req.Port)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if req.Port != 0 {
		// The same process asking again is an application re-registering
		// its listener after an ntproxy restart (the same user too: a pid
		// reused by another user's process takes nothing); a holder that
		// has exited left its reservation behind with a killed ntproxy.
		if e, ok := t.held[req.Port]; ok && (e.PID != req.PID || e.UID != req.UID) && pidAlive(e.PID) {
			return 0, ctlapi.Errorf(ctlapi.CodePortInUse, "listen on port %d: held by pid %d (uid %d)", req.Port, e.PID, e.UID)
		}
		t.held[req.Port] = ctlapi.ListenEntry{Port: req.Port, UID: req.UID, PID: req.PID}
		return req.Port, nil
	}
	const span = EphemeralLast - EphemeralFirst + 1
	for i := range span {
		p := EphemeralFirst + (t.next-EphemeralFirst+i)%span
		if _, ok := t.held[p]; ok {
			continue
		}
		t.held[p] = ctlapi.ListenEntry{Port: p, UID: req.UID, PID: req.PID}
		t.next = p + 1
		if t.next > EphemeralLast {
			t.next = EphemeralFirst
		}
		return p, nil
	}
	return 0, ctlapi.Errorf(ctlapi.CodeQuota, "listen: all %d ports of %d..%d are reserved", span, EphemeralFirst, EphemeralLast)
}

// anyUID is release's uid for a caller that may release any user's
// reservation (root).
const anyUID = -1

// release drops a reservation. A uid other than anyUID must be the
// holder's, and a PID other than 0 too.
func (t *portTable) release(req ctlapi.ListenRequest, uid int) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.held[req.Port]
	if !ok {
		return ctlapi.Errorf(ctlapi.CodeBadRequest, "unlisten port %d: not reserved", req.Port)
	}
	if uid != anyUID && e.UID != uid {
		return ctlapi.Errorf(ctlapi.CodeDenied, "unlisten port %d: held by uid %d, not %d", req.Port, e.UID, uid)
	}
	if req.PID != 0 && e.PID != req.PID {
		return ctlapi.Errorf(ctlapi.CodeDenied, "unlisten port %d: held by pid %d, not %d", req.Port, e.PID, req.PID)
	}
	delete(t.held, req.Port)
	return nil
}

// list returns the reservations by port.
func (t *portTable) list() []ctlapi.ListenEntry {
	t.mu.Lock()
	out := make([]ctlapi.ListenEntry, 0, len(t.held))
	for _, e := range t.held {
		out = append(out, e)
	}
	t.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Port < out[j].Port })
	return out
}

// pidAlive reports whether a process with this pid exists (ntmon shares the
// applications' pid namespace).
func pidAlive(pid int) bool {
	if pid <= 0 {
		return true
	}
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	return !errors.Is(p.Signal(syscall.Signal(0)), os.ErrProcessDone)
}
