package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/ntstack/ntstack/internal/daemon/capture"
	"github.com/ntstack/ntstack/internal/daemon/config"
	"github.com/ntstack/ntstack/internal/tools/cli"
	"github.com/ntstack/ntstack/internal/wire/ctlapi"
)

const captureUsage = `usage: ntmon capture -link LINK [-conn ID] [-snap N] [-count N | -duration D] -w FILE [-config FILE | -socket PATH]
       ntmon capture -lua FILE

Captures the ntstack frames crossing one of ntproxy's rack links to a pcapng
file (link type LINKTYPE_USER0, 147: a 24-byte ntstack pseudo-header, then
the frame's payload, snapped). Stops at -count frames, after -duration, or
on ^C; the file is whole in every case. Needs root (ntproxy's admin socket).
-lua writes the Wireshark dissector that decodes the headers.

  ntmon capture -link b -count 500 -w kv.pcapng         # the link to peer b
  ntmon capture -link rack-a-b -conn 3 -duration 10s -w conn3.pcapng
  ntmon capture -lua ntstack.lua
  tshark -r kv.pcapng -X lua_script:ntstack.lua -T fields -e ntstack.dirname -e ntstack.kindname -e ntstack.conn -e ntstack.text
  ntmon capture -link b -w - | tshark -X lua_script:ntstack.lua -r -

-conn is ntproxy's own socklike connection id on the link (for a connection
this host dialed, the port of LOCAL in ntmon status).
`

// captureCmd is `ntmon capture`.
func captureCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ntmon capture", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", defaultConfig, "host configuration file: ntproxy's admin socket is under its state_dir")
	socket := fs.String("socket", "", "ntproxy's admin socket (instead of -config)")
	link := fs.String("link", "", "rack link to capture: its name or the peer's host name")
	conn := fs.Uint("conn", 0, "capture only this connection: ntproxy's socklike connection id on the link")
	snap := fs.Int("snap", capture.DefaultSnap, fmt.Sprintf("payload bytes kept per frame (%d..%d)", capture.MinSnap, capture.MaxSnap))
	count := fs.Int("count", 0, "stop after this many frames (0: no limit)")
	duration := fs.Duration("duration", 0, "stop after this long (0: no limit)")
	out := fs.String("w", "", "pcapng file to write (-: standard output)")
	lua := fs.String("lua", "", "write the Wireshark Lua dissector to this file")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), captureUsage)
		fmt.Fprintln(fs.Output())
		fs.PrintDefaults()
	}
	if code, ok := cli.Parse(fs, args, stdout); !ok {
		return code
	}
	if fs.NArg() > 0 || (*lua == "" && (*link == "" || *out == "")) || (*link != "") != (*out != "") {
		fs.Usage()
		return 2
	}
	if *lua != "" {
		if err := capture.WriteDissector(*lua); err != nil {
			fmt.Fprintln(stderr, "ntmon capture:", err)
			return 1
		}
		if *link == "" {
			return 0
		}
	}
	if *socket == "" {
		cfg, err := config.Load(*cfgPath)
		if err != nil {
			fmt.Fprintln(stderr, "ntmon capture:", err)
			return 1
		}
		*socket = cfg.Path(config.AdminSocket)
	}
	req := capture.Request{Link: *link, Conn: uint32(*conn), Snap: *snap, Count: *count, Duration: *duration}
	w := &lazyFile{path: *out, stdout: stdout}
	sum, err := capture.Fetch(ctx, *socket, req, w)
	if cerr := w.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Fprintln(stderr, "ntmon capture:", err)
		var e *ctlapi.Error
		if errors.As(err, &e) && e.Code == ctlapi.CodeUnavail {
			fmt.Fprintf(stderr, "ntmon capture: is ntproxy running, and are you root? (socket %s)\n", *socket)
		}
		return 1
	}
	if sum.Complete {
		fmt.Fprintf(stderr, "ntmon capture: %d frames of link %s written to %s (%d dropped: the file's reader fell behind)\n",
			sum.Packets, *link, *out, sum.Dropped)
	} else {
		fmt.Fprintf(stderr, "ntmon capture: stopped; %d frames of link %s written to %s\n", sum.Packets, *link, *out)
	}
	return 0
}

// lazyFile creates its file at the first write, so a capture that cannot
// start leaves no empty file behind; "-" is stdout.
type lazyFile struct {
	path   string
	stdout io.Writer
	f      *os.File
}

func (l *lazyFile) Write(p []byte) (int, error) {
	if l.path == "-" {
		return l.stdout.Write(p)
	}
	if l.f == nil {
		f, err := os.Create(l.path)
		if err != nil {
			return 0, fmt.Errorf("create capture file: %w", err)
		}
		l.f = f
	}
	return l.f.Write(p)
}

func (l *lazyFile) Close() error {
	if l.f == nil {
		return nil
	}
	if err := l.f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", l.path, err)
	}
	return nil
}
