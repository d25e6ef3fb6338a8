//go:build linux

package vm

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ntstack/ntstack/ntb/ivshmem"
	"github.com/ntstack/ntstack/test/vm/guest"
)

// The environment the harness reads; make vmtest sets all three.
const (
	envRun   = "NTSTACK_VMTEST"   // "1": boot guests; anything else: skip
	envCache = "NTSTACK_VM_CACHE" // where the unpacked kernel is kept
	envLogs  = "NTSTACK_VM_LOGS"  // where guest consoles are written
)

const (
	qemuBinary  = "qemu-system-x86_64"
	busyboxPath = "/bin/busybox" // Debian's busybox-static
	guestMemory = "512M"
	// Grace between SIGTERM and SIGKILL for a QEMU that overstays.
	killGrace = 5 * time.Second
)

// module is a kernel module /init loads; an optional one may be absent.
type module struct {
	name     string
	optional bool
}

// vfioModules are the modules /init loads, in dependency order. optional
// ones may be absent: vfio_virqfd was merged into vfio in Linux 6.2.
var vfioModules = []module{
	{"irqbypass", false},
	{"vfio", false},
	{"vfio_iommu_type1", false},
	{"vfio_virqfd", true},
	{"vfio-pci-core", false},
	{"vfio-pci", false},
}

// initScript is the guest's /init. It reports on the serial console.
const initScript = `#!/bin/busybox sh
/bin/busybox mkdir -p /proc /sys /dev /tmp
/bin/busybox mount -t proc proc /proc
/bin/busybox mount -t sysfs sysfs /sys
/bin/busybox mount -t devtmpfs devtmpfs /dev 2>/dev/null
/bin/busybox --install -s /bin
export PATH=/bin HOME=/tmp TMPDIR=/tmp
for m in /mods/*.ko; do
	insmod "$m" || echo "` + guest.MarkerResult + ` insmod:${m##*/} FAIL"
done
if [ -x /setup ]; then
	/setup || echo "` + guest.MarkerResult + ` setup FAIL"
fi
for d in /sys/bus/pci/devices/*; do
	if [ "$(cat $d/vendor):$(cat $d/device)" = "0x1af4:0x1110" ]; then
		export NTSTACK_VFIO_DEVICE=${d##*/}
		break
	fi
done
run=$(sed -n 's/.* ` + guest.ParamRun + `=\([^ ]*\).*/\1/p' /proc/cmdline)
for item in $(echo "$run" | tr , ' '); do
	bin=${item%%:*}
	test=${item#*:}
	/$bin.test -test.run "^$test\$" -test.v -test.timeout 90s
	rc=$?
	if [ $rc = 0 ]; then r=PASS; else r=FAIL; fi
	echo "` + guest.MarkerResult + ` $item $r rc=$rc"
done
echo ` + guest.MarkerEnd + `
poweroff -f
`

// lab is what every scenario boots: a kernel and an initramfs.
type lab struct {
	kernel string // vmlinuz
	initrd string // base cpio + test-binary cpio (+ the variant's extra cpio)
	logs   string // directory for console logs
}

// labVariant is what one lab differs in from another: the kernel, the
// modules /init loads, the test binaries and any further files.
type labVariant struct {
	name       string
	kernelMeta string // the Debian metapackage whose kernel the guests boot
	modules    func(k kernel) ([]module, error)
	binaries   map[string]testBinary
	// extra, if set, writes a further cpio: files /init or the binaries
	// need (a /setup script runs after the modules are loaded).
	extra func(w io.Writer, dir string, bins map[string][]byte) error
}

// testBinary is a package whose test binary goes into the guests.
type testBinary struct {
	pkg  string
	tags string // build tags, comma-separated
	cgo  bool   // dynamically linked against the host's libraries
}

// vfioLab is the VFIO scenarios' lab: the cloud kernel, static binaries.
var vfioLab = labVariant{
	name:       "vfio",
	kernelMeta: "linux-image-cloud-amd64",
	modules:    func(kernel) ([]module, error) { return vfioModules, nil },
	binaries:   testBinaries,
}

// labState is one variant's lab, prepared once per run.
type labState struct {
	once sync.Once
	lab  *lab
	err  error
}

var (
	labsMu sync.Mutex
	labs   = map[string]*labState{}
	labDir string // temporary files of this run, removed by TestMain
)

