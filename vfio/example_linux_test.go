package vfio_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/ntstack/ntstack/vfio"
)

// Open a device by PCI address, map its BAR 2 and route its first MSI-X
// vector to an eventfd.
func Example() {
	const addr = "0000:01:00.0"
	var h vfio.Host // the running system's /sys and /dev

	group, err := h.CheckGroup(addr)
	if errors.Is(err, vfio.ErrNotBound) {
		err = h.BindVFIO(addr) // needs root
	}
	if err != nil {
		log.Fatal(err) // the error says what to fix
	}
	c, err := h.OpenContainer()
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	g, err := h.OpenGroup(group)
	if err != nil {
		log.Fatal(err)
	}
	defer g.Close()
	if err := g.SetContainer(c); err != nil {
		log.Fatal(err)
	}
	if err := c.SetIOMMU(); err != nil {
		log.Fatal(err)
	}
	d, err := g.OpenDevice(addr)
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()

	if err := d.RequireBARs(map[int]uint64{2: 1 << 20}); err != nil {
		log.Fatal(err)
	}
	bar2, err := d.MapBAR(2)
	if err != nil {
		log.Fatal(err)
	}
	defer bar2.Close() // deferred calls run last-in first-out: before d.Close
	fmt.Println(len(bar2.Bytes()))

	ev, err := vfio.NewEventfd()
	if err != nil {
		log.Fatal(err)
	}
	defer ev.Close()
	if err := d.SetBusMaster(true); err != nil { // or MSI-X is dropped
		log.Fatal(err)
	}
	if err := d.SetIRQEventfds(vfio.IRQMSIX, 0, []int{ev.FD()}); err != nil {
		log.Fatal(err)
	}
	defer d.DisableIRQs(vfio.IRQMSIX)
	n, err := ev.Wait() // the number of interrupts since the last Wait
	fmt.Println(n, err)
}
