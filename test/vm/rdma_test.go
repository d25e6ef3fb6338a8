//go:build linux

package vm

import (
	"bufio"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ntstack/ntstack/test/vm/rdmaguest"
)

// The RDMA scenario: two guests with the generic Debian kernel (the cloud
// kernel has no rdma_rxe), Soft-RoCE on an e1000 NIC each, the NICs joined
// by a QEMU UDP socket netdev on the host's loopback (no start-up order,
// unlike listen/connect). Test binaries are built with the verbs tag and
// cgo, so the initramfs also carries the dynamic loader, the libraries
// ldd names, libibverbs' rxe provider and its driver file, and iproute2's
// rdma tool for `rdma link add`.
const (
	rdmaMsgs    = 2000
	rdmaTimeout = 240 * time.Second
	rdmaNet     = "10.11.0."
)

// rdmaModules are loaded with their dependencies (from each module's
// .modinfo): crc32_generic is only a crypto soft dependency of rdma_rxe,
// without which `rdma link add` fails with ENOENT.
var rdmaModules = []string{"crc32_generic", "e1000", "rdma_rxe"}

var rdmaLab = labVariant{
	name:       "rdma",
	kernelMeta: "linux-image-amd64",
	modules:    func(k kernel) ([]module, error) { return moduleClosure(k, rdmaModules) },
	binaries: map[string]testBinary{
		"rdmaguest": {pkg: "github.com/ntstack/ntstack/test/vm/rdmaguest", tags: "verbs", cgo: true},
		"rdma":      {pkg: "github.com/ntstack/ntstack/rdma", tags: "verbs", cgo: true},
	},
	extra: writeRDMACPIO,
}

// rdmaSetup is the guests' /setup: the address on eth0, then Soft-RoCE.
const rdmaSetup = `#!/bin/busybox sh
addr=$(sed -n 's/.* ` + rdmaguest.ParamIP + `=\([^ ]*\).*/\1/p' /proc/cmdline)
ip link set lo up && ip link set eth0 up && ip addr add "$addr" dev eth0 || exit 1
/sbin/rdma link add rxe0 type rxe netdev eth0 || exit 1
# The port turns ACTIVE once eth0 has carrier (e1000 autonegotiation).
for i in $(seq 100); do
	grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state && break
	sleep 0.1
done
echo "rdma setup: eth0 $addr, rxe0 port 1 $(cat /sys/class/infiniband/rxe0/ports/1/state) after $i checks"
`

// TestRDMA: the verbs provider for real. Guest a serves an echo, guest b
// connects over Soft-RoCE, times round trips and streams rdmaMsgs
// messages pipelined, checking every echo byte for byte; then a runs
// nettest.TestConn and b the provider's semantics and handshake tests,
// each over loopback through its own rxe device; last, both run ntmon and
// ntproxy as off-rack hosts of one rack (rdmaguest.TestRDMARack) and an
// application on b reaches one on a through the proxies over RDMA.
func TestRDMA(t *testing.T) {
	l := getVariantLab(t, rdmaLab)
	portA, portB := freeUDPPort(t), freeUDPPort(t)
	// host is the guest's number on the test network; self and peer are
	// the UDP ports of its and its peer's netdev.
	spec := func(name string, host, self, peer int, run []string, params ...string) guestSpec {
		return guestSpec{
			name:    name,
			run:     run,
			params:  append([]string{fmt.Sprintf("ip=%s%d/24", rdmaNet, host)}, params...),
			timeout: rdmaTimeout,
			machine: []string{"-machine", "pc"},
			qemu: []string{
				"-netdev", fmt.Sprintf("socket,id=n0,udp=127.0.0.1:%d,localaddr=127.0.0.1:%d", peer, self),
				"-device", fmt.Sprintf("e1000,netdev=n0,mac=52:54:00:12:34:%02x,romfile=", host),
			},
		}
	}
	start := time.Now()
	runs := boot(t, l,
		spec("a", 1, portA, portB, []string{"rdmaguest:TestRDMAExchange", "rdma:TestVerbsNettest", "rdmaguest:TestRDMARack"}, "role=server"),
		spec("b", 2, portB, portA, []string{"rdmaguest:TestRDMAExchange", "rdma:TestVerbsSemantics", "rdma:TestVerbsHandshake", "rdmaguest:TestRDMARack"},
			"role=client", fmt.Sprintf("peer=%s1:%d", rdmaNet, rdmaguest.Port), fmt.Sprintf("msgs=%d", rdmaMsgs)))
	t.Logf("two RDMA guests in %v", time.Since(start).Round(100*time.Millisecond))
	for _, want := range []string{fmt.Sprintf("pipelined_msgs=%d ", rdmaMsgs), "rack_route=rdma ", "rack_msgs_over_rdma=", "doctor_rdma=pass "} {
		if !strings.Contains(runs[1].console, want) {
			t.Errorf("client console lacks %q", want)
		}
	}
}

