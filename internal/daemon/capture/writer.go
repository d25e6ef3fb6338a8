package capture

import (
	"fmt"
	"io"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/ntstack/ntstack/internal/transport"
)

// SectionComment is the comment of every capture's pcapng section header:
// what the file holds and how to read it.
const SectionComment = "ntstack frame capture: link type LINKTYPE_USER0 (147); each packet is " +
	"the ntstack pseudo-header v1 (24 bytes, little-endian: version, hdrlen, dir, ring, kind, flags, " +
	"reserved, conn, local, length, link) then the frame's payload, snapped. " +
	"Dissector: `ntmon capture -lua ntstack.lua`, then `tshark -X lua_script:ntstack.lua -r FILE`."

// Writer writes records as a pcapng stream: a section header, an interface
// (LinkType) per link, an enhanced packet block per record, and at Close
// the first interface's statistics (frames seen and dropped). Not safe for
// concurrent use.
type Writer struct {
	ng      *pcapgo.NgWriter
	snap    int
	ifaces  map[string]int // interface index by link name
	filter  string
	buf     []byte
	started time.Time
	packets uint64
}

// NewWriter starts a pcapng stream on w whose first interface is link.
// snap is the payload snap length the records were taken with (it sets the
// interfaces' snap length); filter, if set, is recorded as their capture
// filter (e.g. "conn 3").
func NewWriter(w io.Writer, link string, snap int, filter string) (*Writer, error) {
	cw := &Writer{snap: snap, ifaces: map[string]int{link: 0}, filter: filter, started: time.Now()}
	ng, err := pcapgo.NewNgWriterInterface(w, cw.iface(link), pcapgo.NgWriterOptions{
		SectionInfo: pcapgo.NgSectionInfo{Application: "ntstack", Comment: SectionComment},
	})
	if err != nil {
		return nil, fmt.Errorf("start capture file: %w", err)
	}
	cw.ng = ng
	return cw, nil
}

func (w *Writer) iface(link string) pcapgo.NgInterface {
	return pcapgo.NgInterface{
		Name:                link,
		Description:         fmt.Sprintf("ntstack link %s (link id %#08x)", link, LinkID(link)),
		Filter:              w.filter,
		LinkType:            LinkType,
		SnapLength:          uint32(HeaderLen + w.snap),
		TimestampResolution: 9,
	}
}

// Write writes one record. dropped is the number of frames lost since the
// previous record (the tap's queue was full); it is written as the
// packet's drop count, which Wireshark shows as frame.drop_count.
func (w *Writer) Write(r *Record, dropped uint64) error {
	id, ok := w.ifaces[r.Link]
	if !ok {
		var err error
		if id, err = w.ng.AddInterface(w.iface(r.Link)); err != nil {
			return fmt.Errorf("write capture interface %s: %w", r.Link, err)
		}
		w.ifaces[r.Link] = id
	}
	var err error
	w.buf, err = AppendPacket(w.buf[:0], r)
	if err != nil {
		return err
	}
	dir := pcapgo.NgEpbFlagDirectionOutbound
	if r.Dir == transport.TapRX {
		dir = pcapgo.NgEpbFlagDirectionInbound
	}
	opts := pcapgo.NgPacketOptions{Flags: &pcapgo.NgEpbFlags{Direction: dir}}
	if dropped > 0 {
		opts.DropCount = &dropped
	}
	ci := gopacket.CaptureInfo{
		Timestamp: r.Time, CaptureLength: len(w.buf), Length: HeaderLen + r.Length, InterfaceIndex: id,
	}
	if err := w.ng.WritePacketWithOptions(ci, w.buf, opts); err != nil {
		return fmt.Errorf("write capture packet: %w", err)
	}
	w.packets++
	return nil
}

// Flush writes out what is buffered.
func (w *Writer) Flush() error {
	if err := w.ng.Flush(); err != nil {
		return fmt.Errorf("flush capture: %w", err)
	}
	return nil
}

// Close writes the statistics of the first interface — frames the tap saw
// (written or dropped) and dropped — and flushes. It does not close the
// underlying writer.
func (w *Writer) Close(dropped uint64) error {
	now := time.Now()
	err := w.ng.WriteInterfaceStats(0, pcapgo.NgInterfaceStatistics{
		LastUpdate: now, StartTime: w.started, EndTime: now,
		PacketsReceived: w.packets + dropped, PacketsDropped: dropped,
	})
	if err != nil {
		return fmt.Errorf("write capture statistics: %w", err)
	}
	return w.Flush()
}
