package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/ntstack/ntstack/internal/tools/cli"
	"github.com/ntstack/ntstack/internal/wire/hostauth"
)

// keygenSynopsis is keygen's usage line.
const keygenSynopsis = "[-host NAME] [-ca CA.key] -out FILE | -new-ca -out CA.key -cert CA.pem"

// keygenCmd is `ntmon keygen`: it writes a host key (an ed25519 private
// key and a certificate naming the host, PEM, mode 0600; an existing file
// is never overwritten) and prints the configuration lines that use it:
// self-signed, with the pin each peer's configuration holds; or signed
// by a rack CA (-ca), which peers trust through auth.ca. -new-ca makes
// such a CA.
func keygenCmd(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := cli.FlagSet("ntmon keygen", keygenSynopsis, stderr)
	host := fs.String("host", "", "this host's name, as its configuration's host (default: the system's host name)")
	out := fs.String("out", "", "the key file to write (required; set auth.key to it)")
	caKey := fs.String("ca", "", "sign the host's certificate with this rack CA key (from -new-ca) instead of self-signing")
	newCA := fs.Bool("new-ca", false, "write a new rack CA: its private key to -out, its certificate to -cert")
	caCert := fs.String("cert", "", "with -new-ca: where to write the CA's certificate (the hosts' auth.ca)")
	if code, ok := cli.Parse(fs, args, stdout); !ok {
		return code
	}
	if fs.NArg() > 0 || *out == "" || *newCA != (*caCert != "") {
		fs.Usage()
		return 2
	}
	if *newCA {
		if err := writeCA(*out, *caCert); err != nil {
			fmt.Fprintln(stderr, "ntmon keygen:", err)
			return 1
		}
		fmt.Fprintf(stdout, "wrote a rack CA: key %s (keep it off the rack), certificate %s\n", *out, *caCert)
		fmt.Fprintf(stdout, "each host: ntmon keygen -host NAME -ca %s -out FILE; its configuration:\n  [auth]\n  ca = %q\n", *out, *caCert)
		return 0
	}
	if *host == "" {
		h, err := os.Hostname()
		if err != nil {
			fmt.Fprintln(stderr, "ntmon keygen:", err)
			return 1
		}
		*host = h
	}
	if *caKey != "" {
		if err := writeSigned(*out, *host, *caKey); err != nil {
			fmt.Fprintln(stderr, "ntmon keygen:", err)
			return 1
		}
		fmt.Fprintf(stdout, "wrote the key of %s, signed by the rack CA %s, to %s\n", *host, *caKey, *out)
		fmt.Fprintf(stdout, "this host's configuration:\n  [auth]\n  key = %q\n  ca = \"<the CA's certificate>\"\n", *out)
		return 0
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

// writeCA writes a new CA's key (0600) and certificate.
func writeCA(keyPath, certPath string) error {
	ca, _, err := hostauth.NewCA("ntstack rack CA")
	if err != nil {
		return err
	}
	b, err := ca.KeyPEM()
	if err != nil {
		return err
	}
	if err := writeNew(keyPath, b, 0o600); err != nil {
		return err
	}
	if err := writeNew(certPath, ca.CertPEM(), 0o644); err != nil {
		return errors.Join(err, os.Remove(keyPath))
	}
	return nil
}

// writeSigned writes host's key, its certificate signed by the CA in
// caPath.
func writeSigned(path, host, caPath string) error {
	ca, err := hostauth.LoadCAKey(caPath)
	if err != nil {
		return err
	}
	b, err := ca.Sign(host)
	if err != nil {
		return err
	}
	return writeNew(path, b, 0o600)
}

// writeNew writes b to a new file (never overwriting one) of mode perm.
func writeNew(path string, b []byte, perm os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(path)
	}
	return err
}