func TestMain(m *testing.M) {
	code := m.Run()
	if labDir != "" {
		os.RemoveAll(labDir)
	}
	os.Exit(code)
}

// getLab skips the test unless the VM tier was asked for, and otherwise
// prepares the VFIO lab once per run.
func getLab(t *testing.T) *lab { return getVariantLab(t, vfioLab) }

// getVariantLab is getLab for any variant.
func getVariantLab(t *testing.T, v labVariant) *lab {
	t.Helper()
	if os.Getenv(envRun) != "1" {
		t.Skipf("%s unset: the VM tier boots QEMU guests under TCG, seconds of a busy core each; run it with make vmtest", envRun)
	}
	labsMu.Lock()
	st := labs[v.name]
	if st == nil {
		st = &labState{}
		labs[v.name] = st
	}
	labsMu.Unlock()
	st.once.Do(func() {
		start := time.Now()
		st.lab, st.err = setupLab(t, v)
		if st.err == nil {
			t.Logf("%s lab ready in %v: kernel %s", v.name, time.Since(start).Round(10*time.Millisecond), st.lab.kernel)
		}
	})
	if st.err != nil {
		t.Fatalf("prepare the %s VM lab: %v", v.name, st.err)
	}
	return st.lab
}

func setupLab(t *testing.T, v labVariant) (*lab, error) {
	for _, tool := range []string{qemuBinary, "timeout"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s: %w (make vmtest installs qemu-system-x86)", tool, err)
		}
	}
	if err := checkStatic(busyboxPath); err != nil {
		return nil, err
	}
	var err error
	labsMu.Lock()
	if labDir == "" {
		labDir, err = os.MkdirTemp("", "ntstack-vm-")
	}
	labsMu.Unlock()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(labDir, v.name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	cache := os.Getenv(envCache)
	if cache == "" {
		if cache, err = os.UserCacheDir(); err != nil {
			return nil, err
		}
		cache = filepath.Join(cache, "ntstack", "vm")
	}
	logs := os.Getenv(envLogs)
	if logs == "" {
		logs = filepath.Join(labDir, "logs")
	}
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, err
	}

	// The kernel download and the Go builds overlap.
	var (
		wg            sync.WaitGroup
		kern          kernel
		kernErr       error
		kernTime      time.Duration
		bins          map[string][]byte
		binErr        error
		binTime       time.Duration
		kernelStarted = time.Now()
	)
	wg.Go(func() {
		kern, kernErr = fetchKernel(cache, v.kernelMeta)
		kernTime = time.Since(kernelStarted)
	})
	wg.Go(func() {
		bins, binErr = buildTestBinaries(dir, v.binaries)
		binTime = time.Since(kernelStarted)
	})
	wg.Wait()
	if err := errors.Join(kernErr, binErr); err != nil {
		return nil, err
	}
	t.Logf("kernel %s in %v; test binaries in %v", kern.version, kernTime.Round(10*time.Millisecond), binTime.Round(10*time.Millisecond))

	mods, err := v.modules(kern)
	if err != nil {
		return nil, fmt.Errorf("build initramfs: %w", err)
	}
	var img bytes.Buffer
	if err := writeBaseCPIO(&img, kern, mods); err != nil {
		return nil, fmt.Errorf("build initramfs: %w", err)
	}
	if err := writeBinCPIO(&img, bins); err != nil {
		return nil, fmt.Errorf("build initramfs: %w", err)
	}
	if v.extra != nil {
		if err := v.extra(&img, dir, bins); err != nil {
			return nil, fmt.Errorf("build initramfs: %w", err)
		}
	}
	initrd := filepath.Join(dir, "initrd.cpio")
	if err := os.WriteFile(initrd, img.Bytes(), 0o644); err != nil {
		return nil, err
	}
	return &lab{kernel: kern.vmlinuz, initrd: initrd, logs: logs}, nil
}

// checkStatic fails unless path is a statically linked executable: the
// initramfs has no libc.
func checkStatic(path string) error {
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w (make vmtest installs busybox-static)", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return fmt.Errorf("%s is dynamically linked; install busybox-static", path)
		}
	}
	return nil
}

// kernel is an unpacked Debian kernel package.
type kernel struct {
	version string // e.g. 6.1.0-56-cloud-amd64
	vmlinuz string
	modules string // lib/modules/<version>
}

