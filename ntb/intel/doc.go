// Package intel is the ntb.Device backend for Intel Xeon NTB ports of the
// Skylake-SP (gen3, PCI device 0x201C) and Ice Lake-SP (gen4, 0x347E)
// generations in a back-to-back topology, driven from user space through
// package vfio.
//
// Status: tested against a simulated register file only (SimulatedPair);
// it has never run on real hardware. The register offsets, bits and
// sequences follow Linux (drivers/ntb/hw/intel: ntb_hw_intel.h,
// ntb_hw_gen3.[ch], ntb_hw_gen4.[ch]) and DPDK (drivers/raw/ntb:
// ntb_hw_intel.[ch], ntb.[ch]); where the two differ, Linux is followed.
//
// How the port is used:
//
//	BAR0 (uncached)  registers, behind the Regs seam
//	BAR2             outbound window: mapped write-combined through
//	                 /sys/bus/pci/devices/<addr>/resource2_wc
//	inbound window   a vfio DMA buffer at an IOVA aligned to the BAR size;
//	                 IMXLAT = that IOVA, IMXLMT = BAR2 base + window size
//	doorbells        ring: write 1 to IM_DOORBELL+4*bit (reaches the peer);
//	                 pending/clear: IM_INT_STATUS (write 1 to clear);
//	                 mask: IM_INT_DISABLE. 30 bits on gen3, 31 on gen4:
//	                 the next is the monitor's hello (see regs.go).
//	scratchpads      read our IM_SPAD; write the peer's through B2B_SPAD
//	                 (gen3 0x180) or EM_SPAD (gen4 0x8080). 12 of the 16
//	                 are the user's; the top 4 carry the handshake.
//	interrupts       33 MSI-X vectors (source i routed to vector i through
//	                 INTVEC) all signal one eventfd; each message wakes
//	                 every WaitDoorbell caller to re-read the status.
//	link             gen3: PCIe link status in config space (0x1a2);
//	                 gen4: LINK_STATUS in MMIO, after LINK_CTRL and PPD0
//	                 link training are enabled.
//
// The link is reported up only when the PCIe link is active and the
// peer's driver has written the handshake into our scratchpads (magic and
// version, a per-instance nonce, its window size, which must equal ours)
// and its heartbeat scratchpad has moved. With the first handshake it
// writes after it starts or the PCIe link returns, an end also rings the
// peer's hello doorbell, so each end comes up as soon as the other has
// written, not a heartbeat later. Close clears the nonce on the
// peer, shuts the inbound translation and disables the link, so the peer
// sees it go down at its next poll (ntb.CauseClosed; a link that fails
// under a live peer is ntb.CauseHardware). A peer whose heartbeat stands
// still past HeartbeatTimeout makes the link suspect; past SilentTimeout
// the link goes down (ntb.CauseSilent): across hosts a crashed peer cannot
// be told from a hung one.
//
// Modelled by the simulator: the registers above, with their side effects
// across the pair (doorbells, scratchpads, link enable per generation,
// the link status bit and gen4's DLLSCS latch, interrupt masking), the
// identity and port-definition registers, and heap memory for the
// windows. Not modelled, and so untested: address translation itself
// (the windows are shared memory whatever XLAT/LIMIT say), write
// combining, posted-write ordering and PCIe errors, MSI-X delivery and
// the single-eventfd routing, link training timing, the B2B BAR address
// programming Linux does with its xeon_b2b_* addresses (this backend
// leaves it to firmware), BAR4/the second window, split BARs, the
// Sapphire Rapids layout and the SKX errata beyond the vector 32 one.
// Write-combined sysfs mappings can also be refused by kernels built with
// CONFIG_IO_STRICT_DEVMEM while vfio-pci holds the BAR.
//
// Concurrency: every Device method is safe for concurrent use. Lifetime:
// the window slices are unmapped by Close, and touching them afterwards
// faults; close the Device before the vfio Device, Group and Container it
// was opened on, and after everything that holds a window.
package intel
