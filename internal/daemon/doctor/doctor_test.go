package doctor

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
	"github.com/ntstack/ntstack/rdma"
)

// fakeRoot is a fake /sys, /proc and /dev under a temporary directory.
type fakeRoot struct {
	t    *testing.T
	root string
}

func (f fakeRoot) write(path, content string) {
	f.t.Helper()
	p := filepath.Join(f.root, path)
	require.NoError(f.t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(f.t, os.WriteFile(p, []byte(content), 0o644))
}

func (f fakeRoot) mkdir(path string) {
	f.t.Helper()
	require.NoError(f.t, os.MkdirAll(filepath.Join(f.root, path), 0o755))
}

func (f fakeRoot) symlink(path, target string) {
	f.t.Helper()
	p := filepath.Join(f.root, path)
	require.NoError(f.t, os.MkdirAll(filepath.Dir(p), 0o755))
	require.NoError(f.t, os.Symlink(target, p))
}

const meminfoNoHuge = `MemTotal:       49367240 kB
MemFree:        40000000 kB
HugePages_Total:       0
HugePages_Free:        0
HugePages_Rsvd:        0
HugePages_Surp:        0
Hugepagesize:       2048 kB
`

// machineLike is a tree like the 2-vCPU Firecracker VM the project is
// developed on: virtio devices only, no IOMMU, no VFIO, no hugepages,
// kvm-clock, hybrid cgroups.
func machineLike(t *testing.T) fakeRoot {
	f := fakeRoot{t: t, root: t.TempDir()}
	f.write("/proc/cmdline", "console=ttyS0 clocksource=kvm-clock tsc=reliable -- --init-arg iommu=pt\n")
	f.write("/proc/meminfo", meminfoNoHuge)
	f.write("/proc/mounts", "/dev/vda / ext4 rw 0 0\ntmpfs /dev/shm tmpfs rw,relatime 0 0\ncgroup2 /sys/fs/cgroup/unified cgroup2 rw 0 0\n")
	f.mkdir("/dev/shm")
	f.write("/proc/self/status", "Name:\tntmon\nCpus_allowed:\t3\nCpus_allowed_list:\t0-1\n")
	f.write("/proc/self/timerslack_ns", "50000\n")
	f.write("/proc/sys/kernel/version", "#1 SMP PREEMPT_DYNAMIC @0\n")
	f.write("/proc/sys/kernel/unprivileged_bpf_disabled", "2\n")
	f.write("/sys/fs/cgroup/unified/cgroup.controllers", "hugetlb\n")
	f.write("/sys/devices/system/clocksource/clocksource0/current_clocksource", "kvm-clock\n")
	f.write("/sys/devices/system/clocksource/clocksource0/available_clocksource", "kvm-clock \n")
	f.write("/sys/module/kvm/parameters/x", "")
	virtio := "/sys/bus/pci/devices/0000:00:01.0/"
	f.write(virtio+"vendor", "0x1af4\n")
	f.write(virtio+"device", "0x1045\n")
	f.symlink(virtio+"driver", "../../../bus/pci/drivers/virtio-pci")
	return f
}

// withVFIO adds IOMMU groups, /dev/vfio/vfio and the loaded modules.
func (f fakeRoot) withVFIO(groups ...string) {
	for _, g := range groups {
		f.mkdir("/sys/kernel/iommu_groups/" + g + "/devices")
	}
	f.write("/dev/vfio/vfio", "")
	f.write("/proc/modules", "vfio_pci 16384 0 - Live 0x0\nvfio_pci_core 94208 1 vfio_pci, Live 0x0\nvfio_iommu_type1 45056 0 - Live 0x0\nvfio 69632 3 vfio_pci_core,vfio_iommu_type1, Live 0x0\n")
	f.write("/sys/module/vfio/parameters/enable_unsafe_noiommu_mode", "N\n")
}

// device adds a PCI function; driver and group may be "".
func (f fakeRoot) device(addr, vendor, device, driver, group, resource string, wc bool) {
	p := "/sys/bus/pci/devices/" + addr + "/"
	f.write(p+"vendor", vendor+"\n")
	f.write(p+"device", device+"\n")
	f.write(p+"revision", "0x04\n")
	f.write(p+"resource", resource)
	if driver != "" {
		f.symlink(p+"driver", "../../../bus/pci/drivers/"+driver)
	}
	if group != "" {
		f.symlink(p+"iommu_group", "../../../kernel/iommu_groups/"+group)
	}
	if wc {
		f.write(p+"resource2_wc", "")
	}
}

// resource lines: BAR0 256 B, BAR1 4 KiB, BAR2 16 MiB prefetchable 64-bit,
// then unset BARs, the ROM and bridge windows as sysfs prints them.
const ivshmemResource = `0x00000000fe000000 0x00000000fe0000ff 0x0000000000040200
0x00000000fe001000 0x00000000fe001fff 0x0000000000040200
0x0000008000000000 0x0000008000ffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000000000000000 0x0000000000000000 0x0000000000000000
`

const ntbResource = `0x00000000c5c00000 0x00000000c5c0ffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000038000000000 0x0000038003ffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
0x0000038004000000 0x0000038007ffffff 0x000000000014220c
0x0000000000000000 0x0000000000000000 0x0000000000000000
`

func byName(t *testing.T, rs []Result) map[string]Result {
	t.Helper()
	m := map[string]Result{}
	for _, r := range rs {
		require.NotContains(t, m, r.Name, "duplicate result name")
		m[r.Name] = r
		if r.Status == Warn || r.Status == Fail {
			require.NotEmpty(t, r.Fix, "%s is %s without a fix", r.Name, r.Status)
		}
	}
	return m
}

func TestMachineLikeThisOne(t *testing.T) {
	f := machineLike(t)
	rs := Run(context.Background(), Options{Root: f.root})
	m := byName(t, rs)
	want := map[string]Status{
		"auth": Skip, "iommu": Warn, "vfio": Warn, "devices": Skip, "hugepages": Warn, "fabric": Pass,
		"links": Skip, "cpus": Pass, "clocksource": Pass, "timer slack": Pass, "cgroup2": Pass, "bpf": Pass,
		"rdma": Skip,
	}
	got := map[string]Status{}
	for n, r := range m {
		got[n] = r.Status
	}
	require.Equal(t, want, got)
	require.Contains(t, m["iommu"].Detail, "no IOMMU groups")
	require.Contains(t, m["iommu"].Detail, "has no intel_iommu=on", "iommu=pt after -- belongs to init")
	require.Contains(t, m["iommu"].Fix, "intel_iommu=on")
	require.Contains(t, m["vfio"].Detail, "not loaded: vfio, vfio_pci, vfio_iommu_type1")
	require.Equal(t, "no NTB or ivshmem device; the emulated fabric (/dev/shm) is in use", m["devices"].Detail)
	require.Contains(t, m["hugepages"].Fix, "vm.nr_hugepages=512")
	require.Contains(t, m["fabric"].Detail, "on /dev/shm (tmpfs)")
	require.Contains(t, m["cpus"].Detail, "2 CPUs (affinity 0-1)")
	require.False(t, Failed(rs))
	require.Equal(t, "6 passed, 3 warnings, 0 failed, 4 skipped", Summary(rs))
}

// The RDMA check: no device, a device whose port is down, and one that
// is usable — which also needs the verbs build and [proxy.rdma].
func TestRDMA(t *testing.T) {
	cfg, err := config.Parse([]byte("host = \"a\"\n[proxy.rdma]\nlisten = \"192.0.2.1:7490\"\n"))
	require.NoError(t, err)
	f := machineLike(t)
	r := byName(t, Run(context.Background(), Options{Root: f.root, Config: cfg}))["rdma"]
	require.Equal(t, Warn, r.Status)
	require.Contains(t, r.Detail, "proxy.rdma.listen is 192.0.2.1:7490, but ntmon will tell its peers this host has no RDMA")
	require.Contains(t, r.Fix, "modprobe rdma_rxe")

	f.write("/sys/class/infiniband/rxe0/ports/1/state", "1: DOWN\n")
	r = byName(t, Run(context.Background(), Options{Root: f.root, Config: cfg}))["rdma"]
	require.Equal(t, Warn, r.Status)
	require.Equal(t, "RDMA: rxe0 port 1 DOWN", r.Detail)
	require.Contains(t, r.Fix, "no port is ACTIVE")

	f.write("/sys/class/infiniband/rxe0/ports/1/state", "4: ACTIVE\n")
	r = byName(t, Run(context.Background(), Options{Root: f.root, Config: cfg}))["rdma"]
	if rdma.VerbsBuilt {
		require.Equal(t, Pass, r.Status)
		require.Equal(t, "RDMA: rxe0 port 1 ACTIVE; ntproxy takes RDMA connections on 192.0.2.1:7490", r.Detail)
	} else {
		require.Equal(t, Warn, r.Status)
		require.Equal(t, "this build lacks the verbs provider: make build TAGS=verbs (cgo, libibverbs-dev)", r.Fix)
	}
	// Without [proxy.rdma] the device goes unused, and the fix says so.
	r = byName(t, Run(context.Background(), Options{Root: f.root}))["rdma"]
	require.Equal(t, Warn, r.Status)
	require.Contains(t, r.Fix, "set [proxy.rdma] listen")
}

func TestIvshmemBoundToVFIO(t *testing.T) {
	f := machineLike(t)
	f.withVFIO("7")
	f.device("0000:00:04.0", "0x1af4", "0x1110", "vfio-pci", "7", ivshmemResource, true)
	m := byName(t, Run(context.Background(), Options{Root: f.root}))
	require.Equal(t, Pass, m["iommu"].Status, m["iommu"].Detail)
	require.Contains(t, m["iommu"].Detail, "1 IOMMU groups")
	require.Equal(t, Pass, m["vfio"].Status, m["vfio"].Detail)
	d := m["device 0000:00:04.0"]
	require.Equal(t, Pass, d.Status, d.Detail)
	require.Contains(t, d.Detail, "QEMU ivshmem, vfio-pci, IOMMU group 7")
	require.Contains(t, d.Detail, "BAR0 256B, BAR1 4KiB, BAR2 16MiB prefetchable 64-bit")
	require.Contains(t, d.Detail, "resource2_wc present")
	require.NotContains(t, m, "devices")
}

func TestIntelNTBBoundToHostDriver(t *testing.T) {
	f := machineLike(t)
	f.withVFIO("3")
	f.device("0000:af:00.0", "0x8086", "0x201c", "ntb_hw_intel", "3", ntbResource, false)
	m := byName(t, Run(context.Background(), Options{Root: f.root}))
	d := m["device 0000:af:00.0"]
	require.Equal(t, Warn, d.Status, d.Detail)
	require.Contains(t, d.Detail, "Intel NTB gen3 (Skylake-SP), ntb_hw_intel, IOMMU group 3")
	require.Contains(t, d.Detail, "BAR0 64KiB prefetchable 64-bit, BAR2 64MiB prefetchable 64-bit, BAR4 64MiB prefetchable 64-bit")
	require.Contains(t, d.Detail, "no resource2_wc")
	require.Contains(t, d.Fix, "echo vfio-pci > /sys/bus/pci/devices/0000:af:00.0/driver_override")
	require.Contains(t, d.Fix, "echo 0000:af:00.0 > /sys/bus/pci/devices/0000:af:00.0/driver/unbind")
	require.Contains(t, d.Fix, "echo 0000:af:00.0 > /sys/bus/pci/drivers_probe")
	require.Contains(t, d.Fix, "AllowUncachedWindow")
}

func TestDeviceWithoutIOMMU(t *testing.T) {
	f := machineLike(t)
	f.device("0000:00:04.0", "0x1af4", "0x1110", "", "", ivshmemResource, false)
	m := byName(t, Run(context.Background(), Options{Root: f.root}))
	require.Equal(t, Fail, m["iommu"].Status, "a device is present and cannot be used")
	require.Equal(t, Fail, m["vfio"].Status)
	d := m["device 0000:00:04.0"]
	require.Equal(t, Fail, d.Status)
	require.Contains(t, d.Detail, "no driver, no IOMMU group")
	require.NotContains(t, d.Fix, "driver/unbind", "nothing to unbind")
	require.Contains(t, d.Fix, "driver_override")
}

func TestICXRevision(t *testing.T) {
	f := machineLike(t)
	f.withVFIO("3")
	f.device("0000:af:00.0", "0x8086", "0x347e", "vfio-pci", "3", ntbResource, true)
	f.write("/sys/bus/pci/devices/0000:af:00.0/revision", "0x20\n")
	d := byName(t, Run(context.Background(), Options{Root: f.root}))["device 0000:af:00.0"]
	require.Equal(t, Fail, d.Status)
	require.Contains(t, d.Detail, "Intel NTB gen4")
	require.Contains(t, d.Detail, "revision 0x20")
}

func TestHugepages(t *testing.T) {
	f := machineLike(t)
	require.Equal(t, Warn, byName(t, Run(context.Background(), Options{Root: f.root}))["hugepages"].Status)
	f.write("/proc/meminfo", strings.NewReplacer("HugePages_Total:       0", "HugePages_Total:     512",
		"HugePages_Free:        0", "HugePages_Free:      500").Replace(meminfoNoHuge))
	r := byName(t, Run(context.Background(), Options{Root: f.root}))["hugepages"]
	require.Equal(t, Pass, r.Status)
	require.Equal(t, "HugePages_Total 512, HugePages_Free 500, Hugepagesize 2MiB", r.Detail)
}

func TestClocksource(t *testing.T) {
	for _, tc := range []struct {
		cur, avail string
		want       Status
		fix        string
	}{
		{"tsc", "tsc hpet acpi_pm", Pass, ""},
		{"kvm-clock", "kvm-clock tsc", Pass, ""},
		{"hpet", "tsc hpet acpi_pm", Warn, "echo tsc >"},
		{"acpi_pm", "hpet acpi_pm", Warn, "dmesg"},
	} {
		t.Run(tc.cur, func(t *testing.T) {
			f := machineLike(t)
			f.write("/sys/devices/system/clocksource/clocksource0/current_clocksource", tc.cur+"\n")
			f.write("/sys/devices/system/clocksource/clocksource0/available_clocksource", tc.avail+"\n")
			r := byName(t, Run(context.Background(), Options{Root: f.root}))["clocksource"]
			require.Equal(t, tc.want, r.Status, r.Detail)
			require.Contains(t, r.Detail, "current "+tc.cur)
			if tc.fix != "" {
				require.Contains(t, r.Fix, tc.fix)
			}
			if tc.cur == "acpi_pm" {
				require.NotContains(t, r.Fix, "echo tsc", "tsc is not available")
			}
		})
	}
}

func TestCPUsVsPartitions(t *testing.T) {
	f := machineLike(t)
	cfg := testConfig(t, "/tmp/unused", 4)
	m := byName(t, Run(context.Background(), Options{Root: f.root, Config: cfg, MonitorSocket: filepath.Join(f.root, "none.sock")}))
	r := m["cpus"]
	require.Equal(t, Warn, r.Status, r.Detail)
	require.Contains(t, r.Detail, "8 partition worker(s) = 2 NTB link(s) × 4 partition(s)")
	require.Contains(t, r.Fix, "proxy.partitions")

	n, err := countCPUList("0-3,8,10-11")
	require.NoError(t, err)
	require.Equal(t, 7, n)
	_, err = countCPUList("3-1")
	require.Error(t, err)
}

func TestFabricNotTmpfs(t *testing.T) {
	f := machineLike(t)
	f.write("/proc/mounts", "/dev/vda / ext4 rw 0 0\n")
	r := byName(t, Run(context.Background(), Options{Root: f.root}))["fabric"]
	require.Equal(t, Warn, r.Status, r.Detail)
	require.Contains(t, r.Detail, "on / (ext4)")
	require.Contains(t, r.Detail, "not a tmpfs")
}

// testConfig is host a with peers b and c, each over an NTB link.
func testConfig(t *testing.T, stateDir string, partitions int) *config.Config {
	cfg, err := config.Parse(fmt.Appendf(nil, `host = "a"
state_dir = %q
[auth]
insecure = true
[proxy]
window = 65536
partitions = %d
[[peers]]
host = "b"
control = "127.0.0.1:7470"
link = "rack-a-b"
[[peers]]
host = "c"
control = "127.0.0.1:7471"
link = "rack-a-c"
`, stateDir, partitions))
	require.NoError(t, err)
	return cfg
}

// fakeMonitor serves st as ntmon's status on a Unix socket under dir.
func fakeMonitor(t *testing.T, path string, st ctlapi.Status) {
	ln, err := net.Listen("unix", path)
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != ctlapi.PathStatus {
			ctlapi.Reply(w, nil, ctlapi.Errorf(ctlapi.CodeBadRequest, "no %s", r.URL.Path))
			return
		}
		ctlapi.Reply(w, st, nil)
	})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
}

