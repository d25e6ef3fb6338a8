package capture

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/ntstack/ntstack/internal/transport"
	"github.com/stretchr/testify/require"
)

// le builds little-endian payloads.
func le(vs ...any) []byte {
	var b []byte
	for _, v := range vs {
		b, _ = binary.Append(b, binary.LittleEndian, v)
	}
	return b
}

func legFrame(typ byte, seq uint64, payload string) []byte {
	return append(le(typ, seq, uint32(len(payload))), payload...)
}

// sample is one record of every kind, as a KV exchange over a proxy link
// would produce them.
func sample(t0 time.Time) []Record {
	rec := func(i int, dir transport.TapDir, ring int, kind transport.FrameKind, conn, local uint32, p []byte) Record {
		return Record{Time: t0.Add(time.Duration(i) * time.Microsecond), Dir: dir, Ring: ring, Kind: kind,
			Leg: true, Conn: conn, Local: local, Link: "ntb0", Length: len(p), Payload: p}
	}
	set := legFrame(1, 0, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n")
	return []Record{
		rec(0, transport.TapTX, 0, transport.FrameOpen, 3, 3, le(uint16(6379), uint16(0), uint32(1<<20), uint32(7))),
		rec(1, transport.TapRX, 0, transport.FrameAccept, 3, 3, le(uint32(9), uint32(1<<20), uint32(2), uint32(7))),
		rec(2, transport.TapTX, 0, transport.FrameData, 9, 3, set),
		rec(3, transport.TapRX, 0, transport.FrameData, 3, 3, legFrame(1, 0, "+OK\r\n")),
		rec(4, transport.TapRX, transport.TapControl, transport.FrameCredit, 3, 3, le(uint64(len(set)), uint32(2), uint32(64<<10))),
		rec(5, transport.TapTX, 1, transport.FrameMove, 9, 3, le(uint32(1))),
		rec(6, transport.TapRX, 0, transport.FrameRefuse, 4, 4, le(uint32(1))),
		rec(7, transport.TapTX, 1, transport.FrameFin, 9, 3, nil),
		rec(8, transport.TapTX, 1, transport.FrameClose, 9, 3, nil),
		rec(9, transport.TapRX, 0, transport.FrameClose, 3, 3, nil),
		rec(10, transport.TapTX, transport.TapControl, transport.FrameWant, 9, 3, le(uint64(len(set)), uint32(2), uint32(64<<10))),
	}
}

func writeFile(t *testing.T, recs []Record, snap int) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := NewWriter(&buf, "ntb0", snap, "")
	require.NoError(t, err)
	for i := range recs {
		r := recs[i]
		if len(r.Payload) > snap {
			r.Payload = r.Payload[:snap]
		}
		require.NoError(t, w.Write(&r, uint64(i%2)))
	}
	require.NoError(t, w.Close(5))
	return buf.Bytes()
}