// fetchKernel returns the kernel the metapackage meta depends on,
// downloading and unpacking it into cache unless it is there already.
// Offline, with apt's lists gone, it settles for the newest cached one of
// the same flavour.
func fetchKernel(cache, meta string) (kernel, error) {
	pkg, resolveErr := resolveKernelPackage(meta)
	if resolveErr != nil {
		var cached []string
		all, _ := filepath.Glob(filepath.Join(cache, "linux-image-*", "root"))
		for _, c := range all {
			if kernelFlavour(filepath.Base(filepath.Dir(c))) == strings.TrimPrefix(meta, "linux-image-") {
				cached = append(cached, c)
			}
		}
		if len(cached) == 0 {
			return kernel{}, fmt.Errorf("fetch kernel: %w", resolveErr)
		}
		slices.Sort(cached)
		return unpackedKernel(filepath.Dir(cached[len(cached)-1]))
	}
	dir := filepath.Join(cache, pkg)
	if _, err := os.Stat(filepath.Join(dir, "root")); err == nil {
		return unpackedKernel(dir)
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return kernel{}, fmt.Errorf("fetch kernel: %w", err)
	}
	tmp, err := os.MkdirTemp(cache, pkg+".partial-")
	if err != nil {
		return kernel{}, fmt.Errorf("fetch kernel: %w", err)
	}
	defer os.RemoveAll(tmp)
	if _, err := run(tmp, "apt-get", "download", pkg); err != nil {
		return kernel{}, fmt.Errorf("fetch kernel %s: %w", pkg, err)
	}
	debs, _ := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if len(debs) != 1 {
		return kernel{}, fmt.Errorf("fetch kernel %s: apt-get download left %d .deb files", pkg, len(debs))
	}
	if _, err := run(tmp, "dpkg", "-x", debs[0], "root"); err != nil {
		return kernel{}, fmt.Errorf("unpack kernel %s: %w", pkg, err)
	}
	if err := os.Remove(debs[0]); err != nil {
		return kernel{}, err
	}
	if err := os.Rename(tmp, dir); err != nil {
		return kernel{}, fmt.Errorf("fetch kernel %s: %w", pkg, err)
	}
	return unpackedKernel(dir)
}

// kernelFlavour returns the flavour of a versioned kernel package name:
// "cloud-amd64" for linux-image-6.1.0-48-cloud-amd64.
func kernelFlavour(pkg string) string {
	rest := strings.TrimPrefix(pkg, "linux-image-")
	// Skip the version: dotted numbers, then the ABI number.
	for range 2 {
		_, rest, _ = strings.Cut(rest, "-")
	}
	return rest
}

// resolveKernelPackage asks apt which versioned package a kernel
// metapackage depends on.
func resolveKernelPackage(kernelMeta string) (string, error) {
	out, err := run("", "apt-cache", "depends", kernelMeta)
	if err != nil {
		return "", fmt.Errorf("resolve %s (apt-get update?): %w", kernelMeta, err)
	}
	for line := range strings.Lines(string(out)) {
		if dep, ok := strings.CutPrefix(strings.TrimSpace(line), "Depends: "); ok && strings.HasPrefix(dep, "linux-image-") {
			return dep, nil
		}
	}
	return "", fmt.Errorf("resolve %s: no linux-image dependency in %q", kernelMeta, out)
}

func unpackedKernel(dir string) (kernel, error) {
	vmlinuz, _ := filepath.Glob(filepath.Join(dir, "root", "boot", "vmlinuz-*"))
	if len(vmlinuz) != 1 {
		return kernel{}, fmt.Errorf("kernel in %s: %d vmlinuz files", dir, len(vmlinuz))
	}
	version := strings.TrimPrefix(filepath.Base(vmlinuz[0]), "vmlinuz-")
	modules := filepath.Join(dir, "root", "lib", "modules", version)
	if _, err := os.Stat(modules); err != nil {
		return kernel{}, fmt.Errorf("kernel in %s: %w", dir, err)
	}
	return kernel{version: version, vmlinuz: vmlinuz[0], modules: modules}, nil
}

