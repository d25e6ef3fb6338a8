package intel

import (
	"encoding/binary"
	"fmt"
)

// Gen is a generation of Intel Xeon NTB port.
type Gen int

const (
	// Gen3 is the Skylake-SP (SKX) port, PCI device 0x201C.
	Gen3 Gen = 3
	// Gen4 is the Ice Lake-SP (ICX) port, PCI device 0x347E, revisions
	// 0x2-0xF (Sapphire Rapids shares the id with other revisions and a
	// different port-definition layout; it is not supported).
	Gen4 Gen = 4
)

func (g Gen) String() string {
	switch g {
	case Gen3:
		return "gen3"
	case Gen4:
		return "gen4"
	}
	return fmt.Sprintf("gen%d", int(g))
}

// PCI identity (Linux ntb_hw_intel.h, ntb_hw_gen4.h; DPDK ntb.h).
const (
	VendorIntel = 0x8086
	DeviceSKX   = 0x201C // PCI_DEVICE_ID_INTEL_NTB_B2B_SKX
	DeviceICX   = 0x347E // NTB_INTEL_DEV_ID_B2B_ICX
	icxRevMin   = 0x02   // PCI_DEVICE_REVISION_ICX_MIN
	icxRevMax   = 0x0F   // PCI_DEVICE_REVISION_ICX_MAX
)

// PCI config space offsets.
const (
	cfgVendorID       = 0x000
	cfgDeviceID       = 0x002
	cfgRevision       = 0x008
	cfgGen3PPD        = 0x0d4 // XEON_PPD_OFFSET: port definition (byte)
	cfgGen3LinkStatus = 0x1a2 // GEN3_LINK_STATUS_OFFSET: PCIe link status (16)
)

// BAR0 registers both generations share (ntb_hw_gen3.h, ntb_hw_gen4.h).
// Widths in bits in brackets.
const (
	regNTBCntl      = 0x0000 // NTBCNTL [32]: snoop and link-disable bits
	regIMXlat       = 0x0010 // IMBAR1XBASE / IM23XBASE [64]: where inbound window 0 lands (our IOVA)
	regIMLimit      = 0x0018 // IMBAR1XLMT / IM23XLMT [64]: BAR2 base + window size
	regIntStatus    = 0x0040 // IM_INT_STATUS [64]: pending doorbells, bit 32 = link change; write 1 to clear
	regIntDisable   = 0x0048 // IM_INT_DISABLE [64]: doorbell interrupt mask
	regSpad         = 0x0080 // IM_SPAD [16 x 32]: our scratchpads, written by the peer
	regPeerDoorbell = 0x0100 // IM_DOORBELL [32 x 32]: writing 1 at +4*bit rings that bit on the peer
)

// Gen3 (SKX) only.
const (
	regGen3IntVec   = 0x00d0 // INTVEC [33 x 8]: interrupt source -> MSI-X vector
	regGen3PeerSpad = 0x0180 // B2B_SPAD [16 x 32]: the peer's scratchpads, through the B2B path
	regGen3EMLimit  = 0x4018 // EMBAR1XLMT [64]: external side limit of window 0
	regGen3SPCICmd  = 0x4504 // SPCICMD [16]: secondary side PCI command
	regGen3EMBar1   = 0x4518 // EMBAR1 / SBAR23BASE [64]: external side base of window 0
)

// Gen4 (ICX) only. Link control and status live in MMIO, not config space.
const (
	regGen4IntVec     = 0x0050 // INTVEC [33 x 8]
	regGen4IMBaseIdx  = 0x0074 // IM23XBASEIDX [16]: log2 of the window size
	regGen4PeerSpad   = 0x8080 // EM_SPAD [16 x 32]: the peer's scratchpads
	regGen4LinkCtrl   = 0xb050 // LINK_CTRL [16]
	regGen4LinkStatus = 0xb052 // LINK_STATUS [16]
	regGen4SlotStatus = 0xb05a // SLOTSTS [16]
	regGen4PPD0       = 0xb0d4 // PPD0 [32]: link training
	regGen4PPD1       = 0xb4c0 // PPD1 [32]: port definition
)