// TestWriteRead writes records with Writer and reads them back with
// pcapgo and the gopacket layers: every field survives.
func TestWriteRead(t *testing.T) {
	t0 := time.Unix(1700000000, 123456789)
	recs := sample(t0)
	file := writeFile(t, recs, DefaultSnap)

	r, err := pcapgo.NewNgReader(bytes.NewReader(file), pcapgo.DefaultNgReaderOptions)
	require.NoError(t, err)
	require.Equal(t, LinkType, r.LinkType())
	require.Equal(t, SectionComment, r.SectionInfo().Comment)
	intf, err := r.Interface(0)
	require.NoError(t, err)
	require.Equal(t, "ntb0", intf.Name)
	src := gopacket.NewPacketSource(r, r.LinkType())
	for i, want := range recs {
		pkt, err := src.NextPacket()
		require.NoError(t, err, "packet %d", i)
		require.Nil(t, pkt.ErrorLayer(), "packet %d", i)
		require.True(t, pkt.Metadata().Timestamp.Equal(want.Time), "packet %d time", i)
		require.Equal(t, HeaderLen+want.Length, pkt.Metadata().Length)
		n, ok := pkt.Layer(LayerTypeNTStack).(*NTStack)
		require.True(t, ok, "packet %d: no NTStack layer in %v", i, pkt)
		require.Equal(t, want.Dir, n.Dir)
		require.Equal(t, want.Kind, n.Kind)
		require.Equal(t, want.Conn, n.Conn)
		require.Equal(t, want.Local, n.Local)
		require.Equal(t, uint32(want.Length), n.Length)
		require.Equal(t, LinkID("ntb0"), n.Link)
		require.False(t, n.Truncated || n.Malformed, "packet %d", i)
		if want.Ring == transport.TapControl {
			require.Equal(t, uint8(RingControl), n.Ring)
		} else {
			require.Equal(t, uint8(want.Ring), n.Ring)
		}
		switch want.Kind {
		case transport.FrameOpen:
			require.Equal(t, uint16(6379), n.Port)
			require.Equal(t, uint32(1<<20), n.Window)
			require.Equal(t, uint32(7), n.Gen)
		case transport.FrameAccept:
			require.Equal(t, uint32(9), n.AcceptID)
			require.Equal(t, uint32(2), n.Gen)
			require.True(t, n.HasDialGen)
			require.Equal(t, uint32(7), n.DialGen)
		case transport.FrameCredit:
			require.Equal(t, uint64(len(recs[2].Payload)), n.Consumed)
			require.Equal(t, uint32(2), n.Gen)
			require.Equal(t, uint32(64<<10), n.Floor)
		case transport.FrameWant:
			require.Equal(t, uint64(len(recs[2].Payload)), n.Consumed)
			require.Equal(t, uint32(2), n.Gen)
			require.Equal(t, uint32(64<<10), n.InFlight)
		case transport.FrameMove:
			require.Equal(t, uint32(1), n.Partition)
		case transport.FrameRefuse:
			require.Equal(t, uint32(1), n.Code)
		case transport.FrameData:
			require.Equal(t, want.Payload, n.Payload)
			leg, ok := pkt.Layer(LayerTypeNTStackLeg).(*NTStackLeg)
			require.True(t, ok, "packet %d: no leg layer", i)
			require.Equal(t, uint8(LegData), leg.Type)
			require.Equal(t, want.Payload[LegHeaderLen:], leg.Payload)
			require.Equal(t, want.Payload[LegHeaderLen:], pkt.ApplicationLayer().Payload())
		}
	}
	_, err = src.NextPacket()
	require.ErrorIs(t, err, io.EOF)
	intf, err = r.Interface(0)
	require.NoError(t, err)
	require.Equal(t, uint64(5), intf.Statistics.PacketsDropped)
	require.Equal(t, uint64(len(recs)+5), intf.Statistics.PacketsReceived)

	// CopyBlocks passes the stream through whole and reads its totals.
	var out bytes.Buffer
	var sum Summary
	require.NoError(t, CopyBlocks(&out, bytes.NewReader(file), &sum))
	require.Equal(t, file, out.Bytes())
	require.Equal(t, Summary{Packets: uint64(len(recs)), Complete: true, Received: uint64(len(recs) + 5), Dropped: 5}, sum)
	// A stream cut mid-block leaves only whole blocks behind.
	out.Reset()
	sum = Summary{}
	require.Error(t, CopyBlocks(&out, bytes.NewReader(file[:len(file)-10]), &sum))
	require.Less(t, out.Len(), len(file))
	_, err = pcapgo.NewNgReader(bytes.NewReader(out.Bytes()), pcapgo.DefaultNgReaderOptions)
	require.NoError(t, err)
}

// TestSnapped: a payload cut by the snap length decodes as truncated, its
// fields intact.
func TestSnapped(t *testing.T) {
	recs := sample(time.Now())[2:3] // the SET
	file := writeFile(t, recs, MinSnap)
	r, err := pcapgo.NewNgReader(bytes.NewReader(file), pcapgo.DefaultNgReaderOptions)
	require.NoError(t, err)
	data, _, err := r.ReadPacketData()
	require.NoError(t, err)
	pkt := gopacket.NewPacket(data, LinkType, gopacket.Default)
	n := pkt.Layer(LayerTypeNTStack).(*NTStack)
	require.True(t, n.Truncated)
	require.True(t, pkt.Metadata().Truncated)
	require.Equal(t, recs[0].Payload[:MinSnap], n.Payload)
	leg := pkt.Layer(LayerTypeNTStackLeg).(*NTStackLeg)
	require.Equal(t, uint32(len(recs[0].Payload)-LegHeaderLen), leg.Len)
}

// TestNotLeg: DATA that is not exactly one leg frame (the proxies' JSON
// handshake, a leg frame cut by credit) stays plain payload.
func TestNotLeg(t *testing.T) {
	for _, p := range [][]byte{
		append(le(uint32(12)), `{"port":80}`...),
		legFrame(1, 0, "abcdef")[:10+LegHeaderLen/2],
		legFrame(2, 5, "x"), // an ack with a length
	} {
		b, err := AppendPacket(nil, &Record{Kind: transport.FrameData, Leg: true, Length: len(p), Payload: p})
		require.NoError(t, err)
		pkt := gopacket.NewPacket(b, LinkType, gopacket.Default)
		require.Nil(t, pkt.Layer(LayerTypeNTStackLeg), "%q", p)
		require.Equal(t, p, pkt.ApplicationLayer().Payload())
	}
}

