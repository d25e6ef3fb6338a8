package capture

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/ntstack/ntstack/internal/transport"
)

// Layer types, registered with gopacket (application numbers are
// 1000..1999). Registering also makes gopacket decode LinkType as
// LayerTypeNTStack (layers.LinkTypeMetadata), unless another package
// claimed USER0 first; a capture read with pcapgo then decodes with
// gopacket.NewPacketSource(reader, reader.LinkType()).
var (
	LayerTypeNTStack = gopacket.RegisterLayerType(1470, gopacket.LayerTypeMetadata{
		Name: "NTStack", Decoder: gopacket.DecodeFunc(decodeNTStack)})
	LayerTypeNTStackLeg = gopacket.RegisterLayerType(1471, gopacket.LayerTypeMetadata{
		Name: "NTStackLeg", Decoder: gopacket.DecodeFunc(decodeNTStackLeg)})
)

func init() {
	if layers.LinkTypeMetadata[LinkType].DecodeWith == nil {
		layers.LinkTypeMetadata[LinkType] = layers.EnumMetadata{
			DecodeWith: LayerTypeNTStack, Name: "NTStack", LayerType: LayerTypeNTStack}
	}
}

// errShort is wrapped by decode errors of packets too short for a header.
var errShort = errors.New("too short")

// NTStack is the pseudo-header of a captured frame and the fields of its
// kind (see the table in format.go). Fields of other kinds are zero. The
// layer's payload is a DATA frame's payload; other kinds have none.
type NTStack struct {
	layers.BaseLayer
	Version   uint8
	HeaderLen uint8
	Dir       transport.TapDir
	Ring      uint8 // RingControl: the control ring
	Kind      transport.FrameKind
	Flags     uint8
	Conn      uint32
	Local     uint32
	Length    uint32 // the payload's length in the ring
	Link      uint32 // LinkID of the link's name

	// Truncated: the capture kept fewer than Length payload bytes.
	// Malformed: Length does not fit Kind (a peer wrote a bad frame), or
	// Kind is unknown; the fields present are decoded all the same.
	Truncated, Malformed bool

	Port       uint16 // OPEN
	Window     uint32 // OPEN, ACCEPT
	Gen        uint32 // OPEN, ACCEPT, CREDIT, WANT
	AcceptID   uint32 // ACCEPT: the acceptor's id
	DialGen    uint32 // ACCEPT: the OPEN's gen echoed, if HasDialGen
	HasDialGen bool
	Code       uint32 // REFUSE
	Consumed   uint64 // CREDIT; WANT: as in the writer's last CREDIT
	Floor      uint32 // CREDIT: credit the writer can count on once all is read; bit 31: credit in turns
	InFlight   uint32 // WANT: bytes the writer sent beyond Consumed
	Partition  uint32 // MOVE
}

var _ gopacket.DecodingLayer = (*NTStack)(nil)

func (n *NTStack) LayerType() gopacket.LayerType  { return LayerTypeNTStack }
func (n *NTStack) CanDecode() gopacket.LayerClass { return LayerTypeNTStack }

// NextLayerType is LayerTypeNTStackLeg for a DATA frame of a FlagLeg link
// that holds exactly one leg frame, gopacket.LayerTypePayload for other
// DATA, and none for the other kinds.
func (n *NTStack) NextLayerType() gopacket.LayerType {
	switch {
	case n.Kind != transport.FrameData || len(n.Payload) == 0:
		return gopacket.LayerTypeZero
	case n.Flags&FlagLeg != 0 && isLegFrame(n.Payload, n.Length):
		return LayerTypeNTStackLeg
	}
	return gopacket.LayerTypePayload
}

// bodyLen is the payload length of each control kind (ACCEPT: 12 or 16,
// OPEN: 12 or 20), -1 for DATA's any length.
func bodyLen(k transport.FrameKind) (int, bool) {
	switch k {
	case transport.FrameOpen, transport.FrameAccept:
		return 12, true
	case transport.FrameResume:
		return 32, true
	case transport.FrameReset:
		return 8, true
	case transport.FrameCredit, transport.FrameWant:
		return 16, true
	case transport.FrameRefuse, transport.FrameMove:
		return 4, true
	case transport.FrameFin, transport.FrameClose:
		return 0, true
	case transport.FrameData:
		return -1, true
	}
	return 0, false
}