// run runs a command in dir and returns its standard output; its error
// carries the standard error.
func run(dir, name string, args ...string) ([]byte, error) {
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

// testBinaries are the packages whose test binaries go into the VFIO
// guests, by the name /init runs them under (/<name>.test).
var testBinaries = map[string]testBinary{
	"guest": {pkg: "github.com/ntstack/ntstack/test/vm/guest"},
	"vfio":  {pkg: "github.com/ntstack/ntstack/vfio"},
}

func buildTestBinaries(dir string, binaries map[string]testBinary) (map[string][]byte, error) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return nil, fmt.Errorf("build test binaries: %w", err)
	}
	bins := make(map[string][]byte)
	for name, b := range binaries {
		pkg := b.pkg
		out := filepath.Join(dir, name+".test")
		args := []string{"test", "-c", "-o", out}
		if b.tags != "" {
			args = append(args, "-tags", b.tags)
		}
		cmd := exec.Command(gobin, append(args, pkg)...)
		cgo := "CGO_ENABLED=0"
		if b.cgo {
			cgo = "CGO_ENABLED=1"
		}
		cmd.Env = append(os.Environ(), cgo, "GOOS=linux", "GOARCH=amd64")
		if msg, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("build %s test binary: %w\n%s", pkg, err, msg)
		}
		if bins[name], err = os.ReadFile(out); err != nil {
			return nil, err
		}
	}
	return bins, nil
}

// writeBaseCPIO writes the first archive: busybox, /init and the
// modules.
func writeBaseCPIO(w io.Writer, k kernel, modules []module) error {
	c := newCPIOWriter(w)
	for _, d := range []string{"bin", "dev", "proc", "sys", "tmp", "mods"} {
		c.dir(d)
	}
	c.charDev("dev/console", 5, 1)
	bb, err := os.ReadFile(busyboxPath)
	if err != nil {
		return err
	}
	c.file("bin/busybox", 0o755, bb)
	c.file("init", 0o755, []byte(initScript))
	builtin, _ := os.ReadFile(filepath.Join(k.modules, "modules.builtin"))
	for i, m := range modules {
		ko, err := loadModule(k.modules, m.name)
		if errors.Is(err, os.ErrNotExist) && (m.optional || isBuiltin(builtin, m.name)) {
			continue
		}
		if err != nil {
			return err
		}
		c.file(fmt.Sprintf("mods/%02d-%s.ko", i, m.name), 0o644, ko)
	}
	return c.close()
}

// writeBinCPIO writes the second archive: the test binaries.
func writeBinCPIO(w io.Writer, bins map[string][]byte) error {
	c := newCPIOWriter(w)
	for _, name := range slices.Sorted(maps.Keys(bins)) {
		c.file(name+".test", 0o755, bins[name])
	}
	return c.close()
}

// modName normalises a module name: the kernel treats - and _ alike.
func modName(s string) string { return strings.ReplaceAll(s, "-", "_") }

func isBuiltin(list []byte, name string) bool {
	for line := range strings.Lines(string(list)) {
		if modName(strings.TrimSuffix(filepath.Base(strings.TrimSpace(line)), ".ko")) == modName(name) {
			return true
		}
	}
	return false
}

