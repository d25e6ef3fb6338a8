package rack

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// ipCmd runs `ip args...` and returns its output. The error names the
// command and carries its output.
func ipCmd(ctx context.Context, args ...string) ([]byte, error) {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return out, nil
}

// unsupportedOutput marks ip output that means the kernel lacks a feature
// (a module not built) rather than a mistake.
var unsupportedOutput = regexp.MustCompile(`Unknown device type|Operation not supported|Protocol not supported`)

// mayBeUnsupported turns a failure of ip caused by a missing kernel feature
// into a NotSupportedError that keeps err as its reason.
func mayBeUnsupported(what string, out []byte, err error) error {
	if err != nil && unsupportedOutput.Match(out) {
		return fmt.Errorf("%w (%w)", &NotSupportedError{Reason: "kernel lacks " + what}, err)
	}
	return err
}

// setupNetwork creates the bridge, then per host the namespace and a veth
// pair joining the namespace's eth0 to the bridge, with the host's address
// on eth0 and lo up. What it creates is recorded in r.made as it goes.
func (r *Rack) setupNetwork(ctx context.Context) error {
	if out, err := ipCmd(ctx, "link", "add", r.bridge, "type", "bridge"); err != nil {
		return fmt.Errorf("create bridge %s: %w", r.bridge, mayBeUnsupported("bridge support", out, err))
	}
	r.made.bridge = true
	if _, err := ipCmd(ctx, "link", "set", r.bridge, "up"); err != nil {
		return fmt.Errorf("bring up bridge %s: %w", r.bridge, err)
	}
	for _, h := range r.hosts {
		if _, err := ipCmd(ctx, "netns", "add", h.Netns); err != nil {
			return fmt.Errorf("create netns %s: %w", h.Netns, err)
		}
		r.made.netns = append(r.made.netns, h.Netns)
		veth := fmt.Sprintf("%s-v%d", r.name, h.Index)
		if out, err := ipCmd(ctx, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", h.Netns); err != nil {
			return fmt.Errorf("create veth %s for %s: %w", veth, h.Name, mayBeUnsupported("veth support", out, err))
		}
		r.made.veths = append(r.made.veths, veth)
		steps := [][]string{
			{"link", "set", veth, "master", r.bridge, "up"},
			{"-n", h.Netns, "addr", "add", fmt.Sprintf("%s/%d", h.IP, r.subnet.Bits()), "dev", "eth0"},
			{"-n", h.Netns, "link", "set", "eth0", "up"},
			{"-n", h.Netns, "link", "set", "lo", "up"},
		}
		for _, args := range steps {
			if _, err := ipCmd(ctx, args...); err != nil {
				return fmt.Errorf("set up network of %s: %w", h.Name, err)
			}
		}
	}
	return nil
}

