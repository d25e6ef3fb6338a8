// Package vm is ntstack's VM test tier: it boots QEMU guests under TCG,
// each with an emulated Intel IOMMU and QEMU's ivshmem-doorbell PCI device,
// and runs the project's VFIO path against that device with real ioctls —
// what no host in CI can offer (no VFIO, no NTB, no KVM).
//
// The package holds only tests; `make vmtest` runs them. Its steps:
//
//  1. Kernel: `apt-get download` the package linux-image-cloud-amd64
//     depends on and unpack it with `dpkg -x`, cached under
//     NTSTACK_VM_CACHE (make vmtest: out/vm; else the user cache dir).
//  2. Initramfs: a busybox (busybox-static) cpio with /init and the VFIO
//     modules of that kernel (irqbypass, vfio, vfio_iommu_type1,
//     vfio_virqfd, vfio-pci-core, vfio-pci, decompressed if need be),
//     followed by a second cpio with the test binaries: test/vm/guest's
//     and vfio's, built with `go test -c` and CGO_ENABLED=0.
//  3. Per scenario, the project's own ivshmem server (ivshmem.NewServer)
//     runs in the test process on a socket and a shared-memory file in a
//     temporary directory, and one or two guests start with
//     `-chardev socket,...  -device ivshmem-doorbell,...` pointing at it.
//     The kernel command line names the tests /init runs (ntvm.run) and
//     their parameters; see package guest for both.
//  4. /init loads the modules, runs each test binary, prints
//     "NTVM-RESULT <bin>:<Test> PASS|FAIL" per test and "NTVM-END", and
//     powers off. The harness requires every result to be PASS, the
//     binary's own "--- PASS" line, and checks the words the guests left
//     in the shared-memory file.
//
// Scenarios: TestProbe (one guest: the VFIO path by hand with its typed
// errors, region info, BAR mappings, Bus Master Enable, a self-rung MSI-X
// interrupt, a DMA mapping, then ivshmem.OpenPCI), TestDoorbell (two guests, 1000 doorbell round
// trips with the payload checked), TestStack (two guests, socklike over
// ivshmem.NewDevice over the PCI port, 10,000 messages each way checked
// byte for byte) and TestConn (one guest with two ivshmem devices on one
// server, nettest.TestConn over the real device path).
//
// TestRDMA boots a second lab (rdma_test.go): the generic kernel
// (linux-image-amd64's; the cloud kernel lacks rdma_rxe), rdma_rxe and its
// dependencies plus crc32_generic and e1000, test binaries built with the
// verbs tag and cgo, and a third cpio with their shared libraries,
// libibverbs' rxe provider, iproute2's rdma tool and a /setup script that
// /init runs after the modules (address on eth0, `rdma link add`, wait
// for the port to turn ACTIVE). Two guests joined by a QEMU UDP socket
// netdev exchange messages over the verbs provider (package rdmaguest),
// then run the rdma package's nettest and semantics tests on their rxe
// device.
//
// The tests boot guests only with NTSTACK_VMTEST=1 (make vmtest sets it):
// each guest keeps a core busy for seconds, so `go test ./...` skips them
// and says so. With NTSTACK_VMTEST=1 a missing tool is a failure, not a
// skip. Every QEMU runs under timeout(1) and the test's context, and is
// sent SIGTERM if the test process dies. Guest consoles are kept in
// NTSTACK_VM_LOGS (make vmtest: out/vm/logs) and their tails logged on
// failure.
//
// Concurrency: the scenarios run one after another (two TCG guests already
// fill this machine class's two cores); the guests of one scenario run
// together.
package vm
