package doctor

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/rdma"
)

// checkIOMMU: VFIO needs an IOMMU (groups under /sys/kernel/iommu_groups),
// which needs the firmware to enable it and, on Intel, a kernel parameter.
func (h *host) checkIOMMU() Result {
	r := Result{Name: "iommu"}
	groups, _ := os.ReadDir(h.path("/sys/kernel/iommu_groups"))
	cmdline, _ := os.ReadFile(h.path("/proc/cmdline"))
	var params []string
	for _, f := range strings.Fields(string(cmdline)) {
		if f == "--" {
			break // the rest belongs to init
		}
		for _, p := range []string{"intel_iommu=", "amd_iommu=", "iommu=", "iommu.passthrough="} {
			if strings.HasPrefix(f, p) {
				params = append(params, f)
			}
		}
	}
	found := "kernel command line has no intel_iommu=on, amd_iommu= or iommu=pt"
	if len(params) > 0 {
		found = "kernel command line: " + strings.Join(params, " ")
	}
	if len(groups) > 0 {
		r.Status, r.Detail = Pass, fmt.Sprintf("%d IOMMU groups; %s", len(groups), found)
		return r
	}
	r.Detail = "no IOMMU groups in /sys/kernel/iommu_groups; " + found
	if len(h.devices) > 0 {
		r.Status = Fail
		r.Detail += "\nthe NTB/ivshmem devices below cannot be opened through VFIO"
	} else {
		r.Status = Warn
		r.Detail += "\nthe emulated fabric does not need it; NTB and ivshmem devices (through VFIO) do"
	}
	r.Fix = "enable VT-d (Intel) or AMD-Vi/IOMMU (AMD) in the firmware setup, then boot with\n" +
		"  intel_iommu=on iommu=pt   (AMD: amd_iommu=on iommu=pt)\n" +
		"added to GRUB_CMDLINE_LINUX in /etc/default/grub; update-grub (or grub2-mkconfig -o /boot/grub2/grub.cfg); reboot.\n" +
		"A QEMU guest needs -machine q35,kernel-irqchip=split -device intel-iommu,caching-mode=on\n" +
		"(or, for tests only, vfio's unsafe no-IOMMU mode: see the vfio check)"
	return r
}

// vfioModules must be loaded (or built in) for vfio-pci devices.
var vfioModules = []string{"vfio", "vfio_pci", "vfio_iommu_type1"}

// checkVFIO: /dev/vfio/vfio, the VFIO modules, and no-IOMMU mode.
func (h *host) checkVFIO() Result {
	r := Result{Name: "vfio"}
	loaded := map[string]bool{}
	if f, err := os.Open(h.path("/proc/modules")); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if name, _, ok := strings.Cut(sc.Text(), " "); ok {
				loaded[name] = true
			}
		}
		f.Close()
	}
	var have, missing []string
	for _, m := range vfioModules {
		// Built-in modules have no /proc/modules line, but a /sys/module
		// directory (as loaded ones do).
		if loaded[m] || exists(h.path("/sys/module/"+m)) {
			have = append(have, m)
		} else {
			missing = append(missing, m)
		}
	}
	dev := exists(h.path("/dev/vfio/vfio"))
	noiommu, _ := readString(h.path("/sys/module/vfio/parameters/enable_unsafe_noiommu_mode"))
	unsafeMode := noiommu == "Y" || noiommu == "1"

	var found []string
	if dev {
		found = append(found, "/dev/vfio/vfio present")
	} else {
		found = append(found, "no /dev/vfio/vfio")
	}
	if len(have) > 0 {
		found = append(found, "loaded: "+strings.Join(have, ", "))
	}
	if len(missing) > 0 {
		found = append(found, "not loaded: "+strings.Join(missing, ", "))
	}
	if unsafeMode {
		found = append(found, "unsafe no-IOMMU mode ON")
	}
	r.Detail = strings.Join(found, "; ")
	// Without an IOMMU, no-IOMMU mode stands in for vfio_iommu_type1.
	ok := dev && len(missing) == 0 || dev && unsafeMode && !slices.Contains(missing, "vfio_pci")
	switch {
	case ok && unsafeMode:
		r.Status = Warn
		r.Detail += "\nno DMA isolation: a device can write anywhere in memory"
		r.Fix = "acceptable in a test VM only; on a real host enable the IOMMU (see the iommu check) and\n" +
			"  echo N > /sys/module/vfio/parameters/enable_unsafe_noiommu_mode"
	case ok:
		r.Status = Pass
	default:
		r.Status = Warn
		if len(h.devices) > 0 {
			r.Status = Fail
		} else {
			r.Detail += "\nthe emulated fabric does not need it; NTB and ivshmem devices do"
		}
		r.Fix = "modprobe vfio-pci   (it loads vfio and vfio_iommu_type1)\n" +
			"load it at boot: echo vfio-pci > /etc/modules-load.d/vfio-pci.conf\n" +
			"without an IOMMU (a test VM only): modprobe vfio enable_unsafe_noiommu_mode=1"
	}
	return r
}