// teardown kills every process left in the rack's namespaces, then deletes
// the veths, namespaces and bridge Start made and the directories it made.
func (r *Rack) teardown() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var errs []error
	for _, ns := range r.made.netns {
		errs = append(errs, killNetns(ctx, ns))
	}
	for _, veth := range r.made.veths {
		errs = append(errs, delLink(ctx, veth))
	}
	for _, ns := range r.made.netns {
		errs = append(errs, delNetns(ctx, ns))
	}
	if r.made.bridge {
		errs = append(errs, delLink(ctx, r.bridge))
	}
	if r.made.fabric {
		if err := os.RemoveAll(r.fabricDir); err != nil {
			errs = append(errs, fmt.Errorf("remove fabric dir: %w", err))
		}
	}
	if !r.keepState {
		dirs := r.made.hostDirs
		if r.made.root {
			dirs = []string{r.stateRoot}
		}
		for _, d := range dirs {
			if err := os.RemoveAll(d); err != nil {
				errs = append(errs, fmt.Errorf("remove state dir: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}

// killNetns SIGKILLs every process in the namespace ns until none is left
// (zombies do not count: they have left their namespaces).
func killNetns(ctx context.Context, ns string) error {
	var pids []int
	for deadline := time.Now().Add(5 * time.Second); ; {
		if _, err := os.Stat(filepath.Join(netnsDir, ns)); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		out, err := ipCmd(ctx, "netns", "pids", ns)
		if err != nil {
			return fmt.Errorf("kill processes in netns %s: %w", ns, err)
		}
		pids = pids[:0]
		for _, f := range strings.Fields(string(out)) {
			pid, err := strconv.Atoi(f)
			if err != nil {
				return fmt.Errorf("kill processes in netns %s: bad pid %q from ip netns pids", ns, f)
			}
			pids = append(pids, pid)
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kill processes in netns %s: %v still there after 5s", ns, pids)
		}
		for _, pid := range pids {
			killPid(pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// delLink deletes a network interface; one already gone is no error.
// Deleting one end of a veth pair deletes both.
func delLink(ctx context.Context, name string) error {
	out, err := ipCmd(ctx, "link", "del", name)
	if err != nil && !bytes.Contains(out, []byte("Cannot find device")) {
		return fmt.Errorf("delete link %s: %w", name, err)
	}
	return nil
}

// delNetns deletes a named namespace; one already gone is no error.
func delNetns(ctx context.Context, ns string) error {
	if _, err := os.Stat(filepath.Join(netnsDir, ns)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if _, err := ipCmd(ctx, "netns", "del", ns); err != nil {
		return fmt.Errorf("delete netns %s: %w", ns, err)
	}
	return nil
}

// Cleanup removes what racks whose names start with prefix left behind:
// it kills the processes in their namespaces, deletes the namespaces,
// veths and bridges, and removes their fabric and state directories at the
// default places (Spec.FabricDir and Spec.StateRoot left empty). It only
// touches names of the rack pattern: namespaces "<rack>-<host>", links
// "<rack>-br" and "<rack>-v<i>", directories "ntstack-<rack>", where <rack>
// starts with prefix. A running rack with such a name is torn down too, so
// pass a whole rack name unless every matching rack is yours.
func Cleanup(prefix string) error {
	if !nameRE.MatchString(prefix) {
		return fmt.Errorf("clean up racks %q: not a rack name prefix", prefix)
	}
	if err := Supported(); err != nil {
		return fmt.Errorf("clean up racks %s: %w", prefix, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nsRE := regexp.MustCompile(`^` + prefix + `[a-z0-9]*-[A-Za-z0-9][A-Za-z0-9_-]*$`)
	linkRE := regexp.MustCompile(`^` + prefix + `[a-z0-9]*-(br|v[0-9]+)$`)
	dirRE := regexp.MustCompile(`^ntstack-` + prefix + `[a-z0-9]*$`)

	var errs []error
	out, err := ipCmd(ctx, "netns", "list")
	if err != nil {
		return fmt.Errorf("clean up racks %s: %w", prefix, err)
	}
	var namespaces []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && nsRE.MatchString(f[0]) {
			namespaces = append(namespaces, f[0])
		}
	}
	for _, ns := range namespaces {
		errs = append(errs, killNetns(ctx, ns))
	}

	out, err = ipCmd(ctx, "-o", "link", "show")
	if err != nil {
		return fmt.Errorf("clean up racks %s: %w", prefix, err)
	}
	var veths, bridges []string
	for _, line := range strings.Split(string(out), "\n") {
		// "7: ntr1-v0@if2: <BROADCAST,..."
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		name, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
		switch {
		case !linkRE.MatchString(name):
		case strings.HasSuffix(name, "-br"):
			bridges = append(bridges, name)
		default:
			veths = append(veths, name)
		}
	}
	for _, l := range append(veths, bridges...) {
		errs = append(errs, delLink(ctx, l))
	}
	for _, ns := range namespaces {
		errs = append(errs, delNetns(ctx, ns))
	}

	for _, parent := range []string{"/dev/shm", os.TempDir()} {
		ents, err := os.ReadDir(parent)
		if err != nil {
			errs = append(errs, fmt.Errorf("list %s: %w", parent, err))
			continue
		}
		for _, e := range ents {
			if e.IsDir() && dirRE.MatchString(e.Name()) {
				if err := os.RemoveAll(filepath.Join(parent, e.Name())); err != nil {
					errs = append(errs, fmt.Errorf("remove %s: %w", e.Name(), err))
				}
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("clean up racks %s: %w", prefix, err)
	}
	return nil
}
