package workload

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"slices"
	"strconv"
)

// RESP2 request limits. Redis allows 512 MiB bulk strings and a 1 GiB
// query buffer; a test workload needs far less, and a smaller bound keeps
// what one hostile peer can make the server allocate small.
const (
	// MaxBulkLen is the largest bulk string (one argument) accepted.
	MaxBulkLen = 64 << 20
	// MaxArrayLen is the largest number of arguments in one command.
	MaxArrayLen = 1 << 20
	// MaxCommandBytes bounds the bulk bytes of one command, all arguments
	// together: two maximal arguments (SET key <64 MiB value>).
	MaxCommandBytes = 2 * MaxBulkLen
	// readBufSize is each connection's read buffer. A header line
	// ("*3", "$5") or an inline command must fit in it: it is the line
	// length limit.
	readBufSize = 32 << 10
	// writeBufSize is each connection's write buffer: replies are
	// gathered here and flushed when no pipelined request is waiting.
	writeBufSize = 16 << 10
	// bulkChunk is how much of a bulk string is allocated ahead of the
	// bytes arriving, so a declared length the peer never sends costs at
	// most this much (the buffer then doubles as bytes do arrive).
	bulkChunk = 1 << 20
	// initialArgs caps the argument slice allocated on a declared array
	// length, for the same reason.
	initialArgs = 1024
)

// ProtocolError is a malformed request. The server answers it with
// "-ERR Protocol error: <Msg>" and closes the connection, as Redis does.
type ProtocolError struct{ Msg string }

func (e *ProtocolError) Error() string { return "resp protocol error: " + e.Msg }

func protoErr(msg string) error { return &ProtocolError{Msg: msg} }

// readCommand reads one request from r: a RESP2 array of bulk strings
// ("*2\r\n$3\r\nGET\r\n$1\r\nk\r\n") or an inline command ("GET k\r\n",
// arguments split on spaces and tabs, no quoting). An empty array or line
// returns no arguments and no error: the caller skips it.
//
// Each returned argument is its own allocation, owned by the caller for
// good: nothing is reused. Errors are *ProtocolError for malformed input,
// io.EOF at a clean end between commands, io.ErrUnexpectedEOF inside one,
// or the reader's own error.
func readCommand(r *bufio.Reader) ([][]byte, error) {
	line, err := readLine(r, true)
	if err != nil {
		return nil, err
	}
	if len(line) == 0 {
		return nil, nil
	}
	if line[0] != '*' {
		fields := bytes.FieldsFunc(line, func(r rune) bool { return r == ' ' || r == '\t' })
		args := make([][]byte, len(fields))
		for i, f := range fields {
			args[i] = bytes.Clone(f) // line is r's buffer: valid until the next read
		}
		return args, nil
	}
	n, ok := parseLen(line[1:])
	if !ok || n > MaxArrayLen {
		return nil, protoErr("invalid multibulk length")
	}
	if n <= 0 { // "*0" and "*-1": Redis ignores both
		return nil, nil
	}
	args := make([][]byte, 0, min(n, initialArgs))
	total := 0
	for range n {
		line, err := readLine(r, false)
		if err != nil {
			return nil, noEOF(err)
		}
		if len(line) == 0 || line[0] != '$' {
			return nil, protoErr("expected '$', got " + strconv.Quote(string(line[:min(len(line), 1)])))
		}
		l, ok := parseLen(line[1:])
		if !ok || l < 0 || l > MaxBulkLen {
			return nil, protoErr("invalid bulk length")
		}
		if total += l; total > MaxCommandBytes {
			return nil, protoErr("command larger than " + strconv.Itoa(MaxCommandBytes) + " bytes")
		}
		b, err := readBulk(r, l)
		if err != nil {
			return nil, err
		}
		args = append(args, b)
	}
	return args, nil
}

// readLine returns the next line without its terminator; the slice is r's
// buffer, valid until the next read. A line must end in "\r\n"; an inline
// command may also end in a bare "\n", as Redis allows for telnet users.
func readLine(r *bufio.Reader, inline bool) ([]byte, error) {
	line, err := r.ReadSlice('\n')
	switch {
	case errors.Is(err, bufio.ErrBufferFull):
		return nil, protoErr("line longer than " + strconv.Itoa(r.Size()) + " bytes")
	case err != nil:
		if len(line) > 0 {
			return nil, noEOF(err)
		}
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		return line[:n-1], nil
	}
	if inline {
		return line, nil
	}
	return nil, protoErr("line not terminated by CRLF")
}

// readBulk reads an l-byte bulk string and its "\r\n". It allocates at
// most bulkChunk ahead of the bytes that have arrived.
func readBulk(r *bufio.Reader, l int) ([]byte, error) {
	need := l + 2
	b := make([]byte, 0, min(need, bulkChunk))
	for len(b) < need {
		if len(b) == cap(b) {
			b = slices.Grow(b, min(need-len(b), max(len(b), bulkChunk)))
		}
		k := min(need, cap(b))
		if _, err := io.ReadFull(r, b[len(b):k]); err != nil {
			return nil, noEOF(err)
		}
		b = b[:k]
	}
	if b[l] != '\r' || b[l+1] != '\n' {
		return nil, protoErr("bulk string not terminated by CRLF")
	}
	return b[:l:l], nil
}

// noEOF turns io.EOF, which means a clean end between commands, into
// io.ErrUnexpectedEOF for an end inside one.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// parseLen parses a length field strictly: an optional '-' and 1 to 10
// decimal digits, nothing else (no '+', no spaces, no leading zeros beyond
// a lone "0"). Longer numbers exceed every limit anyway.
func parseLen(b []byte) (int, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 10 || (b[0] == '0' && len(b) > 1) {
		return 0, false
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// parseInt64 parses a decimal int64 as Redis's string2ll does: an optional
// '-', digits, no leading zeros, no spaces, no overflow.
func parseInt64(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	if len(b) > 1 && (b[0] == '0' || (b[0] == '-' && b[1] == '0')) {
		return 0, false
	}
	if b[0] == '+' {
		return 0, false
	}
	n, err := strconv.ParseInt(string(b), 10, 64)
	return n, err == nil
}

// respWriter writes RESP2 replies into a buffered writer; write errors
// stick in the bufio.Writer and surface at Flush.
type respWriter struct{ w *bufio.Writer }

func (w respWriter) simple(s string) {
	w.w.WriteByte('+')
	w.w.WriteString(s)
	w.w.WriteString("\r\n")
}

// err writes an error reply; msg starts with its code ("ERR ...").
func (w respWriter) err(msg string) {
	w.w.WriteByte('-')
	w.w.WriteString(msg)
	w.w.WriteString("\r\n")
}

func (w respWriter) int(n int64) {
	var b [24]byte
	w.w.WriteByte(':')
	w.w.Write(strconv.AppendInt(b[:0], n, 10))
	w.w.WriteString("\r\n")
}

func (w respWriter) bulk(p []byte) {
	var b [24]byte
	w.w.WriteByte('$')
	w.w.Write(strconv.AppendInt(b[:0], int64(len(p)), 10))
	w.w.WriteString("\r\n")
	w.w.Write(p)
	w.w.WriteString("\r\n")
}

func (w respWriter) null() { w.w.WriteString("$-1\r\n") }

func (w respWriter) array(n int) {
	var b [24]byte
	w.w.WriteByte('*')
	w.w.Write(strconv.AppendInt(b[:0], int64(n), 10))
	w.w.WriteString("\r\n")
}
