package redirect

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Redirect owns the rule map, the two programs and their links to one
// cgroup. Its methods are safe for concurrent use.
type Redirect struct {
	cgroup string

	// mu protects the following fields; Close takes it for writing, the
	// map operations for reading.
	mu     sync.RWMutex
	closed bool
	rules  *ebpf.Map
	progs  []*ebpf.Program
	links  []link.Link
}

// Attach loads the connect4 and connect6 programs and attaches them to the
// cgroup2 directory cgroupPath, with no rules yet. Processes in that cgroup
// and its descendants are affected, for connects they start from then on.
// The error matches ErrNotSupported if cgroupPath is not in a cgroup2 file
// system, the kernel lacks the hooks, or BPF is not permitted.
func Attach(cgroupPath string) (_ *Redirect, err error) {
	if err := checkCgroup2(cgroupPath); err != nil {
		return nil, fmt.Errorf("attach redirect: %w", err)
	}
	r := &Redirect{cgroup: cgroupPath}
	defer func() {
		if err != nil {
			r.Close() // undo partial setup
		}
	}()

	r.rules, err = ebpf.NewMap(&ebpf.MapSpec{
		Name:       "ntredir_rules",
		Type:       ebpf.Hash,
		KeySize:    keySize,
		ValueSize:  valueSize,
		MaxEntries: MaxRules,
	})
	if err != nil {
		return nil, fmt.Errorf("attach redirect: create rule map: %w", classify("bpf hash maps", err))
	}
	for _, ipv6 := range []bool{false, true} {
		spec := connectSpec(r.rules.FD(), ipv6)
		prog, err := ebpf.NewProgram(spec)
		if err != nil {
			return nil, fmt.Errorf("attach redirect: load %s: %w", spec.Name, classify("bpf cgroup sock_addr programs", err))
		}
		r.progs = append(r.progs, prog)
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroupPath, Attach: spec.AttachType, Program: prog})
		if err != nil {
			return nil, fmt.Errorf("attach redirect: attach %s to %s: %w", spec.Name, cgroupPath, classify("bpf "+spec.AttachType.String()+" hook", err))
		}
		r.links = append(r.links, l)
	}
	return r, nil
}

// checkCgroup2 reports whether path is a directory of a cgroup2 hierarchy,
// recognised by its cgroup.controllers file, which cgroup v1 lacks.
func checkCgroup2(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("cgroup %s: not a directory", path)
	}
	if _, err := os.Stat(filepath.Join(path, "cgroup.controllers")); err != nil {
		return &NotSupportedError{What: "cgroup2 at " + path + " (no cgroup.controllers; mount cgroup2 and pass a directory in it)", Err: err}
	}
	return nil
}

// classify turns a missing kernel feature or a refused permission into a
// NotSupportedError naming what.
func classify(what string, err error) error {
	switch {
	case errors.Is(err, ebpf.ErrNotSupported):
		return &NotSupportedError{What: what, Err: err}
	case errors.Is(err, os.ErrPermission):
		return &NotSupportedError{What: what + " without CAP_BPF and CAP_NET_ADMIN", Err: err}
	}
	return err
}

// Cgroup returns the cgroup directory the programs are attached to.
func (r *Redirect) Cgroup() string { return r.cgroup }

// Set makes connects to from go to to instead, replacing any rule for from
// and resetting its count. Both must be of one address family; an
// IPv4-mapped address counts as IPv4.
func (r *Redirect) Set(from, to netip.AddrPort) error {
	from, to, err := checkRule(from, to)
	if err != nil {
		return fmt.Errorf("set rule: %w", err)
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return fmt.Errorf("set rule %v: %w", from, os.ErrClosed)
	}
	if err := r.rules.Put(makeKey(from), makeValue(to)); err != nil {
		return fmt.Errorf("set rule %v: %w", from, err)
	}
	return nil
}

// Delete removes the rule for from. If there is none, the error matches
// os.ErrNotExist.
func (r *Redirect) Delete(from netip.AddrPort) error {
	from, err := checkAddrPort(from)
	if err != nil {
		return fmt.Errorf("delete rule: %w", err)
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return fmt.Errorf("delete rule %v: %w", from, os.ErrClosed)
	}
	if err := r.rules.Delete(makeKey(from)); err != nil {
		return fmt.Errorf("delete rule %v: %w", from, notExist(err))
	}
	return nil
}

// Count returns how many connects the rule for from has redirected since
// it was set. If there is no rule, the error matches os.ErrNotExist.
func (r *Redirect) Count(from netip.AddrPort) (uint64, error) {
	from, err := checkAddrPort(from)
	if err != nil {
		return 0, fmt.Errorf("count rule: %w", err)
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return 0, fmt.Errorf("count rule %v: %w", from, os.ErrClosed)
	}
	var v ruleValue
	if err := r.rules.Lookup(makeKey(from), &v); err != nil {
		return 0, fmt.Errorf("count rule %v: %w", from, notExist(err))
	}
	return v.count(), nil
}

// Counts returns the count of every rule, keyed by the rule's from.
func (r *Redirect) Counts() (map[netip.AddrPort]uint64, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.closed {
		return nil, fmt.Errorf("count rules: %w", os.ErrClosed)
	}
	counts := make(map[netip.AddrPort]uint64)
	var (
		k  ruleKey
		v  ruleValue
		it = r.rules.Iterate()
	)
	for it.Next(&k, &v) {
		counts[k.addrPort()] = v.count()
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("count rules: %w", err)
	}
	return counts, nil
}

func notExist(err error) error {
	if errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("no such rule: %w", os.ErrNotExist)
	}
	return err
}

// Close detaches the programs from the cgroup and frees them and the rule
// map. Connects started afterwards are not redirected; connections already
// redirected are unaffected. Calling Close again does nothing.
func (r *Redirect) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil
	}
	r.closed = true
	var errs []error
	for _, l := range r.links {
		if err := l.Close(); err != nil {
			errs = append(errs, fmt.Errorf("detach from %s: %w", r.cgroup, err))
		}
	}
	for _, p := range r.progs {
		if err := p.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close program: %w", err))
		}
	}
	if r.rules != nil {
		if err := r.rules.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close rule map: %w", err))
		}
	}
	r.links, r.progs, r.rules = nil, nil, nil
	return errors.Join(errs...)
}