// Register bits.
const (
	ntbCtlCfgLock = 1 << 0 // NTB_CTL_CFG_LOCK
	ntbCtlDisable = 1 << 1 // NTB_CTL_DISABLE
	// NTB_CTL_{S2P,P2S}_BAR{2,4}_SNOOP on gen3, NTB_CTL_{E2I,I2E}_BAR{23,45}_SNOOP
	// on gen4: the same four bits.
	ntbCtlSnoop = 1<<2 | 1<<4 | 1<<6 | 1<<8

	lnkStaActive = 0x2000 // NTB_LNK_STA_ACTIVE_BIT: data link layer active

	gen3PPDConnMask  = 0x03 // XEON_PPD_CONN_MASK
	gen3PPDConnB2B   = 0x01 // XEON_PPD_CONN_B2B
	gen3PPDDevDSD    = 0x10 // XEON_PPD_DEV_DSD
	gen3PPDSplitBAR  = 0x40 // XEON_PPD_SPLIT_BAR_MASK
	gen4PPDConnMask  = 0x0300
	gen4PPDConnB2B   = 0x0200
	gen4PPDDevDSD    = 0x1000
	gen4PPDLinkTrain = 0x0008 // GEN4_PPD_LINKTRN
	gen4LinkDisable  = 0x0010 // GEN4_LINK_CTRL_LINK_DISABLE
	gen4SlotDLLSCS   = 0x0100 // GEN4_SLOTSTS_DLLSCS: must be cleared before the link bit

	pciCommandMemory = 0x2
	pciCommandMaster = 0x4

	linkDoorbell = uint64(1) << 32 // GEN3/GEN4_DB_LINK_BIT
	msixVectors  = 33              // GEN3/GEN4_DB_MSIX_VECTOR_COUNT
	hwSpads      = 16              // GEN3/GEN4_SPAD_COUNT
	hwDoorbells  = 32              // GEN3/GEN4_DB_COUNT
	windowBAR    = 2               // memory window 0 is BAR2 (mw_bar = {2, 4})
	minWindow    = 4096
)

// layout is what differs between generations.
type layout struct {
	gen       Gen
	intVec    int
	peerSpad  int
	doorbells int    // bits offered to users: those below helloBit
	helloBit  uint64 // the doorbell the monitor rings (see below)
	linkBits  uint64 // INT_STATUS bits the link interrupt uses
	bar0Size  int    // BAR0 must reach the last register used
}

// layouts: on SKX MSI-X vector 32 is broken, so Linux routes the link
// source to vector 31 and treats doorbell 31 as a link bit
// (NTB_HWERR_MSIX_VECTOR32_BAD). The highest doorbell left is the
// monitor's hello: an end rings it with the first handshake it writes
// after it starts or the PCIe link returns, so the peer's monitor reads
// the handshake at once rather than at its next tick (scratchpad writes
// raise no interrupt).
// Users get the bits below it: 0-29 on gen3, 0-30 on gen4.
var layouts = map[Gen]layout{
	Gen3: {gen: Gen3, intVec: regGen3IntVec, peerSpad: regGen3PeerSpad, doorbells: 30, helloBit: 1 << 30, linkBits: linkDoorbell | 1<<31, bar0Size: regGen3EMBar1 + 8},
	Gen4: {gen: Gen4, intVec: regGen4IntVec, peerSpad: regGen4PeerSpad, doorbells: 31, helloBit: 1 << 31, linkBits: linkDoorbell, bar0Size: regGen4PPD1 + 4},
}

