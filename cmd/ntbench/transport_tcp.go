package main

import "net"

// tcp is the kernel's TCP over loopback, the baseline every other transport
// is compared with. Go sets TCP_NODELAY on every connection.
func init() {
	register(transport{
		name: "tcp",
		listen: func(*options) (net.Listener, string, error) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return nil, "", err
			}
			return ln, ln.Addr().String(), nil
		},
		dial: func(_ *options, addr string) (net.Conn, error) {
			return net.Dial("tcp", addr)
		},
	})
}