// TestLegHeaderApart: a data frame's header written apart from its payload
// (a leg frame of more than 8 KiB) decodes as a leg header, whole.
func TestLegHeaderApart(t *testing.T) {
	p := le(byte(LegData), uint64(1<<20), uint32(64<<10))
	b, err := AppendPacket(nil, &Record{Kind: transport.FrameData, Leg: true, Length: len(p), Payload: p})
	require.NoError(t, err)
	pkt := gopacket.NewPacket(b, LinkType, gopacket.Default)
	require.Nil(t, pkt.ErrorLayer())
	require.False(t, pkt.Metadata().Truncated)
	leg, ok := pkt.Layer(LayerTypeNTStackLeg).(*NTStackLeg)
	require.True(t, ok, "no leg layer")
	require.Equal(t, uint8(LegData), leg.Type)
	require.Equal(t, uint64(1<<20), leg.Seq)
	require.Equal(t, uint32(64<<10), leg.Len)
	require.Empty(t, leg.Payload)
}

// tsharkFields runs tshark with the dissector on file and returns its
// field lines. tshark comes with `make rackdeps`; CI has it.
func tsharkFields(t *testing.T, file string, fields ...string) []string {
	t.Helper()
	tshark, err := exec.LookPath("tshark")
	if err != nil {
		t.Skip("tshark not installed (make rackdeps installs it)")
	}
	lua := filepath.Join(t.TempDir(), "ntstack.lua")
	require.NoError(t, WriteDissector(lua))
	args := []string{"-n", "-r", file, "-X", "lua_script:" + lua, "-T", "fields", "-E", "separator=|"}
	for _, f := range fields {
		args = append(args, "-e", f)
	}
	cmd := exec.Command(tshark, args...)
	// tshark keeps a profile under $HOME; give it a scratch one.
	cmd.Env = append(os.Environ(), "HOME="+t.TempDir())
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "tshark %s: %s", strings.Join(args, " "), stderr.String())
	// tshark as root warns on stderr; a Lua error would show there too.
	require.NotContains(t, stderr.String(), "Lua: Error", "tshark: %s", stderr.String())
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// TestTshark: tshark, with ntstack.lua, reads what Writer writes and shows
// the same fields as the gopacket layer.
func TestTshark(t *testing.T) {
	recs := sample(time.Now())
	file := filepath.Join(t.TempDir(), "sample.pcapng")
	require.NoError(t, os.WriteFile(file, writeFile(t, recs, DefaultSnap), 0o644))
	lines := tsharkFields(t, file, "ntstack.dirname", "ntstack.kindname", "ntstack.conn", "ntstack.local", "ntstack.ring",
		"ntstack.open.port", "ntstack.accept.id", "ntstack.credit.consumed", "ntstack.credit.floor", "ntstack.move.partition",
		"ntstack.refuse.code", "ntstack.leg.type", "ntstack.text", "ntstack.want.inflight")
	want := []string{
		"tx|OPEN|3|3|0|6379||||||||",
		"rx|ACCEPT|3|3|0||9|||||||",
		"tx|DATA|9|3|0|||||||1|*3..$3..SET..$1..k..$1..v..|",
		"rx|DATA|3|3|0|||||||1|+OK..|",
		fmt.Sprintf("rx|CREDIT|3|3|255|||%d|%d|||||", len(recs[2].Payload), 64<<10),
		"tx|MOVE|9|3|1|||||1||||",
		"rx|REFUSE|4|4|0||||||1|||",
		"tx|FIN|9|3|1|||||||||",
		"tx|CLOSE|9|3|1|||||||||",
		"rx|CLOSE|3|3|0|||||||||",
		fmt.Sprintf("tx|WANT|9|3|255|||%d||||||%d", len(recs[2].Payload), 64<<10),
	}
	require.Equal(t, want, lines)
}

// TestDissectorLegBound: the Lua dissector bounds a leg frame's payload
// where the gopacket layer does (LegMaxPayload).
func TestDissectorLegBound(t *testing.T) {
	require.Contains(t, string(Dissector), fmt.Sprintf("\nlocal LEG_MAX = %d ", LegMaxPayload))
}
