//go:build !linux

package ivshmem

import (
	"context"
	"fmt"

	"github.com/ntstack/ntstack/ntb"
)

// Server is an ivshmem-doorbell server; it needs Linux (eventfd, memfd).
type Server struct{}

// Client is one peer of an ivshmem server; it needs Linux.
type Client struct{}

var errNoLinux = fmt.Errorf("ivshmem needs linux: %w", ntb.ErrNotSupported)

// NewServer returns an error matching ntb.ErrNotSupported.
func NewServer(ServerConfig) (*Server, error) { return nil, errNoLinux }

// Serve returns an error matching ntb.ErrNotSupported.
func (*Server) Serve(context.Context) error { return errNoLinux }

// Close does nothing.
func (*Server) Close() error { return nil }

// Dial returns an error matching ntb.ErrNotSupported.
func Dial(context.Context, string, int) (*Client, error) { return nil, errNoLinux }
