package capture

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/ntstack/ntstack/internal/transport"
)

// FuzzDecodeNTStack feeds the layer decoders any bytes: a capture's frames
// are peer-written (and a file may come from anywhere). Decoding must not
// panic, must keep its slices inside the input, and a packet it accepts
// with a version-1 header must encode back to the same bytes.
func FuzzDecodeNTStack(f *testing.F) {
	for _, r := range sample(time.Unix(0, 0)) {
		b, err := AppendPacket(nil, &r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
		f.Add(b[:len(b)/2])
	}
	f.Add(make([]byte, HeaderLen))
	f.Fuzz(func(t *testing.T, data []byte) {
		pkt := gopacket.NewPacket(data, LinkType, gopacket.Default)
		for _, l := range pkt.Layers() {
			if len(l.LayerContents())+len(l.LayerPayload()) > len(data) {
				t.Fatalf("%v: %d+%d bytes of %d", l.LayerType(), len(l.LayerContents()), len(l.LayerPayload()), len(data))
			}
		}
		var n NTStack
		if err := n.DecodeFromBytes(data, gopacket.NilDecodeFeedback); err != nil {
			return
		}
		var leg NTStackLeg
		if n.NextLayerType() == LayerTypeNTStackLeg {
			if err := leg.DecodeFromBytes(n.Payload, gopacket.NilDecodeFeedback); err != nil {
				t.Fatalf("leg frame chosen but not decoded: %v", err)
			}
		}
		if n.HeaderLen != HeaderLen || data[offReserved] != 0 || data[offReserved+1] != 0 || n.Flags&^FlagLeg != 0 {
			return // not what AppendPacket writes
		}
		ring := int(n.Ring)
		if n.Ring == RingControl {
			ring = transport.TapControl
		}
		r := Record{Dir: n.Dir, Ring: ring, Kind: n.Kind, Leg: n.Flags&FlagLeg != 0, Conn: n.Conn, Local: n.Local,
			Length: int(n.Length), Payload: data[HeaderLen:]}
		b, err := AppendPacket(nil, &r)
		if err != nil {
			t.Fatalf("re-encode %+v: %v", r, err)
		}
		// The link field is a hash of a name the record does not keep.
		copy(b[offLink:], data[offLink:offLink+4])
		if !bytes.Equal(b, data) {
			t.Fatalf("re-encoded\n%x\nwant\n%x", b, data)
		}
	})
}

// FuzzCopyBlocks feeds the stream copier any bytes: it must not panic,
// what it passes on is whole blocks of the input, in order, it fails only
// with errBlock or a short read, and it counts no more packets than it
// passed blocks.
//
// withHead puts the section and interface blocks Writer writes (~500
// bytes of real options) before the fuzzed bytes. They stay out of the
// fuzzed input because the fuzzer minimises every new input it keeps, at
// a cost that grows with the square of its length; in a package that
// links gopacket each execution costs a few hundred microseconds of
// coverage bookkeeping, so a seed of a whole capture file kept the
// workers minimising instead of fuzzing. The fuzzed bytes start small:
// Writer's records and statistics, and hand-made minimal blocks.
func FuzzCopyBlocks(f *testing.F) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, "ntb0", 64, "")
	if err != nil {
		f.Fatal(err)
	}
	for _, r := range sample(time.Unix(0, 0))[:2] {
		if err := w.Write(&r, 1); err != nil {
			f.Fatal(err)
		}
	}
	if err := w.Close(2); err != nil {
		f.Fatal(err)
	}
	file := buf.Bytes()
	blockLen := func(b []byte) int { return int(binary.LittleEndian.Uint32(b[4:])) }
	n := blockLen(file)
	n += blockLen(file[n:])
	head := file[:n:n]

	block := func(typ uint32, body ...[]byte) []byte {
		var b []byte
		for _, x := range body {
			b = append(b, x...)
		}
		n := uint32(blockMin + len(b))
		b = append(append(binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(nil, typ), n), b...), le(n)...)
		return b[:len(b):len(b)] // appending to it copies: seeds share no memory
	}
	section := block(blockSection, le(uint32(byteOrderMagic), uint16(1), uint16(0), int64(-1)))
	packet := block(blockPacket, le(uint32(0), uint64(0), uint32(4), uint32(4)), []byte("ping"))
	stats := block(blockStatistics, le(uint32(0), uint64(0)),
		le(uint16(optIfRecv), uint16(8), uint64(7)), le(uint16(optIfDrop), uint16(8), uint64(1)), le(uint16(0), uint16(0)))

	f.Add(true, file[len(head):]) // Writer's records and statistics
	f.Add(true, []byte(nil))
	f.Add(false, bytes.Join([][]byte{section, packet, stats}, nil))
	f.Add(false, section)
	f.Add(false, append(section, block(blockStatistics, le(uint32(0)))...)) // statistics without options
	f.Add(false, append(section, packet[:len(packet)-1]...))                // truncated
	f.Add(false, packet)                                                    // no section first
	f.Add(false, append(section, le(uint32(blockPacket), uint32(blockMax+4))...))
	f.Fuzz(func(t *testing.T, withHead bool, data []byte) {
		in := data
		if withHead {
			in = append(head, data...)
		}
		var out bytes.Buffer
		var sum Summary
		err := CopyBlocks(&out, bytes.NewReader(in), &sum)
		if !bytes.HasPrefix(in, out.Bytes()) {
			t.Fatalf("output is not a prefix of the input")
		}
		if err == nil && out.Len() != len(in) {
			t.Fatalf("no error, %d of %d bytes passed", out.Len(), len(in))
		}
		if err != nil && !errors.Is(err, errBlock) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("error %v is neither a malformed block nor a short read", err)
		}
		if sum.Packets*blockMin > uint64(out.Len()) {
			t.Fatalf("%d packets counted in %d bytes passed", sum.Packets, out.Len())
		}
	})
}
