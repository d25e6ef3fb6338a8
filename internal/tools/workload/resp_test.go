package workload

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// encodeCommand encodes args as a RESP2 array of bulk strings.
func encodeCommand(args [][]byte) []byte {
	var b bytes.Buffer
	b.WriteString("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		b.WriteString("$" + strconv.Itoa(len(a)) + "\r\n")
		b.Write(a)
		b.WriteString("\r\n")
	}
	return b.Bytes()
}

func newReader(s string) *bufio.Reader {
	return bufio.NewReaderSize(strings.NewReader(s), readBufSize)
}

func TestReadCommand(t *testing.T) {
	r := newReader("*2\r\n$3\r\nGET\r\n$0\r\n\r\n" + "*0\r\n" + "*-1\r\n" + "\r\n" + " SET  a\tb \r\n" + "PING\n")
	var got [][]string
	for {
		args, err := readCommand(r)
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		var s []string
		for _, a := range args {
			s = append(s, string(a))
		}
		got = append(got, s)
	}
	require.Equal(t, [][]string{{"GET", ""}, nil, nil, nil, {"SET", "a", "b"}, {"PING"}}, got)

	for in, want := range map[string]error{
		"*2\r\n$3\r\nGET\r\n":   io.ErrUnexpectedEOF,
		"*1\r\n$3\r\nGE":        io.ErrUnexpectedEOF,
		"*1\r\n$3\r\nGET\r":     io.ErrUnexpectedEOF,
		"*1":                    io.ErrUnexpectedEOF,
		"*1\r\n$1000000\r\nabc": io.ErrUnexpectedEOF, // declared, never sent: no 1 MB allocation either
	} {
		_, err := readCommand(newReader(in))
		require.ErrorIs(t, err, want, "%q", in)
	}
}

func TestReadCommandLimits(t *testing.T) {
	// A declared 64 MiB argument that never arrives allocates at most
	// bulkChunk, not 64 MiB.
	allocs := testing.AllocsPerRun(1, func() {
		_, err := readCommand(newReader("*1\r\n$" + strconv.Itoa(MaxBulkLen) + "\r\nabc"))
		require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	})
	require.Less(t, allocs, 10.0)

	// Two maximal arguments are fine; a third exceeds MaxCommandBytes.
	hdr := "$" + strconv.Itoa(MaxBulkLen) + "\r\n"
	in := io.MultiReader(
		strings.NewReader("*3\r\n"+hdr), io.LimitReader(zeros{}, MaxBulkLen), strings.NewReader("\r\n"+hdr),
		io.LimitReader(zeros{}, MaxBulkLen), strings.NewReader("\r\n$1\r\n"))
	_, err := readCommand(bufio.NewReaderSize(in, readBufSize))
	var pe *ProtocolError
	require.ErrorAs(t, err, &pe)
	require.Contains(t, pe.Msg, "command larger than")
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func TestParseLen(t *testing.T) {
	for in, want := range map[string]int{"0": 0, "7": 7, "-1": -1, "1048576": 1 << 20, "9999999999": 9999999999} {
		n, ok := parseLen([]byte(in))
		require.True(t, ok, in)
		require.Equal(t, want, n, in)
	}
	for _, in := range []string{"", "-", "+1", " 1", "1 ", "01", "1a", "99999999999", "0x10"} {
		_, ok := parseLen([]byte(in))
		require.False(t, ok, "%q", in)
	}
	for _, in := range []string{"", "-", "+1", "01", "-0", " 1", "9223372036854775808", "1.5"} {
		_, ok := parseInt64([]byte(in))
		require.False(t, ok, "%q", in)
	}
	n, ok := parseInt64([]byte("-9223372036854775808"))
	require.True(t, ok)
	require.Equal(t, int64(-9223372036854775808), n)
}

// FuzzRESP feeds arbitrary bytes to the request parser: it must never
// panic, every error must be a protocol error or an end of input, and
// every command it does return must survive re-encoding unchanged.
func FuzzRESP(f *testing.F) {
	for _, s := range []string{
		"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n",
		"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nvalue\r\n*1\r\n$4\r\nPING\r\n",
		"PING\r\nGET a\n",
		"*0\r\n*-1\r\n\r\n",
		"*1\r\n$-1\r\n",
		"*1\r\n$99999999999\r\n",
		"*2\r\n$3\r\nGET\r\n",
		"*1\r\n$1\r\nab\r\n",
		"$3\r\nabc\r\n",
		"*1\r\n$2\r\n\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r := bufio.NewReaderSize(bytes.NewReader(in), 64) // small: exercise the line limit
		for {
			args, err := readCommand(r)
			if err != nil {
				var pe *ProtocolError
				if !errors.As(err, &pe) && err != io.EOF && err != io.ErrUnexpectedEOF {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if len(args) == 0 {
				continue
			}
			again, err := readCommand(bufio.NewReader(bytes.NewReader(encodeCommand(args))))
			if err != nil {
				t.Fatalf("re-encoded %q: %v", args, err)
			}
			if len(again) != len(args) {
				t.Fatalf("re-encoded %q: got %q", args, again)
			}
			for i := range args {
				if !bytes.Equal(args[i], again[i]) {
					t.Fatalf("re-encoded %q: got %q", args, again)
				}
			}
		}
	})
}
