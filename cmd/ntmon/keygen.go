package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/ntstack/ntstack/internal/wire/hostauth"
)

// keygenCmd is `ntmon keygen`: it writes a host key (an ed25519 private
// key and a self-signed certificate naming the host, PEM, mode 0600; an
// existing file is never overwritten) and prints the line each peer's
// configuration pins it with.
func keygenCmd(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("ntmon keygen", flag.ContinueOnError)
	fs.SetOutput(stderr)
	host := fs.String("host", "", "this host's name, as its configuration's host (default: the system's host name)")
	out := fs.String("out", "", "the key file to write (required; set auth.key to it)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 || *out == "" {
		fmt.Fprintln(stderr, "usage: ntmon keygen [-host NAME] -out FILE")
		return 2
	}
	if *host == "" {
		h, err := os.Hostname()
		if err != nil {
			fmt.Fprintln(stderr, "ntmon keygen:", err)
			return 1
		}
		*host = h
	}
	pin, err := hostauth.WriteKey(*out, *host)
	if err != nil {
		fmt.Fprintln(stderr, "ntmon keygen:", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote the key of %s to %s\n", *host, *out)
	fmt.Fprintf(stdout, "this host's configuration:\n  [auth]\n  key = %q\n", *out)
	fmt.Fprintf(stdout, "each peer's [[peers]] entry for %s:\n  key = %q\n", *host, pin)
	return 0
}