// checkHugepages reports the hugetlb pool from /proc/meminfo.
func (h *host) checkHugepages() Result {
	r := Result{Name: "hugepages"}
	info, err := readMeminfo(h.path("/proc/meminfo"))
	if err != nil {
		r.Status, r.Detail = Skip, err.Error()
		return r
	}
	total, free, sizeKB := info["HugePages_Total"], info["HugePages_Free"], info["Hugepagesize"]
	r.Detail = fmt.Sprintf("HugePages_Total %d, HugePages_Free %d, Hugepagesize %s", total, free, formatBytes(sizeKB<<10))
	if total > 0 {
		r.Status = Pass
		return r
	}
	r.Status = Warn
	r.Detail += "\noptional: ntstack does not allocate hugepages today; a pool only matters once windows are backed by them"
	pages := uint64(512)
	if sizeKB > 0 {
		pages = max(1, (1<<20)/sizeKB) // 1 GiB worth
	}
	r.Fix = fmt.Sprintf("sysctl -w vm.nr_hugepages=%d   (1 GiB of %s pages)\n"+
		"persist: echo vm.nr_hugepages=%d > /etc/sysctl.d/90-ntstack.conf", pages, formatBytes(sizeKB<<10), pages)
	return r
}

// checkFabric: the emulated fabric's link files (2 windows each) live in
// proxy.fabric_dir, which should be on a tmpfs with room to spare.
func (h *host) checkFabric() Result {
	r := Result{Name: "fabric"}
	dir, window, links, sized := config.DefaultFabricDir, config.DefaultWindow, 1, " (no host config: defaults)"
	if c := h.opts.Config; c != nil {
		dir, window, links, sized = c.Proxy.FabricDir, c.Proxy.Window, ntbLinks(c), ""
	}
	windows := uint64(links) * 2 * uint64(window) // each link file holds both sides' windows
	need := 2 * windows

	fstype, mnt := h.mountOf(dir)
	// statfs the deepest directory that exists: the fabric directory is
	// created by ntproxy.
	p := dir
	for !exists(h.path(p)) && p != "/" && p != "." {
		p = filepath.Dir(p)
	}
	free, err := statfsFree(h.path(p))
	if err != nil {
		r.Status, r.Detail = Fail, err.Error()
		return r
	}
	r.Detail = fmt.Sprintf("%s on %s (%s): %s free; want 2× the windows = %s (%d link(s) × 2 sides × %s%s)",
		dir, mnt, fstype, formatBytes(free), formatBytes(need), links, formatBytes(uint64(window)), sized)
	switch {
	case free < windows:
		r.Status = Fail
		r.Fix = fmt.Sprintf("free space in %s, enlarge it (mount -o remount,size=… %s) or lower proxy.window", mnt, mnt)
	case free < need:
		r.Status = Warn
		r.Fix = fmt.Sprintf("leave room for the direct and application windows: free space in %s or enlarge it (mount -o remount,size=… %s)", mnt, mnt)
	case fstype != "tmpfs":
		r.Status = Warn
		r.Detail += "\nnot a tmpfs: the link files would be written back to a disk"
		r.Fix = "set proxy.fabric_dir to a directory on a tmpfs, such as " + config.DefaultFabricDir
	default:
		r.Status = Pass
	}
	return r
}

