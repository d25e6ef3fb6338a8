package capture

import (
	"bytes"
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

// FuzzCopyBlocks feeds the stream copier any bytes: it must not panic, and
// what it passes on is whole blocks of the input, in order.
func FuzzCopyBlocks(f *testing.F) {
	var buf bytes.Buffer
	w, err := NewWriter(&buf, "ntb0", DefaultSnap, "conn 3")
	if err != nil {
		f.Fatal(err)
	}
	for _, r := range sample(time.Unix(0, 0)) {
		if err := w.Write(&r, 1); err != nil {
			f.Fatal(err)
		}
	}
	if err := w.Close(2); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add(buf.Bytes()[:100])
	f.Fuzz(func(t *testing.T, data []byte) {
		var out bytes.Buffer
		var sum Summary
		err := CopyBlocks(&out, bytes.NewReader(data), &sum)
		if !bytes.HasPrefix(data, out.Bytes()) {
			t.Fatalf("output is not a prefix of the input")
		}
		if err == nil && out.Len() != len(data) {
			t.Fatalf("no error, %d of %d bytes passed", out.Len(), len(data))
		}
	})
}
