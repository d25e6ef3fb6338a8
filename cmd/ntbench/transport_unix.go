package main

import (
	"fmt"
	"net"
	"os"
)

// unix is a Unix-domain stream socket, the cheapest kernel byte stream
// between two processes on one host. It listens in the abstract namespace
// (the leading "@"), so there is no socket file to clean up.
func init() {
	register(transport{
		name: "unix",
		listen: func(*options) (net.Listener, string, error) {
			addr := fmt.Sprintf("@ntbench-%d", os.Getpid())
			ln, err := net.Listen("unix", addr)
			if err != nil {
				return nil, "", err
			}
			return ln, addr, nil
		},
		dial: func(_ *options, addr string) (net.Conn, error) {
			return net.Dial("unix", addr)
		},
	})
}