// shortDir is a temporary directory with a path short enough for a Unix
// socket (108 bytes).
func shortDir(t *testing.T) string {
	dir, err := os.MkdirTemp("", "doctor")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func TestLinksPeerDown(t *testing.T) {
	f := machineLike(t)
	dir := shortDir(t)
	cfg := testConfig(t, dir, 1)
	why := "down since 11:20:01: dial 127.0.0.1:7470: connection refused"
	fakeMonitor(t, cfg.Path(config.MonitorSocket), ctlapi.Status{
		Host: "a", Version: "test",
		Peers: []ctlapi.PeerStatus{
			{Host: "b", Control: "127.0.0.1:7470", Up: false, Why: why, Link: "rack-a-b"},
			{Host: "c", Control: "127.0.0.1:7471", Up: true, Why: "up since 11:19:45", Link: "rack-a-c"},
		},
		Proxy: &ctlapi.Snapshot{Host: "a", Links: []ctlapi.LinkStat{
			{Name: "rack-a-b", Peer: "b", State: "down", Window: 65536},
			{Name: "rack-a-c", Peer: "c", State: "up", Window: 65536, Partitions: []ctlapi.PartitionStat{{Index: 0}}},
		}},
	})
	rs := Run(context.Background(), Options{Root: f.root, Config: cfg})
	m := byName(t, rs)
	require.Equal(t, Fail, m["peer b"].Status)
	require.Contains(t, m["peer b"].Detail, "peer b down")
	require.Contains(t, m["peer b"].Detail, why)
	require.Equal(t, Fail, m["link rack-a-b"].Status)
	require.Contains(t, m["link rack-a-b"].Detail, why, "the link's reason is the peer's")
	require.Equal(t, Pass, m["peer c"].Status)
	require.Equal(t, Pass, m["link rack-a-c"].Status, m["link rack-a-c"].Detail)
	require.Contains(t, m["link rack-a-c"].Detail, "64KiB window, 1 partition(s)")
	require.True(t, Failed(rs))

	var out bytes.Buffer
	require.NoError(t, Write(&out, rs))
	require.Contains(t, out.String(), "peer b         FAIL    peer b down")
	require.Contains(t, out.String(), "\n                       fix: check ntmon on b")
	require.True(t, strings.HasSuffix(out.String(), "2 failed, 2 skipped\n"), out.String())
}

func TestLinksProxyDown(t *testing.T) {
	f := machineLike(t)
	dir := shortDir(t)
	cfg := testConfig(t, dir, 1)
	fakeMonitor(t, cfg.Path(config.MonitorSocket), ctlapi.Status{
		Host: "a",
		Peers: []ctlapi.PeerStatus{
			{Host: "b", Up: true, Why: "up"}, {Host: "c", Up: true, Why: "up"},
		},
		ProxyErr: "dial unix /run/ntstack/a/ntproxy-admin.sock: connect: no such file or directory",
	})
	m := byName(t, Run(context.Background(), Options{Root: f.root, Config: cfg}))
	r := m["link rack-a-b"]
	require.Equal(t, Fail, r.Status)
	require.Contains(t, r.Detail, "ntproxy not reachable")
	require.Contains(t, r.Fix, "systemctl start ntproxy")
}

func TestMonitorNotRunning(t *testing.T) {
	f := machineLike(t)
	dir := shortDir(t)
	cfg := testConfig(t, dir, 1)
	rs := Run(context.Background(), Options{Root: f.root, Config: cfg})
	r := byName(t, rs)["ntmon"]
	require.Equal(t, Fail, r.Status)
	require.Contains(t, r.Detail, "ntmon not running at "+filepath.Join(dir, "ntmon.sock"))
	require.Contains(t, r.Fix, "systemctl start ntmon")
	require.Contains(t, r.Fix, "ntmon -config FILE")
}

func TestEmptyRootHasNoFailures(t *testing.T) {
	rs := Run(context.Background(), Options{Root: t.TempDir()})
	for _, r := range rs {
		require.NotEqual(t, Fail, r.Status, "%s: %s", r.Name, r.Detail)
	}
}

func TestSummaryAndWrite(t *testing.T) {
	rs := []Result{
		{Name: "a", Status: Pass, Detail: "ok"},
		{Name: "longer name", Status: Warn, Detail: "hmm\nsecond line", Fix: "do this\nthen that"},
		{Name: "c", Status: Skip, Detail: "n/a"},
	}
	require.Equal(t, "1 passed, 1 warning, 0 failed, 1 skipped", Summary(rs))
	var out bytes.Buffer
	require.NoError(t, Write(&out, rs))
	require.Equal(t, `CHECK        STATUS  DETAIL
a            PASS    ok
longer name  WARN    hmm
                     second line
                     fix: do this
                          then that
c            SKIP    n/a
1 passed, 1 warning, 0 failed, 1 skipped
`, out.String())
}

func TestUnescapeMount(t *testing.T) {
	require.Equal(t, "/mnt/a b", unescapeMount(`/mnt/a\040b`))
	require.Equal(t, `/x\`, unescapeMount(`/x\`))
}
