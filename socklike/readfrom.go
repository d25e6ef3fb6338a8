package socklike

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"sync"
)

// readFromBuf is the size of the writes ReadFrom makes. io.Copy, and
// net/http's response writer through it, otherwise writes 32 KiB at a
// time, and each Write is a post, a pass of the sender and a hand-back,
// with the sender's CPU cache cold again for the next: a large write goes
// out as a run of MTU-sized records on one post. 256 KiB keeps the copy
// into the buffer within a CPU's L2.
const readFromBuf = 256 << 10

var readFromPool = sync.Pool{New: func() any {
	b := make([]byte, readFromBuf)
	return &b
}}

// ReadFrom writes what r holds until io.EOF, as io.Copy does — each Read's
// bytes as they come — with a 256 KiB buffer rather than io.Copy's 32 KiB.
// A reader that writes itself out (io.WriterTo) does so straight into the
// connection; in shared-pool mode a source in memory or a regular file is
// read straight into the pool's ring. io.Copy into a Conn, and net/http's
// response writer, call it. It returns the bytes written and the first
// error other than io.EOF.
func (c *Conn) ReadFrom(r io.Reader) (int64, error) {
	if c.d == nil && c.c == nil && readsAtOnce(r) {
		return c.pc.ReadFrom(r) // straight into the pool's ring
	}
	// A file's WriteTo copies 32 KiB at a time to anything but a socket.
	if _, file := r.(*os.File); !file {
		if wt, ok := r.(io.WriterTo); ok {
			return wt.WriteTo(writerOnly{c})
		}
	}
	// net/http's response body is an io.LimitedReader over the content:
	// bytes in memory are written straight from it too, not copied
	// through the buffer first.
	if lr, ok := r.(*io.LimitedReader); ok && inMemory(lr.R) {
		return writeLimited(writerOnly{c}, lr)
	}
	bp := readFromPool.Get().(*[]byte)
	defer readFromPool.Put(bp)
	return io.CopyBuffer(writerOnly{c}, r, *bp)
}

// readsAtOnce reports whether every Read of r returns without waiting on
// anyone: bytes in memory or a regular file, whole or through an
// io.LimitedReader (net/http's response body). Shared-pool mode reads such
// a source straight into its ring, holding the write lock, which Close
// waits for; a socket or a pipe could hold it, and Close, indefinitely.
func readsAtOnce(r io.Reader) bool {
	if lr, ok := r.(*io.LimitedReader); ok {
		r = lr.R
	}
	switch v := r.(type) {
	case *bytes.Reader, *strings.Reader:
		return true
	case *os.File:
		fi, err := v.Stat()
		return err == nil && fi.Mode().IsRegular()
	}
	return false
}

// inMemory reports whether r is bytes in memory whose WriteTo writes them
// all in one Write.
func inMemory(r io.Reader) bool {
	switch r.(type) {
	case *bytes.Reader, *strings.Reader:
		return true
	}
	return false
}

// writeLimited writes lr's bytes to w through lr.R's WriteTo (one Write of
// what is left, inMemory), cut to lr.N, and takes them off lr.N.
func writeLimited(w io.Writer, lr *io.LimitedReader) (int64, error) {
	if lr.N <= 0 {
		return 0, nil
	}
	lw := &limitedWriter{w: w, n: lr.N}
	n, err := lr.R.(io.WriterTo).WriteTo(lw)
	lr.N -= n
	if errors.Is(err, io.ErrShortWrite) && lw.n == 0 {
		err = nil // the source holds more than the limit
	}
	return n, err
}

// limitedWriter writes at most n bytes to w.
type limitedWriter struct {
	w io.Writer
	n int64
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	k, err := l.w.Write(p[:min(int64(len(p)), l.n)])
	l.n -= int64(k)
	if err == nil && k < len(p) {
		err = io.ErrShortWrite
	}
	return k, err
}

// writerOnly hides Conn's ReadFrom from io.CopyBuffer, which would call it.
type writerOnly struct{ io.Writer }

var _ io.ReaderFrom = (*Conn)(nil)
