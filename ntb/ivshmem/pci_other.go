//go:build !linux

package ivshmem

import (
	"context"

	"github.com/ntstack/ntstack/vfio"
)

// PCIVendorID and PCIDeviceID identify ivshmem devices.
const (
	PCIVendorID = 0x1af4
	PCIDeviceID = 0x1110
)

// PCIConfig says which ivshmem device OpenPCI opens; see the Linux
// documentation.
type PCIConfig struct {
	Host    vfio.Host
	Addr    string
	Vectors int
	Bind    bool
}

// PCIPort is an ivshmem-doorbell device driven through VFIO; it needs
// Linux.
type PCIPort struct{}

var _ Port = (*PCIPort)(nil)

// FindPCI returns an error matching ntb.ErrNotSupported.
func FindPCI(vfio.Host) ([]string, error) { return nil, errNoLinux }

// OpenPCI returns an error matching ntb.ErrNotSupported.
func OpenPCI(PCIConfig) (*PCIPort, error) { return nil, errNoLinux }

func (*PCIPort) Addr() string                    { return "" }
func (*PCIPort) ID() int                         { return -1 }
func (*PCIPort) Vectors() int                    { return 0 }
func (*PCIPort) Mem() []byte                     { return nil }
func (*PCIPort) Ring(peer, vector int) error     { return errNoLinux }
func (*PCIPort) Wait(context.Context, int) error { return errNoLinux }
func (*PCIPort) Close() error                    { return nil }