// mountOf returns the filesystem type and mount point holding path,
// from /proc/mounts ("?" if unknown).
func (h *host) mountOf(path string) (fstype, mountPoint string) {
	fstype, mountPoint = "?", "?"
	b, err := os.ReadFile(h.path("/proc/mounts"))
	if err != nil {
		return fstype, mountPoint
	}
	best := -1
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		mp := unescapeMount(f[1])
		if !(mp == "/" || path == mp || strings.HasPrefix(path, mp+"/")) {
			continue
		}
		if len(mp) >= best { // later mounts over the same point win
			best, fstype, mountPoint = len(mp), f[2], mp
		}
	}
	return fstype, mountPoint
}

// unescapeMount undoes /proc/mounts' octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ntbLinks counts the configured NTB links (peers with a link).
func ntbLinks(c *config.Config) int {
	n := 0
	for _, p := range c.Peers {
		if p.Link != "" {
			n++
		}
	}
	return n
}

// checkCPUs compares the CPUs this process may run on with the partition
// workers the configuration asks for.
func (h *host) checkCPUs() Result {
	r := Result{Name: "cpus", Status: Pass}
	cpus, affinity := runtime.NumCPU(), ""
	if list, err := procStatusField(h.path("/proc/self/status"), "Cpus_allowed_list"); err == nil {
		if n, err := countCPUList(list); err == nil && n > 0 {
			cpus, affinity = n, " (affinity "+list+")"
		}
	}
	partitions, links, sized := config.DefaultPartitions, 1, " (no host config: defaults)"
	if c := h.opts.Config; c != nil {
		partitions, links, sized = c.Proxy.Partitions, ntbLinks(c), ""
	}
	workers := partitions * links
	r.Detail = fmt.Sprintf("%d CPUs%s; %d partition worker(s) = %d NTB link(s) × %d partition(s)%s\n"+
		"a spinning process (partition worker, ntproxy, a polling application) needs a vCPU of its own while busy",
		cpus, affinity, workers, links, partitions, sized)
	if workers > 0 && workers >= cpus {
		r.Status = Warn
		r.Detail += fmt.Sprintf("; %d workers on %d CPUs leave none for ntproxy's other work and the applications", workers, cpus)
		r.Fix = fmt.Sprintf("lower proxy.partitions so that links × partitions < %d (both ends of a link must agree), or give the host more cores", cpus)
	}
	return r
}

// countCPUList counts the CPUs in a list such as "0-3,8,10-11".
func countCPUList(s string) (int, error) {
	n := 0
	for _, part := range strings.Split(strings.TrimSpace(s), ",") {
		if part == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return 0, fmt.Errorf("cpu list %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				return 0, fmt.Errorf("cpu list %q: %w", s, err)
			}
		}
		if b < a {
			return 0, fmt.Errorf("cpu list %q: range %s is backwards", s, part)
		}
		n += b - a + 1
	}
	return n, nil
}

// Clock sources read without a trap (or through a paravirtual page), and
// ones that make every timestamp an I/O access.
var (
	fastClocks = []string{"tsc", "kvm-clock", "arch_sys_counter", "hyperv_clocksource_tsc_page", "xen"}
	slowClocks = []string{"hpet", "acpi_pm", "jiffies", "refined-jiffies", "pit"}
)

// checkClocksource: timestamps (latency histograms, deadlines, spin
// budgets) are cheap only with a TSC-like clock source.
func (h *host) checkClocksource() Result {
	r := Result{Name: "clocksource"}
	dir := h.path("/sys/devices/system/clocksource/clocksource0")
	cur, err := readString(filepath.Join(dir, "current_clocksource"))
	if err != nil {
		r.Status, r.Detail = Skip, "no clock source in sysfs: "+err.Error()
		return r
	}
	avail, _ := readString(filepath.Join(dir, "available_clocksource"))
	r.Detail = fmt.Sprintf("current %s; available %s", cur, avail)
	switch {
	case slices.Contains(fastClocks, cur):
		r.Status = Pass
	case slices.Contains(slowClocks, cur):
		r.Status = Warn
		r.Detail += "\nslow timestamps: every time.Now is an I/O access (microseconds, not nanoseconds)"
		r.Fix = "look for \"TSC unstable\" / \"clocksource\" in dmesg"
		if slices.Contains(strings.Fields(avail), "tsc") {
			r.Fix += "; if the TSC is trustworthy:\n  echo tsc > /sys/devices/system/clocksource/clocksource0/current_clocksource\n" +
				"or boot with clocksource=tsc tsc=reliable"
		}
	default:
		r.Status = Pass
		r.Detail += " (not known to be slow)"
	}
	return r
}

