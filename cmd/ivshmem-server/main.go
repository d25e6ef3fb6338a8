// Command ivshmem-server serves QEMU's ivshmem-doorbell devices (and
// ntstack's host-side peers) one shared-memory region and eventfd
// doorbells, until SIGINT or SIGTERM:
//
//	ivshmem-server -socket /tmp/ivshmem.sock -size 4194304 -vectors 2
//	qemu-system-x86_64 ... -chardev socket,path=/tmp/ivshmem.sock,id=ivs \
//	    -device ivshmem-doorbell,chardev=ivs,vectors=2
//
// All the work is in package ntb/ivshmem.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/ntstack/ntstack/internal/tools/cli"
	"github.com/ntstack/ntstack/ntb/ivshmem"
)

func main() {
	var cfg ivshmem.ServerConfig
	flag.StringVar(&cfg.SocketPath, "socket", "/tmp/ivshmem_socket", "Unix socket to listen on (must not exist)")
	flag.StringVar(&cfg.ShmPath, "shm", "", "shared-memory file to create, e.g. /dev/shm/ivshmem (default: an anonymous memfd)")
	flag.Int64Var(&cfg.Size, "size", 4<<20, "shared-memory size in bytes")
	flag.IntVar(&cfg.Vectors, "vectors", 1, "doorbell vectors per peer")
	cli.ParseMain("ivshmem-server", "[-socket PATH] [-shm FILE] [-size BYTES] [-vectors N]")
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "ivshmem-server:", err)
		os.Exit(1)
	}
}

func run(cfg ivshmem.ServerConfig) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv, err := ivshmem.NewServer(cfg)
	if err != nil {
		return err
	}
	err = srv.Serve(ctx)
	if errors.Is(err, context.Canceled) {
		err = nil // a signal: the normal way to stop
	}
	return errors.Join(err, srv.Close())
}
