package vfio

import (
	"errors"
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// Group owns an open /dev/vfio/N: an IOMMU group, the smallest set of
// devices the IOMMU can isolate from each other.
type Group struct {
	file vfioFile
	id   int
}

// OpenGroup opens IOMMU group id and checks that it is viable. The kernel
// lets one process at a time hold a group open.
func (h Host) OpenGroup(id int) (_ *Group, err error) {
	path := h.dev("vfio", strconv.Itoa(id))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("open group %d: %w", id, h.openError(path, err))
	}
	g := &Group{file: vfioFile{f: f}, id: id}
	defer func() {
		if err != nil {
			g.Close()
		}
	}()
	st, err := g.Status()
	if err != nil {
		return nil, fmt.Errorf("open group %d: %w", id, err)
	}
	if !st.Viable {
		return nil, fmt.Errorf("open group %d: %w", id, h.notViable(id))
	}
	return g, nil
}

// ID returns the group number.
func (g *Group) ID() int { return g.id }

// Status reports whether the group is viable and attached to a container.
func (g *Group) Status() (GroupStatus, error) {
	s := vfioGroupStatus{Argsz: sizeof[vfioGroupStatus]()}
	if _, err := g.file.ioctlBuf(vfioGroupGetStatus, asBytes(&s)); err != nil {
		return GroupStatus{}, fmt.Errorf("get group %d status: %w", g.id, err)
	}
	return GroupStatus{
		Viable:       s.Flags&vfioGroupFlagsViable != 0,
		ContainerSet: s.Flags&vfioGroupFlagsContainerSet != 0,
	}, nil
}

// SetContainer attaches the group to c. The first group attached to a
// container must be followed by Container.SetIOMMU.
func (g *Group) SetContainer(c *Container) error {
	err := c.file.control(func(cfd uintptr) error {
		fd := int32(cfd)
		_, err := g.file.ioctlBuf(vfioGroupSetContainer, asBytes(&fd))
		return err
	})
	if err != nil {
		return fmt.Errorf("set group %d container: %w", g.id, err)
	}
	return nil
}

// UnsetContainer detaches the group from its container. Every device of
// the group must be closed first.
func (g *Group) UnsetContainer() error {
	if _, err := g.file.ioctlVal(vfioGroupUnsetContainer, 0); err != nil {
		return fmt.Errorf("unset group %d container: %w", g.id, err)
	}
	return nil
}

// OpenDevice opens the device at PCI address addr ("0000:01:00.0"), which
// must be in the group. The group must be attached to a container whose
// IOMMU is set.
func (g *Group) OpenDevice(addr string) (_ *Device, err error) {
	addr, err = parsePCIAddr(addr)
	if err != nil {
		return nil, fmt.Errorf("open device: %w", err)
	}
	name := append([]byte(addr), 0)
	fd, err := g.file.ioctlBuf(vfioGroupGetDeviceFd, name)
	switch {
	case errors.Is(err, unix.EBUSY):
		return nil, fmt.Errorf("open device %s: %w (%w)", addr, ErrDeviceBusy, err)
	case errors.Is(err, unix.ENODEV):
		return nil, fmt.Errorf("open device %s: not in group %d or not bound to vfio-pci: %w (%w)", addr, g.id, ErrNoSuchDevice, err)
	case errors.Is(err, unix.EINVAL):
		return nil, fmt.Errorf("open device %s: %w (attach group %d to a container and set its IOMMU first)", addr, err, g.id)
	case err != nil:
		return nil, fmt.Errorf("open device %s: %w", addr, err)
	}
	d := &Device{file: vfioFile{f: os.NewFile(fd, "vfio-device "+addr)}}
	defer func() {
		if err != nil {
			d.Close()
		}
	}()
	if d.config, err = d.RegionInfo(RegionConfig); err != nil {
		return nil, fmt.Errorf("open device %s: %w", addr, err)
	}
	return d, nil
}

// Close closes the group. It is idempotent. The kernel detaches the group
// from its container once the group's devices are closed too.
func (g *Group) Close() error { return g.file.close() }