// DecodeFromBytes decodes a packet: the pseudo-header, then the kind's
// fields. data is peer-influenced: every length is checked.
func (n *NTStack) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	*n = NTStack{}
	if len(data) < HeaderLen {
		df.SetTruncated()
		return fmt.Errorf("decode ntstack header: %d bytes, want %d: %w", len(data), HeaderLen, errShort)
	}
	n.Version, n.HeaderLen = data[offVersion], data[offHdrLen]
	if n.Version != Version {
		return fmt.Errorf("decode ntstack header: version %d, want %d", n.Version, Version)
	}
	hl := int(n.HeaderLen)
	if hl < HeaderLen || hl > len(data) {
		return fmt.Errorf("decode ntstack header: header length %d outside [%d, %d]", hl, HeaderLen, len(data))
	}
	n.Dir = transport.TapDir(data[offDir])
	n.Ring = data[offRing]
	n.Kind = transport.FrameKind(data[offKind])
	n.Flags = data[offFlags]
	n.Conn = binary.LittleEndian.Uint32(data[offConn:])
	n.Local = binary.LittleEndian.Uint32(data[offLocal:])
	n.Length = binary.LittleEndian.Uint32(data[offLength:])
	n.Link = binary.LittleEndian.Uint32(data[offLink:])
	body := data[hl:]
	if uint64(len(body)) > uint64(n.Length) {
		return fmt.Errorf("decode ntstack header: %d payload bytes, frame length %d", len(body), n.Length)
	}
	if uint64(len(body)) < uint64(n.Length) {
		n.Truncated = true
		df.SetTruncated()
	}
	want, known := bodyLen(n.Kind)
	switch {
	case !known:
		n.Malformed = true
	case want >= 0 && int64(n.Length) != int64(want) && !(n.Kind == transport.FrameAccept && n.Length == 16) &&
		!(n.Kind == transport.FrameOpen && n.Length == 20):
		n.Malformed = true
	}
	le := binary.LittleEndian
	has := func(end int) bool { return len(body) >= end }
	switch n.Kind {
	case transport.FrameOpen:
		if has(2) {
			n.Port = le.Uint16(body)
		}
		if has(8) {
			n.Window = le.Uint32(body[4:])
		}
		if has(12) {
			n.Gen = le.Uint32(body[8:])
		}
	case transport.FrameAccept:
		if has(4) {
			n.AcceptID = le.Uint32(body)
		}
		if has(8) {
			n.Window = le.Uint32(body[4:])
		}
		if has(12) {
			n.Gen = le.Uint32(body[8:])
		}
		if has(16) && n.Length == 16 {
			n.DialGen, n.HasDialGen = le.Uint32(body[12:]), true
		}
	case transport.FrameRefuse:
		if has(4) {
			n.Code = le.Uint32(body)
		}
	case transport.FrameCredit, transport.FrameWant: // the same layout
		if has(8) {
			n.Consumed = le.Uint64(body)
		}
		if has(12) {
			n.Gen = le.Uint32(body[8:])
		}
		if has(16) && n.Kind == transport.FrameCredit {
			n.Floor = le.Uint32(body[12:])
		} else if has(16) {
			n.InFlight = le.Uint32(body[12:])
		}
	case transport.FrameMove:
		if has(4) {
			n.Partition = le.Uint32(body)
		}
	}
	if n.Kind == transport.FrameData {
		n.Contents, n.Payload = data[:hl], body
	} else {
		n.Contents, n.Payload = data, nil
	}
	return nil
}

func decodeNTStack(data []byte, p gopacket.PacketBuilder) error {
	n := &NTStack{}
	if err := n.DecodeFromBytes(data, p); err != nil {
		return err
	}
	p.AddLayer(n)
	if next := n.NextLayerType(); next != gopacket.LayerTypeZero {
		return p.NextDecoder(next)
	}
	return nil
}

// NTStackLeg is the header of an ntproxy leg frame carried by a DATA frame
// (see the table in format.go); its payload is the leg frame's payload,
// the application's bytes.
type NTStackLeg struct {
	layers.BaseLayer
	Type uint8
	Seq  uint64
	Len  uint32
}

var _ gopacket.DecodingLayer = (*NTStackLeg)(nil)

func (l *NTStackLeg) LayerType() gopacket.LayerType  { return LayerTypeNTStackLeg }
func (l *NTStackLeg) CanDecode() gopacket.LayerClass { return LayerTypeNTStackLeg }

func (l *NTStackLeg) NextLayerType() gopacket.LayerType {
	if len(l.Payload) == 0 {
		return gopacket.LayerTypeZero
	}
	return gopacket.LayerTypePayload
}

// DecodeFromBytes decodes a leg header; the payload is what follows, up to
// Len bytes (fewer in a snapped capture; none for a data frame's header
// written apart from its payload).
func (l *NTStackLeg) DecodeFromBytes(data []byte, df gopacket.DecodeFeedback) error {
	*l = NTStackLeg{}
	if len(data) < LegHeaderLen {
		df.SetTruncated()
		return fmt.Errorf("decode leg header: %d bytes, want %d: %w", len(data), LegHeaderLen, errShort)
	}
	l.Type = data[legOffType]
	l.Seq = binary.LittleEndian.Uint64(data[legOffSeq:])
	l.Len = binary.LittleEndian.Uint32(data[legOffLen:])
	rest := data[LegHeaderLen:]
	if uint64(len(rest)) > uint64(l.Len) {
		rest = rest[:l.Len]
	} else if uint64(len(rest)) < uint64(l.Len) && len(rest) > 0 {
		df.SetTruncated()
	}
	l.Contents, l.Payload = data[:LegHeaderLen], rest
	return nil
}

func decodeNTStackLeg(data []byte, p gopacket.PacketBuilder) error {
	l := &NTStackLeg{}
	if err := l.DecodeFromBytes(data, p); err != nil {
		return err
	}
	p.AddLayer(l)
	if next := l.NextLayerType(); next != gopacket.LayerTypeZero {
		return p.NextDecoder(next)
	}
	return nil
}