// defaultTimerSlack is Linux's default timer slack, 50 µs.
const defaultTimerSlack = 50_000

// checkTimerSlack reports this process's timer slack (which ntproxy, from
// the same service manager, likely shares) and the kernel's preemption
// model. Informational: it only warns on a slack above the default.
func (h *host) checkTimerSlack() Result {
	r := Result{Name: "timer slack"}
	s, err := readString(h.path("/proc/self/timerslack_ns"))
	if err != nil {
		r.Status, r.Detail = Skip, "timer slack unknown: "+err.Error()
		return r
	}
	ns, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		r.Status, r.Detail = Skip, fmt.Sprintf("timer slack %q: %v", s, err)
		return r
	}
	r.Status = Pass
	r.Detail = fmt.Sprintf("%dµs for this process (timed sleeps may end that late)", ns/1000)
	if v, err := readString(h.path("/proc/sys/kernel/version")); err == nil {
		model := "no PREEMPT"
		for _, m := range []string{"PREEMPT_RT", "PREEMPT_DYNAMIC", "PREEMPT"} {
			if strings.Contains(v, m) {
				model = m
				break
			}
		}
		r.Detail += "; kernel " + model
	}
	if ns > defaultTimerSlack {
		r.Status = Warn
		r.Fix = "set TimerSlackNSec=50us in the ntproxy and ntmon systemd units (or prctl PR_SET_TIMERSLACK in the parent)"
	}
	return r
}

// checkCgroup2: the planned eBPF socket redirect attaches to a cgroup2
// hierarchy.
func (h *host) checkCgroup2() Result {
	r := Result{Name: "cgroup2"}
	for _, dir := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		ctl, err := readString(h.path(dir + "/cgroup.controllers"))
		if err != nil {
			continue
		}
		if ctl == "" {
			ctl = "none delegated"
		}
		mode := "unified"
		if dir != "/sys/fs/cgroup" {
			mode = "hybrid (cgroup v1 controllers at /sys/fs/cgroup)"
		}
		r.Status, r.Detail = Pass, fmt.Sprintf("cgroup2 at %s, %s; controllers: %s", dir, mode, ctl)
		return r
	}
	r.Status = Warn
	r.Detail = "no cgroup2 hierarchy (no cgroup.controllers in /sys/fs/cgroup or /sys/fs/cgroup/unified)\nonly the TCP gateway's eBPF redirect (gateway.redirect_cgroup) needs it"
	r.Fix = "boot with systemd.unified_cgroup_hierarchy=1, or mount -t cgroup2 none /sys/fs/cgroup/unified"
	return r
}

// checkBPF reports whether BPF programs can be loaded, and by whom.
func (h *host) checkBPF() Result {
	r := Result{Name: "bpf"}
	v, err := readString(h.path("/proc/sys/kernel/unprivileged_bpf_disabled"))
	if errors.Is(err, fs.ErrNotExist) {
		r.Status = Warn
		r.Detail = "no /proc/sys/kernel/unprivileged_bpf_disabled: kernel without the bpf syscall (CONFIG_BPF_SYSCALL)?\nonly the TCP gateway's eBPF redirect (gateway.redirect_cgroup) needs it"
		r.Fix = "use a kernel built with CONFIG_BPF_SYSCALL=y and CONFIG_CGROUP_BPF=y"
		return r
	}
	if err != nil {
		r.Status, r.Detail = Skip, err.Error()
		return r
	}
	r.Status = Pass
	switch v {
	case "0":
		r.Detail = "unprivileged_bpf_disabled=0: any user may load socket filters"
	case "1", "2":
		r.Detail = "unprivileged_bpf_disabled=" + v + ": only CAP_BPF/CAP_SYS_ADMIN load programs (ntmon runs as root under systemd)"
	default:
		r.Detail = "unprivileged_bpf_disabled=" + v
	}
	fstype, _ := h.mountOf("/sys/fs/bpf")
	if fstype == "bpf" {
		r.Detail += "; bpffs at /sys/fs/bpf"
	} else {
		r.Detail += "; no bpffs at /sys/fs/bpf (needed only to pin programs: mount -t bpf bpf /sys/fs/bpf)"
	}
	return r
}