// loadModule finds module name under modules/kernel and returns it
// uncompressed (busybox insmod takes plain .ko files).
func loadModule(modules, name string) ([]byte, error) {
	var found string
	err := filepath.WalkDir(filepath.Join(modules, "kernel"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		base := d.Name()
		for _, ext := range []string{".ko", ".ko.xz", ".ko.zst", ".ko.gz"} {
			if stem, ok := strings.CutSuffix(base, ext); ok && modName(stem) == modName(name) {
				found = path
				return filepath.SkipAll
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("module %s: %w", name, err)
	}
	if found == "" {
		return nil, fmt.Errorf("module %s: %w in %s", name, os.ErrNotExist, modules)
	}
	switch {
	case strings.HasSuffix(found, ".ko"):
		return os.ReadFile(found)
	case strings.HasSuffix(found, ".gz"):
		f, err := os.Open(found)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("module %s: %w", found, err)
		}
		return io.ReadAll(zr)
	case strings.HasSuffix(found, ".xz"):
		return run("", "xz", "-dc", found)
	default:
		return run("", "zstd", "-dc", found)
	}
}

// cpioWriter writes a "newc" cpio archive, the initramfs format; errors
// stick and are reported by close.
type cpioWriter struct {
	w   *bufio.Writer
	ino int
	err error
}

func newCPIOWriter(w io.Writer) *cpioWriter { return &cpioWriter{w: bufio.NewWriter(w), ino: 1} }

// File types of the newc mode field (stat.h).
const (
	cpioDir  = 0o040000
	cpioFile = 0o100000
	cpioChr  = 0o020000
)

func (c *cpioWriter) entry(name string, mode uint32, data []byte, rmajor, rminor uint32) {
	if c.err != nil {
		return
	}
	nlink := uint32(1)
	if mode&cpioDir != 0 {
		nlink = 2
	}
	// Magic, then 13 eight-digit hex fields: ino, mode, uid, gid, nlink,
	// mtime, filesize, devmajor, devminor, rdevmajor, rdevminor, namesize
	// (with its NUL), check.
	hdr := fmt.Sprintf("070701%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		c.ino, mode, 0, 0, nlink, 0, len(data), 0, 0, rmajor, rminor, len(name)+1, 0)
	c.ino++
	c.write([]byte(hdr))
	c.write(append([]byte(name), 0))
	c.pad(len(hdr) + len(name) + 1)
	c.write(data)
	c.pad(len(data))
}

func (c *cpioWriter) write(b []byte) {
	if c.err == nil {
		_, c.err = c.w.Write(b)
	}
}

// pad aligns to 4 bytes after n bytes written.
func (c *cpioWriter) pad(n int) { c.write(make([]byte, (4-n%4)%4)) }

func (c *cpioWriter) dir(name string) { c.entry(name, cpioDir|0o755, nil, 0, 0) }
func (c *cpioWriter) file(name string, perm uint32, data []byte) {
	c.entry(name, cpioFile|perm, data, 0, 0)
}
func (c *cpioWriter) charDev(name string, major, minor uint32) {
	c.entry(name, cpioChr|0o600, nil, major, minor)
}

func (c *cpioWriter) close() error {
	c.entry("TRAILER!!!", 0, nil, 0, 0)
	if c.err == nil {
		c.err = c.w.Flush()
	}
	return c.err
}

// ivshmemServer is one scenario's ivshmem server.
type ivshmemServer struct {
	socket  string
	shmPath string
	vectors int
	size    int64
}

// startServer runs the project's ivshmem server in this process until the
// test ends.
func startServer(t *testing.T, vectors int, size int64) *ivshmemServer {
	t.Helper()
	dir := t.TempDir()
	s := &ivshmemServer{
		socket:  filepath.Join(dir, "ivshmem.sock"),
		shmPath: filepath.Join(dir, "ivshmem.shm"),
		vectors: vectors,
		size:    size,
	}
	srv, err := ivshmem.NewServer(ivshmem.ServerConfig{SocketPath: s.socket, ShmPath: s.shmPath, Size: size, Vectors: vectors})
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background()) }()
	t.Cleanup(func() {
		if err := srv.Close(); err != nil {
			t.Errorf("close ivshmem server: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("ivshmem server: %v", err)
		}
	})
	return s
}

// shm reads the shared memory as the guests left it.
func (s *ivshmemServer) shm(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile(s.shmPath)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// guestSpec describes one guest of a scenario.
type guestSpec struct {
	name    string
	servers []*ivshmemServer // one ivshmem-doorbell device per server, in order
	run     []string         // bin:TestName, in order
	params  []string         // more ntvm.* parameters, "name=value"
	timeout time.Duration
	// machine replaces the machine arguments (default: q35 with an
	// emulated Intel IOMMU); qemu adds arguments (a NIC).
	machine []string
	qemu    []string
}

// guestRun is a guest's outcome.
type guestRun struct {
	spec    guestSpec
	console string
	elapsed time.Duration
	err     error
}

// boot runs the guests of one scenario together and checks that every
// test each of them ran passed. A guest that fails stops the others.
func boot(t *testing.T, l *lab, specs ...guestSpec) []*guestRun {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	runs := make([]*guestRun, len(specs))
	var wg sync.WaitGroup
	for i, spec := range specs {
		runs[i] = &guestRun{spec: spec}
		wg.Go(func() {
			r := runs[i]
			start := time.Now()
			r.console, r.err = runQEMU(ctx, l, t.Name(), spec)
			r.elapsed = time.Since(start)
			if r.err == nil {
				r.err = checkResults(r.console, spec.run)
			}
			if r.err != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	for _, r := range runs {
		for _, line := range strings.Split(r.console, "\n") {
			if i := strings.Index(line, guest.MarkerMetric); i >= 0 {
				t.Logf("guest %s: %s", r.spec.name, strings.TrimSpace(line[i:]))
			}
		}
		if r.err != nil {
			t.Errorf("guest %s after %v: %v\nconsole tail:\n%s", r.spec.name, r.elapsed.Round(10*time.Millisecond), r.err, tail(r.console, 40))
			continue
		}
		t.Logf("guest %s: %s PASS in %v", r.spec.name, strings.Join(r.spec.run, ","), r.elapsed.Round(10*time.Millisecond))
	}
	if t.Failed() {
		t.FailNow()
	}
	return runs
}

// runQEMU boots one guest and returns its console once it powers off.
func runQEMU(ctx context.Context, l *lab, test string, spec guestSpec) (string, error) {
	// no_timer_check: under TCG on a loaded host the kernel's check that
	// the timer interrupt arrives through the interrupt-remapped IO-APIC
	// can time out, and the guest panics at boot.
	cmdline := []string{"console=ttyS0", "quiet", "panic=-1", "intel_iommu=on", "no_timer_check",
		guest.ParamRun + "=" + strings.Join(spec.run, ",")}
	for _, p := range spec.params {
		cmdline = append(cmdline, "ntvm."+p)
	}
	secs := int(spec.timeout / time.Second)
	machine := spec.machine
	if machine == nil {
		machine = []string{"-machine", "q35", "-device", "intel-iommu,intremap=on"}
	}
	args := []string{"-k", fmt.Sprint(int(killGrace / time.Second)), fmt.Sprint(secs), qemuBinary}
	args = append(args, machine...)
	args = append(args, "-accel", "tcg",
		"-m", guestMemory, "-smp", "1", "-nographic", "-vga", "none", "-no-reboot", "-nic", "none",
		"-kernel", l.kernel, "-initrd", l.initrd, "-append", strings.Join(cmdline, " "))
	args = append(args, spec.qemu...)
	for i, s := range spec.servers {
		id := fmt.Sprintf("ivs%d", i)
		args = append(args,
			"-chardev", "socket,path="+s.socket+",id="+id,
			"-device", fmt.Sprintf("ivshmem-doorbell,chardev=%s,vectors=%d", id, s.vectors))
	}
	logPath := filepath.Join(l.logs, strings.NewReplacer("/", "-").Replace(test)+"-"+spec.name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return "", err
	}
	defer logFile.Close()
	var console bytes.Buffer
	cmd := exec.CommandContext(ctx, "timeout", args...)
	cmd.Stdout = io.MultiWriter(&console, logFile)
	cmd.Stderr = cmd.Stdout
	// timeout(1) passes SIGTERM on to QEMU; a SIGKILL would orphan it.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = killGrace + time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	err = cmd.Run()
	out := console.String()
	switch {
	case ctx.Err() != nil:
		return out, fmt.Errorf("stopped: %w (another guest failed or the test timed out)", ctx.Err())
	case err != nil:
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 124 {
			return out, fmt.Errorf("%s timed out after %v (console: %s)", qemuBinary, spec.timeout, logPath)
		}
		return out, fmt.Errorf("%s: %w (console: %s)", qemuBinary, err, logPath)
	}
	return out, nil
}

// checkResults requires a PASS result line and the test binary's own
// "--- PASS" line for every test, and the end marker.
func checkResults(console string, tests []string) error {
	var errs []error
	for _, item := range tests {
		_, name, _ := strings.Cut(item, ":")
		if !strings.Contains(console, guest.MarkerResult+" "+item+" PASS") {
			errs = append(errs, fmt.Errorf("%s: no %s PASS line", item, guest.MarkerResult))
		} else if !strings.Contains(console, "--- PASS: "+name+" ") {
			errs = append(errs, fmt.Errorf("%s: exited 0 without passing (skipped?)", item))
		}
	}
	if strings.Contains(console, guest.MarkerResult+" insmod:") {
		errs = append(errs, errors.New("a module failed to load"))
	}
	if strings.Contains(console, guest.MarkerResult+" setup FAIL") {
		errs = append(errs, errors.New("/setup failed"))
	}
	if !strings.Contains(console, guest.MarkerEnd) {
		errs = append(errs, fmt.Errorf("no %s line: the guest did not finish", guest.MarkerEnd))
	}
	return errors.Join(errs...)
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
