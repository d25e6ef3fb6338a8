package appproto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// Frames between two hosts' proxies: a RackOpen (a new leg, or a resume of
// one) and the DialReply that answers it. Both arrive from another host,
// over an NTB link or the TCP fallback.

// frameBytes is v as WriteFrame puts it on the wire.
func frameBytes(tb testing.TB, v any) []byte {
	tb.Helper()
	var buf bytes.Buffer
	if err := WriteFrame(&buf, v); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// rawFrame is body behind a length prefix that matches it.
func rawFrame(body string) []byte {
	return append(binary.LittleEndian.AppendUint32(nil, uint32(len(body))), body...)
}

// fuzzFrame reads one frame of type T from b, as a proxy reads a peer's:
// every error wraps ErrFrame or is a short read, never a panic; a frame it
// accepts encodes and decodes back to a value of the same encoding
// (omitempty makes an empty list and none one), and ReadFrame reads no
// more than its length prefix and MaxFrame allow.
func fuzzFrame[T any](t *testing.T, b []byte) {
	var v T
	r := bytes.NewReader(b)
	err := ReadFrame(r, &v)
	if used := len(b) - r.Len(); used > 4+MaxFrame {
		t.Fatalf("read %d bytes for one frame, cap %d", used, 4+MaxFrame)
	}
	if err != nil {
		if !errors.Is(err, ErrFrame) && !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Fatalf("error %v is neither a malformed frame nor a short read", err)
		}
		return
	}
	if n := binary.LittleEndian.Uint32(b); r.Len() != len(b)-4-int(n) {
		t.Fatalf("a frame of %d bytes left %d of %d unread", n, r.Len(), len(b))
	}
	var buf bytes.Buffer
	if err := WriteFrame(&buf, v); err != nil {
		// Escaping can make the encoding longer than what was read
		// (invalid UTF-8 becomes \ufffd, '<' becomes \u003c).
		return
	}
	enc := bytes.Clone(buf.Bytes())
	var again T
	if err := ReadFrame(&buf, &again); err != nil {
		t.Fatalf("re-read %+v: %v", v, err)
	}
	if err := WriteFrame(&buf, again); err != nil || !bytes.Equal(buf.Bytes(), enc) {
		t.Fatalf("round trip changed %q into %q (%v)", enc, buf.Bytes(), err)
	}
}

// FuzzRackOpen: the first frame of every connection between proxies,
// which names the port, the direct link, the leg's token, and for a resume
// the leg and how much of it the peer has received.
func FuzzRackOpen(f *testing.F) {
	for _, o := range []RackOpen{
		{From: "a", Port: 80, Token: 7, Window: 8 << 20},
		{From: "a", Port: 6379, Direct: "direct-a-12"},
		{From: "a", Resume: 7, RxSeq: 1 << 40},
		{From: "a", Resume: ^uint64(0), RxSeq: ^uint64(0), Window: -1},
		{},
	} {
		f.Add(frameBytes(f, o))
	}
	f.Add(rawFrame("{\"from\":\"a\"} x"))             // trailing data
	f.Add(rawFrame("{\"frm\":\"a\"}"))                // unknown field
	f.Add(rawFrame("{\"port\":1e99999999}"))          // no int
	f.Add(rawFrame("{\"resume\":-1,\"rx_seq\":1.5}")) // no uint64
	f.Add([]byte("\xff\xff\xff\x7f{"))                // over MaxFrame
	f.Add(rawFrame(`{"from":"\ud800"}`))              // lone surrogate
	f.Fuzz(func(t *testing.T, b []byte) { fuzzFrame[RackOpen](t, b) })
}

// FuzzDialReply: the answer to a RackOpen — the verdict, the answering
// leg's window, and for a resume how much it has received.
func FuzzDialReply(f *testing.F) {
	for _, r := range []DialReply{
		{Local: "b:80", Remote: "a:49152", Path: ctlapi.PathNTB, Window: 64 << 10},
		{RxSeq: 12345},
		{Code: ctlapi.CodeRefused, Error: "no connection a/7 to resume"},
		{Local: "b:80", Remote: "a:1", Path: ctlapi.PathNTB, Direct: &DirectLink{Name: "direct-a-1", Dir: "/dev/shm/ntstack", Window: 1 << 20}},
		{Local: "b:80", Remote: "a:1", Path: ctlapi.PathTCP, Reason: "fallback", Pool: &PoolGrant{Slot: 3}},
	} {
		f.Add(frameBytes(f, r))
	}
	f.Add(rawFrame("{\"code\":65536}"))         // over u16
	f.Add(rawFrame("{\"pool\":{\"slot\":-1}}")) // negative slot
	f.Add(rawFrame("{\"direct\":null}"))
	f.Add([]byte("\x00\x00\x00\x00"))
	f.Fuzz(func(t *testing.T, b []byte) { fuzzFrame[DialReply](t, b) })
}