// freeUDPPort returns a loopback UDP port that was free a moment ago.
func freeUDPPort(t *testing.T) int {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// moduleClosure returns names and the modules they depend on, each after
// its dependencies; built-in ones are left out.
func moduleClosure(k kernel, names []string) ([]module, error) {
	builtin, _ := os.ReadFile(filepath.Join(k.modules, "modules.builtin"))
	var order []module
	seen := map[string]bool{}
	var visit func(name string) error
	visit = func(name string) error {
		name = modName(name)
		if seen[name] || isBuiltin(builtin, name) {
			return nil
		}
		seen[name] = true
		ko, err := loadModule(k.modules, name)
		if err != nil {
			return err
		}
		deps, err := moduleDepends(ko)
		if err != nil {
			return fmt.Errorf("module %s: %w", name, err)
		}
		for _, d := range deps {
			if err := visit(d); err != nil {
				return err
			}
		}
		order = append(order, module{name: name})
		return nil
	}
	for _, n := range names {
		if err := visit(n); err != nil {
			return nil, err
		}
	}
	return order, nil
}

// moduleDepends reads a module's depends= from its .modinfo section.
func moduleDepends(ko []byte) ([]string, error) {
	f, err := elf.NewFile(bytes.NewReader(ko))
	if err != nil {
		return nil, err
	}
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil, fmt.Errorf("no .modinfo section")
	}
	data, err := sec.Data()
	if err != nil {
		return nil, err
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			if len(v) == 0 {
				return nil, nil
			}
			return strings.Split(string(v), ","), nil
		}
	}
	return nil, nil
}

// writeRDMACPIO writes the RDMA guests' third archive: /setup, iproute2's
// rdma tool, the rxe provider and every shared library these and the cgo
// test binaries load, at the paths the host has them.
func writeRDMACPIO(w io.Writer, dir string, bins map[string][]byte) error {
	rdmaTool, err := exec.LookPath("rdma")
	if err != nil {
		return fmt.Errorf("rdma tool: %w (make vmtest installs iproute2)", err)
	}
	providers, _ := filepath.Glob("/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so")
	if len(providers) == 0 {
		return fmt.Errorf("no librxe-rdmav*.so in /usr/lib/x86_64-linux-gnu/libibverbs (make vmtest installs ibverbs-providers)")
	}
	const driver = "/etc/libibverbs.d/rxe.driver"
	// ldd needs the binaries as files.
	elves := []string{rdmaTool, providers[0]}
	for _, name := range slices.Sorted(maps.Keys(bins)) {
		elves = append(elves, filepath.Join(dir, name+".test"))
	}
	files := map[string]string{ // path in the guest -> path on the host
		"sbin/rdma":      rdmaTool,
		providers[0][1:]: providers[0],
		driver[1:]:       driver,
	}
	for _, e := range elves {
		libs, err := sharedLibraries(e)
		if err != nil {
			return err
		}
		for _, lib := range libs {
			files[lib[1:]] = lib
		}
	}
	c := newCPIOWriter(w)
	dirs := map[string]bool{}
	for _, guestPath := range slices.Sorted(maps.Keys(files)) {
		for d := filepath.Dir(guestPath); d != "."; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	for _, d := range slices.Sorted(maps.Keys(dirs)) { // parents sort before children
		c.dir(d)
	}
	for _, guestPath := range slices.Sorted(maps.Keys(files)) {
		b, err := os.ReadFile(files[guestPath]) // follows symlinks
		if err != nil {
			return err
		}
		c.file(guestPath, 0o755, b)
	}
	c.file("setup", 0o755, []byte(rdmaSetup))
	return c.close()
}

// sharedLibraries lists the absolute paths ldd resolves for an ELF file,
// the dynamic loader included.
func sharedLibraries(path string) ([]string, error) {
	out, err := run("", "ldd", path)
	if err != nil {
		return nil, err
	}
	var libs []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			libs = append(libs, f[2])
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			libs = append(libs, f[0])
		case len(f) >= 3 && f[1] == "=>" && f[2] == "not":
			return nil, fmt.Errorf("ldd %s: %s", path, sc.Text())
		}
	}
	return libs, nil
}
