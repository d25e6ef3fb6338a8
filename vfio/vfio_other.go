//go:build !linux

package vfio

import (
	"fmt"
	"runtime"
	"time"
)

// VFIO exists on Linux only: elsewhere every operation fails with
// errNoVFIO, which matches ErrNotSupported.

var errNoVFIO = fmt.Errorf("vfio on %s: %w", runtime.GOOS, ErrNotSupported)

// Container is an open VFIO container; see the Linux documentation.
type Container struct{}

// Group is an open IOMMU group; see the Linux documentation.
type Group struct{}

// Device is an open VFIO device; see the Linux documentation.
type Device struct{}

// Mapping owns mmap'd memory; see the Linux documentation.
type Mapping struct{}

// DMABuffer is memory for device DMA; see the Linux documentation.
type DMABuffer struct{}

// Eventfd owns an eventfd; see the Linux documentation.
type Eventfd struct{}

func (Host) OpenContainer() (*Container, error)  { return nil, errNoVFIO }
func (Host) OpenGroup(id int) (*Group, error)    { return nil, errNoVFIO }
func (Host) IOMMUGroup(addr string) (int, error) { return 0, errNoVFIO }
func (Host) BindVFIO(addr string) error          { return errNoVFIO }
func (Host) CheckGroup(addr string) (int, error) { return 0, errNoVFIO }
func (Host) MapResourceWC(addr string, bar, size int) (*Mapping, error) {
	return nil, errNoVFIO
}
func (Host) ResourceStart(addr string, bar int) (uint64, error) { return 0, errNoVFIO }
func NewDMABuffer(size int) (*DMABuffer, error)                 { return nil, errNoVFIO }
func NewEventfd() (*Eventfd, error)                             { return nil, errNoVFIO }

func (*Container) SetIOMMU() error                                    { return errNoVFIO }
func (*Container) IOMMUInfo() (IOMMUInfo, error)                      { return IOMMUInfo{}, errNoVFIO }
func (*Container) MapDMA(buf *DMABuffer, iova IOVA, f DMAFlags) error { return errNoVFIO }
func (*Container) UnmapDMA(iova IOVA, size uint64) error              { return errNoVFIO }
func (*Container) Close() error                                       { return nil }

func (*Group) ID() int                                 { return -1 }
func (*Group) Status() (GroupStatus, error)            { return GroupStatus{}, errNoVFIO }
func (*Group) SetContainer(c *Container) error         { return errNoVFIO }
func (*Group) UnsetContainer() error                   { return errNoVFIO }
func (*Group) OpenDevice(addr string) (*Device, error) { return nil, errNoVFIO }
func (*Group) Close() error                            { return nil }

func (*Device) Info() (DeviceInfo, error)                                 { return DeviceInfo{}, errNoVFIO }
func (*Device) RegionInfo(index RegionIndex) (RegionInfo, error)          { return RegionInfo{}, errNoVFIO }
func (*Device) MapRegion(index RegionIndex) (*Mapping, error)             { return nil, errNoVFIO }
func (*Device) MapBAR(bar int) (*Mapping, error)                          { return nil, errNoVFIO }
func (*Device) RequireBARs(minSizes map[int]uint64) error                 { return errNoVFIO }
func (*Device) ReadConfig(off int64, p []byte) error                      { return errNoVFIO }
func (*Device) WriteConfig(off int64, p []byte) error                     { return errNoVFIO }
func (*Device) SetBusMaster(on bool) error                                { return errNoVFIO }
func (*Device) IRQInfo(index IRQIndex) (IRQInfo, error)                   { return IRQInfo{}, errNoVFIO }
func (*Device) SetIRQEventfds(index IRQIndex, start int, fds []int) error { return errNoVFIO }
func (*Device) DisableIRQs(index IRQIndex) error                          { return errNoVFIO }
func (*Device) MaskIRQ(index IRQIndex, sub int) error                     { return errNoVFIO }
func (*Device) UnmaskIRQ(index IRQIndex, sub int) error                   { return errNoVFIO }
func (*Device) Reset() error                                              { return errNoVFIO }
func (*Device) Close() error                                              { return nil }

func (*Mapping) Bytes() []byte { return nil }
func (*Mapping) Close() error  { return nil }

func (*DMABuffer) Bytes() []byte { return nil }
func (*DMABuffer) Close() error  { return nil }

func (*Eventfd) FD() int                           { return -1 }
func (*Eventfd) Wait() (uint64, error)             { return 0, errNoVFIO }
func (*Eventfd) SetReadDeadline(t time.Time) error { return errNoVFIO }
func (*Eventfd) Close() error                      { return nil }