// checkRDMA reports the RDMA devices (for the off-rack path) and whether
// this build and the configuration can use them.
func (h *host) checkRDMA() Result {
	r := Result{Name: "rdma"}
	listen := ""
	if h.opts.Config != nil {
		listen = h.opts.Config.Proxy.RDMA.Listen
	}
	ents, _ := os.ReadDir(h.path("/sys/class/infiniband"))
	if len(ents) == 0 {
		r.Detail = "no RDMA device in /sys/class/infiniband: off-rack hosts are reached over TCP"
		if listen == "" {
			r.Status = Skip
			return r
		}
		r.Status = Warn
		r.Detail += fmt.Sprintf("\nproxy.rdma.listen is %s, but ntmon will tell its peers this host has no RDMA", listen)
		r.Fix = "load the NIC's RDMA driver (mlx5_ib, irdma, ...); for Soft-RoCE: modprobe rdma_rxe && rdma link add rxe0 type rxe netdev <if>"
		return r
	}
	var devs []string
	active := false
	for _, e := range ents {
		ports, _ := os.ReadDir(h.path("/sys/class/infiniband/" + e.Name() + "/ports"))
		for _, p := range ports {
			state, _ := readString(h.path("/sys/class/infiniband/" + e.Name() + "/ports/" + p.Name() + "/state"))
			_, name, ok := strings.Cut(state, ": ") // "4: ACTIVE"
			if !ok {
				name = state
			}
			active = active || name == "ACTIVE"
			devs = append(devs, fmt.Sprintf("%s port %s %s", e.Name(), p.Name(), name))
		}
	}
	r.Detail = "RDMA: " + strings.Join(devs, ", ")
	var fixes []string
	if !active {
		fixes = append(fixes, "no port is ACTIVE: check the link (ip link; for Soft-RoCE the netdev must be up)")
	}
	if !rdma.VerbsBuilt {
		fixes = append(fixes, "this build lacks the verbs provider: make build TAGS=verbs (cgo, libibverbs-dev)")
	}
	if listen == "" {
		fixes = append(fixes, "set [proxy.rdma] listen (and device) in the host configuration to offer the RDMA path")
	}
	if len(fixes) > 0 {
		r.Status, r.Fix = Warn, strings.Join(fixes, "\n")
		return r
	}
	r.Status = Pass
	r.Detail += "; ntproxy takes RDMA connections on " + listen
	return r
}

// readString reads a small file and trims its surrounding white space.
func readString(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// readHex reads a sysfs number such as "0x8086".
func readHex(path string) (uint64, error) {
	s, err := readString(path)
	if err != nil {
		return 0, err
	}
	v, err := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 64)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", path, err)
	}
	return v, nil
}

// linkBase is the last element of a symbolic link's target ("" if none).
func linkBase(path string) string {
	t, err := os.Readlink(path)
	if err != nil {
		return ""
	}
	return filepath.Base(t)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// readMeminfo parses /proc/meminfo; values are in the file's units (kB
// for sizes, pages for HugePages_*).
func readMeminfo(path string) (map[string]uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read meminfo: %w", err)
	}
	m := map[string]uint64{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		if n, err := strconv.ParseUint(f[0], 10, 64); err == nil {
			m[k] = n
		}
	}
	return m, nil
}

// procStatusField returns a field of /proc/<pid>/status.
func procStatusField(path, field string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == field {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("%s: no %s", path, field)
}

// formatBytes prints n in the largest binary unit that divides it well.
func formatBytes(n uint64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return fmt.Sprintf("%dB", n)
	}
	v, u := float64(n), -1
	for v >= 1024 && u < len(units)-1 {
		v /= 1024
		u++
	}
	if v == float64(int64(v)) {
		return fmt.Sprintf("%d%ciB", int64(v), units[u])
	}
	return fmt.Sprintf("%.1f%ciB", v, units[u])
}
