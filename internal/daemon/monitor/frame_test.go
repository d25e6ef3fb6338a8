package monitor

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"
)

func rawFrame(t FrameType, body string) []byte {
	b := binary.LittleEndian.AppendUint32(nil, uint32(1+len(body)))
	b = append(b, byte(t))
	return append(b, body...)
}

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	h := Hello{Magic: Magic, Version: ProtocolVersion, Host: "a", Caps: []string{"ntb", "tcp"},
		Links: []HelloLink{{Name: "rack-a-b", Peer: "b", Window: 1 << 20, Partitions: 2}}, Addresses: []string{"10.0.0.1"}}
	require.NoError(t, WriteFrame(&buf, FrameHello, h))
	require.NoError(t, WriteFrame(&buf, FrameHeartbeat, Heartbeat{Seq: 7}))
	wire := bytes.Clone(buf.Bytes())

	f, err := ReadFrame(&buf)
	require.NoError(t, err)
	got, err := DecodeHello(f)
	require.NoError(t, err)
	require.Equal(t, h, got)
	f, err = ReadFrame(&buf)
	require.NoError(t, err)
	var hb Heartbeat
	require.NoError(t, DecodeBody(f, &hb))
	require.Equal(t, uint64(7), hb.Seq)
	_, err = ReadFrame(&buf)
	require.ErrorIs(t, err, io.EOF)

	f, n, err := DecodeFrame(wire)
	require.NoError(t, err)
	require.Equal(t, FrameHello, f.Type)
	f, m, err := DecodeFrame(wire[n:])
	require.NoError(t, err)
	require.Equal(t, FrameHeartbeat, f.Type)
	require.Equal(t, len(wire), n+m)
}

func TestFrameMalformed(t *testing.T) {
	huge := binary.LittleEndian.AppendUint32(nil, MaxFrame+1)
	max32 := binary.LittleEndian.AppendUint32(nil, 0xffffffff)
	for _, tc := range []struct {
		name string
		in   []byte
		want string
	}{
		{"short header", []byte{1, 0}, "header"},
		{"zero length", []byte{0, 0, 0, 0}, "zero length"},
		{"oversized", append(huge, 1), "over the"},
		{"oversized 4 GiB", max32, "over the"},
		{"truncated body", rawFrame(FrameHello, `{"magic":"x"}`)[:8], "truncated"},
		{"unknown type", rawFrame(9, "{}"), "unknown type 9"},
		{"type zero", rawFrame(0, "{}"), "unknown type 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadFrame(bytes.NewReader(tc.in))
			require.ErrorIs(t, err, ErrFrame)
			require.Contains(t, err.Error(), tc.want)
			_, _, err = DecodeFrame(tc.in)
			require.ErrorIs(t, err, ErrFrame)
		})
	}
}

func TestFrameBodyMalformed(t *testing.T) {
	for _, tc := range []struct {
		name, body string
	}{
		{"empty", ""},
		{"not json", "garbage"},
		{"array", "[1,2]"},
		{"null", "null"},
		{"trailing data", `{"seq":1} {"seq":2}`},
		{"trailing garbage", `{"seq":1}x`},
		{"wrong field type", `{"seq":"one"}`},
		{"truncated", `{"seq":1`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var hb Heartbeat
			err := DecodeBody(Frame{Type: FrameHeartbeat, Body: []byte(tc.body)}, &hb)
			require.ErrorIs(t, err, ErrFrame)
		})
	}
	// A HELLO with silly contents.
	for _, body := range []string{
		`{"magic":"ntstack-ntmon","version":1,"host":"a","links":[{"name":"l","window":-1}]}`,
		`{"magic":"ntstack-ntmon","version":1,"host":"` + string(bytes.Repeat([]byte("x"), 300)) + `"}`,
	} {
		_, err := DecodeHello(Frame{Type: FrameHello, Body: []byte(body)})
		require.ErrorIs(t, err, ErrFrame)
	}
	// A newer peer's extra fields do not hide its version.
	h, err := DecodeHello(Frame{Type: FrameHello, Body: []byte(`{"magic":"ntstack-ntmon","version":2,"host":"b","future":{"x":1}}`)})
	require.NoError(t, err)
	require.Equal(t, 2, h.Version)
}

func TestAppendFrameCap(t *testing.T) {
	_, err := AppendFrame(nil, FrameError, ErrorBody{Message: string(bytes.Repeat([]byte("x"), MaxFrame))})
	require.Error(t, err)
	require.Contains(t, err.Error(), "cap")
}

// countingReader records how many bytes were read through it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += n
	return n, err
}

// FuzzDecodeFrame feeds arbitrary bytes, as a hostile peer would send them,
// through both decoders and every body decoder: errors are fine, panics and
// reads or allocations past the frame cap are not, and the two decoders
// must agree.
func FuzzDecodeFrame(f *testing.F) {
	f.Add(rawFrame(FrameHello, `{"magic":"ntstack-ntmon","version":1,"host":"a","caps":["ntb"],"links":[{"name":"l","peer":"b","window":4096,"partitions":1}]}`))
	f.Add(rawFrame(FrameHello, `{"magic":"ntstack-ntmon","version":99,"host":"b"}`))
	f.Add(rawFrame(FrameHeartbeat, `{"seq":1}`))
	f.Add(rawFrame(FrameError, `{"message":"no"}`))
	f.Add(rawFrame(FrameBye, `{"message":"bye"}`))
	f.Add(rawFrame(7, `{}`))
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1})
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte("GET / HTTP/1.1\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		cr := &countingReader{r: bytes.NewReader(data)}
		fr, rerr := ReadFrame(cr)
		if cr.n > frameHeader+MaxFrame {
			t.Fatalf("read %d bytes for one frame, cap %d", cr.n, frameHeader+MaxFrame)
		}
		fd, n, derr := DecodeFrame(data)
		if (rerr == nil) != (derr == nil) {
			t.Fatalf("ReadFrame err %v, DecodeFrame err %v", rerr, derr)
		}
		if derr != nil {
			if !errors.Is(derr, ErrFrame) {
				t.Fatalf("DecodeFrame error %v does not wrap ErrFrame", derr)
			}
			return
		}
		if n > len(data) || n > frameHeader+MaxFrame || len(fd.Body) >= MaxFrame {
			t.Fatalf("frame of %d bytes (body %d) from %d", n, len(fd.Body), len(data))
		}
		if fr.Type != fd.Type || !bytes.Equal(fr.Body, fd.Body) {
			t.Fatalf("decoders disagree: %v %q vs %v %q", fr.Type, fr.Body, fd.Type, fd.Body)
		}
		if h, err := DecodeHello(fd); err == nil {
			if len(h.Caps) > maxHelloItems || len(h.Host) > maxNameLen {
				t.Fatalf("hello over limits accepted: %+v", h)
			}
		}
		var hb Heartbeat
		_ = DecodeBody(fd, &hb)
		var eb ErrorBody
		_ = DecodeBody(fd, &eb)
	})
}

// TestReadFrameHugeLength checks that a length over the cap is refused
// before anything of that size is allocated.
func TestReadFrameHugeLength(t *testing.T) {
	in := binary.LittleEndian.AppendUint32(nil, 0xfffffff0)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range 100 {
		_, err := ReadFrame(bytes.NewReader(in))
		require.ErrorIs(t, err, ErrFrame)
	}
	runtime.ReadMemStats(&after)
	perCall := (after.TotalAlloc - before.TotalAlloc) / 100
	require.Less(t, perCall, uint64(4096), "ReadFrame allocated %d bytes per refused frame", perCall)
}
