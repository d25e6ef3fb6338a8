package capture

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"

	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

// Summary describes a fetched capture.
type Summary struct {
	Packets uint64 // frames written to the file
	// Complete: the daemon ended the stream (count or duration reached)
	// and sent its statistics, Received and Dropped. Otherwise the client
	// stopped it, and the statistics are unknown.
	Complete          bool
	Received, Dropped uint64
}

// Fetch asks the ntproxy whose admin socket is socket for a capture and
// copies the pcapng stream to w until the daemon ends it or ctx ends. Only
// whole blocks reach w, so the file is well formed even when ctx cuts the
// stream; ctx ending is a normal stop, not an error. A refused request is
// an *ctlapi.Error with its code; an unreachable daemon CodeUnavail.
func Fetch(ctx context.Context, socket string, req Request, w io.Writer) (Summary, error) {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}
	defer tr.CloseIdleConnections()
	hr, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://local"+Path+"?"+req.Query().Encode(), nil)
	if err != nil {
		return Summary{}, ctlapi.Errorf(ctlapi.CodeBadRequest, "capture: %v", err)
	}
	resp, err := (&http.Client{Transport: tr}).Do(hr)
	if err != nil {
		return Summary{}, ctlapi.Errorf(ctlapi.CodeUnavail, "capture: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e ctlapi.Error
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &e) != nil || e.Code == ctlapi.OK {
			return Summary{}, ctlapi.Errorf(ctlapi.CodeInternal, "capture: HTTP %d", resp.StatusCode)
		}
		return Summary{}, &e
	}
	if ct := resp.Header.Get("Content-Type"); ct != ContentType {
		return Summary{}, ctlapi.Errorf(ctlapi.CodeVersion, "capture: reply of type %q, want %q", ct, ContentType)
	}
	var sum Summary
	err = CopyBlocks(w, resp.Body, &sum)
	if err != nil && ctx.Err() != nil {
		err = nil // stopped by the caller
	}
	return sum, err
}

// pcapng framing, as far as CopyBlocks reads it (every block: type u32,
// total length u32, body, total length u32; little-endian, as Writer
// writes):
//
//	section header    type 0x0A0D0D0A, body: byte-order magic u32 0x1A2B3C4D, ...
//	packet            type 6 (enhanced packet block)
//	statistics        type 5, body: interface u32, timestamp u64, options
//	option            code u16, length u16, value padded to 4 bytes; code 0 ends
//	                  (statistics: 4 isb_ifrecv u64, 5 isb_ifdrop u64)
const (
	blockSection    = 0x0A0D0D0A
	blockPacket     = 6
	blockStatistics = 5
	byteOrderMagic  = 0x1A2B3C4D

	blockHdr        = 8 // type, length
	blockMin        = 12
	blockMax        = 1 << 20 // a packet of MaxSnap with room for options
	isbOptOff       = 12      // options start after interface and timestamp
	optIfRecv       = 4
	optIfDrop       = 5
	optHdr          = 4
	offSectionMagic = 0 // the byte-order magic's offset in a section header's body
)

var errBlock = errors.New("malformed pcapng stream")

// CopyBlocks copies the pcapng stream r to w one whole block at a time,
// counting packets and reading the statistics into sum. It returns nil at
// the end of r on a block boundary. r is another process's output: every
// length is checked.
func CopyBlocks(w io.Writer, r io.Reader, sum *Summary) error {
	buf := make([]byte, 0, 64<<10)
	for first := true; ; first = false {
		var hdr [blockHdr]byte
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			if err == io.EOF && !first {
				return nil
			}
			return fmt.Errorf("read capture block: %w", err)
		}
		typ, n := binary.LittleEndian.Uint32(hdr[:]), binary.LittleEndian.Uint32(hdr[4:])
		if n < blockMin || n%4 != 0 || n > blockMax {
			return fmt.Errorf("read capture block: length %d: %w", n, errBlock)
		}
		if first != (typ == blockSection) {
			return fmt.Errorf("read capture block: type %#x first %v: %w", typ, first, errBlock)
		}
		buf = append(buf[:0], hdr[:]...)
		buf = append(buf, make([]byte, n-blockHdr)...)
		if _, err := io.ReadFull(r, buf[blockHdr:]); err != nil {
			return fmt.Errorf("read capture block: %w", err)
		}
		if binary.LittleEndian.Uint32(buf[n-4:]) != n {
			return fmt.Errorf("read capture block: trailing length differs: %w", errBlock)
		}
		body := buf[blockHdr : n-4]
		switch typ {
		case blockSection:
			if len(body) < 4 || binary.LittleEndian.Uint32(body[offSectionMagic:]) != byteOrderMagic {
				return fmt.Errorf("read capture block: not a little-endian pcapng section: %w", errBlock)
			}
		case blockPacket:
			sum.Packets++
		case blockStatistics:
			readStats(body, sum)
		}
		if _, err := w.Write(buf); err != nil {
			return fmt.Errorf("write capture: %w", err)
		}
	}
}

// readStats reads an interface statistics block's counters.
func readStats(body []byte, sum *Summary) {
	if len(body) < isbOptOff {
		return
	}
	sum.Complete = true
	opts := body[isbOptOff:]
	for len(opts) >= optHdr {
		code, n := binary.LittleEndian.Uint16(opts), int(binary.LittleEndian.Uint16(opts[2:]))
		padded := (n + 3) &^ 3
		if code == 0 || optHdr+padded > len(opts) {
			return
		}
		v := opts[optHdr : optHdr+n]
		if n == 8 {
			switch code {
			case optIfRecv:
				sum.Received = binary.LittleEndian.Uint64(v)
			case optIfDrop:
				sum.Dropped = binary.LittleEndian.Uint64(v)
			}
		}
		opts = opts[optHdr+padded:]
	}
}
