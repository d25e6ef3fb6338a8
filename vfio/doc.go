// Package vfio drives PCI devices from user space through Linux VFIO: it
// opens the container, IOMMU groups and devices, maps BARs and DMA
// buffers, accesses config space and routes interrupts to eventfds. The
// ivshmem and NTB backends of package ntb reach their windows and
// doorbells through it. It is pure Go over golang.org/x/sys/unix; on other
// platforms every operation fails with ErrNotSupported.
//
//	/dev/vfio/vfio             /dev/vfio/<N>                  anonymous fd
//	┌────────────────┐ attach ┌──────────────────┐   open    ┌───────────────────────┐
//	│ Container      │◄───────│ Group N          │──────────►│ Device 0000:01:00.0   │
//	│ one IOMMU      │        │ devices the IOMMU│           │ RegionInfo, MapBAR ───┼─► Mapping
//	│ address space  │        │ cannot tell apart│           │ Read/WriteConfig      │
//	│ SetIOMMU       │        │ (all vfio-pci)   │           │ SetBusMaster          │
//	│ MapDMA ◄───────┼─ DMABuffer (IOVA → pages) │           │ SetIRQEventfds ───────┼─► Eventfd
//	└────────────────┘        └──────────────────┘           └───────────────────────┘
//
// Setup, in this order: Host.CheckGroup to diagnose (Host.BindVFIO to bind
// a device to vfio-pci first), Host.OpenContainer, Host.OpenGroup,
// Group.SetContainer, Container.SetIOMMU, Group.OpenDevice. Tear down in
// reverse: mappings, device, group, container.
//
// Concurrency: every method is safe for concurrent use, Close included: a
// call racing with Close either completes or fails with an error matching
// os.ErrClosed, never reaching a recycled descriptor. The slices returned
// by Mapping.Bytes and DMABuffer.Bytes are the exception: see below.
//
// Lifetimes, and the usual ways to get them wrong:
//   - Bytes of a Mapping or DMABuffer is valid until that owner's Close;
//     touching it afterwards faults and kills the process. A region Mapping
//     keeps the device open in the kernel until it is closed itself.
//   - Unmap a DMABuffer from the container (UnmapDMA) before closing it:
//     the IOMMU keeps its pages pinned and the device can still write them.
//   - Interrupts: the kernel signals the eventfds handed to SetIRQEventfds
//     until the vectors are detached (fd -1, DisableIRQs) or the Device is
//     closed. Shut down with DisableIRQs, then Eventfd.Close (which wakes
//     the goroutines in Wait), then Device.Close.
//   - MSI and MSI-X are DMA writes: without SetBusMaster(true) the device
//     drops them silently.
//   - The kernel lets one process at a time hold a group open; a second
//     open fails with ErrDeviceBusy.
//
// Errors wrap the sentinels ErrNotSupported, ErrNoIOMMU, ErrNotBound,
// ErrGroupNotViable, ErrDeviceBusy, ErrNoSuchDevice and ErrMissingBAR, to
// be matched with errors.Is; their text says what to fix.
//
// Unit tests run without privileges on fake sysfs and /dev trees, regular
// files standing in for device files, and the kernel's byte layouts built
// by hand. The ioctls themselves only run against a real device, in the
// VM tier: see TestRealDevice.
package vfio
