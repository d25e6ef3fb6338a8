package socklike

import (
	"bytes"
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

// writerOnly hides Conn's ReadFrom from io.CopyBuffer, which would call it.
type writerOnly struct{ io.Writer }

var _ io.ReaderFrom = (*Conn)(nil)