// Scratchpads. The top four carry the bring-up handshake; users get the
// rest. Each side writes the peer's copy (remote write, local read):
//
//	hw spad   written by  meaning
//	0 .. 11   peer        user scratchpads (ScratchpadCount = 12)
//	12        peer        handshakeMagic<<16 | handshakeVersion
//	13        peer        the peer driver's instance nonce; 0 = detached
//	14        peer        the peer's inbound window size in 4 KiB pages
//	15        peer        heartbeat, +1 per HeartbeatInterval
const (
	spadMagic        = 12
	spadNonce        = 13
	spadWindow       = 14
	spadHeartbeat    = 15
	userSpads        = spadMagic
	handshakeMagic   = 0x4e54 // "NT"
	handshakeVersion = 1
	handshakeWord    = handshakeMagic<<16 | handshakeVersion
)

// Regs is the register-access seam: BAR0 of one NTB port, addressed by
// byte offset. Its implementations are the mmap'ed BAR0 of a VFIO device
// and the simulator's register file. Every access is one naturally aligned
// load or store of the stated width, safe for concurrent use; offsets
// outside the register file panic (they are constants, so a bad one is a
// bug).
type Regs interface {
	Write8(off int, v uint8)
	Read16(off int) uint16
	Write16(off int, v uint16)
	Read32(off int) uint32
	Write32(off int, v uint32)
	Read64(off int) uint64
	Write64(off int, v uint64)
}

// configSpace reads PCI config space (a *vfio.Device, or the simulator).
type configSpace interface {
	ReadConfig(off int64, p []byte) error
}

func readConfig16(c configSpace, off int64) (uint16, error) {
	var b [2]byte
	if err := c.ReadConfig(off, b[:]); err != nil {
		return 0, fmt.Errorf("read config %#x: %w", off, err)
	}
	return binary.LittleEndian.Uint16(b[:]), nil
}

// identify checks the vendor and device id and returns the layout.
func identify(c configSpace) (layout, error) {
	vendor, err := readConfig16(c, cfgVendorID)
	if err != nil {
		return layout{}, err
	}
	device, err := readConfig16(c, cfgDeviceID)
	if err != nil {
		return layout{}, err
	}
	rev, err := readConfig16(c, cfgRevision)
	if err != nil {
		return layout{}, err
	}
	rev &= 0xff
	switch {
	case vendor != VendorIntel:
		return layout{}, notSupported("pci device %04x:%04x is not an Intel NTB port", vendor, device)
	case device == DeviceSKX:
		return layouts[Gen3], nil
	case device == DeviceICX && rev >= icxRevMin && rev <= icxRevMax:
		return layouts[Gen4], nil
	case device == DeviceICX:
		return layout{}, notSupported("intel ntb 347e revision %#x (not Ice Lake; Sapphire Rapids?)", rev)
	}
	return layout{}, notSupported("intel device %04x (only SKX 201c and ICX 347e)", device)
}

// topology reads the port definition: only back-to-back ports are
// supported. It returns the port number, 0 for the upstream side (USD),
// 1 for the downstream side (DSD), as Linux's intel_ntb_port_number.
func topology(lay layout, c configSpace, r Regs) (int, error) {
	if lay.gen == Gen3 {
		var b [1]byte
		if err := c.ReadConfig(cfgGen3PPD, b[:]); err != nil {
			return 0, fmt.Errorf("read port definition: %w", err)
		}
		ppd := b[0]
		switch {
		case ppd&gen3PPDConnMask != gen3PPDConnB2B:
			return 0, notSupported("ntb topology (ppd %#x): only back-to-back", ppd)
		case ppd&gen3PPDSplitBAR != 0:
			return 0, notSupported("split BAR4/5 (ppd %#x)", ppd)
		case ppd&gen3PPDDevDSD != 0:
			return 1, nil
		}
		return 0, nil
	}
	ppd := r.Read32(regGen4PPD1)
	if ppd&gen4PPDConnMask != gen4PPDConnB2B {
		return 0, notSupported("ntb topology (ppd1 %#x): only back-to-back", ppd)
	}
	if ppd&gen4PPDDevDSD != 0 {
		return 1, nil
	}
	return 0, nil
}
