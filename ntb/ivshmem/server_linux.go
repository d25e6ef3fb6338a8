package ivshmem

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// sendTimeout bounds one message to one client. The server holds its lock
// while it sends, so a client that stops reading must not stall the others
// for long; a healthy client drains 8-byte messages at once.
const sendTimeout = 2 * time.Second

// Server is an ivshmem-doorbell server. It listens from NewServer on, so
// clients (and QEMU) may connect before Serve runs; they are answered once
// Serve accepts them.
type Server struct {
	cfg ServerConfig
	ln  *net.UnixListener
	shm *os.File

	serving   atomic.Bool
	closeOnce sync.Once
	closeErr  error
	wg        sync.WaitGroup // runPeer goroutines

	// mu protects the following fields.
	mu     sync.Mutex
	closed bool
	peers  map[int]*serverPeer
}

// serverPeer is one connected client and the eventfds others use to ring it.
type serverPeer struct {
	id   int
	conn *net.UnixConn
	fds  []int // eventfd per vector
}

// NewServer creates the shared memory and starts listening on
// cfg.SocketPath.
func NewServer(cfg ServerConfig) (_ *Server, err error) {
	if cfg.Vectors == 0 {
		cfg.Vectors = 1
	}
	switch {
	case cfg.SocketPath == "":
		return nil, errors.New("new ivshmem server: empty socket path")
	case cfg.Size <= 0:
		return nil, fmt.Errorf("new ivshmem server: size %d, want > 0", cfg.Size)
	case cfg.Vectors < 0 || cfg.Vectors > MaxVectors:
		return nil, fmt.Errorf("new ivshmem server: %d vectors, want 1..%d", cfg.Vectors, MaxVectors)
	}
	s := &Server{cfg: cfg, peers: make(map[int]*serverPeer)}
	defer func() {
		if err != nil {
			err = errors.Join(err, s.release())
		}
	}()
	if s.shm, err = createShm(cfg.ShmPath, cfg.Size); err != nil {
		return nil, fmt.Errorf("new ivshmem server: %w", err)
	}
	if s.ln, err = net.ListenUnix("unix", &net.UnixAddr{Name: cfg.SocketPath, Net: "unix"}); err != nil {
		return nil, fmt.Errorf("new ivshmem server: %w", err)
	}
	return s, nil
}

func createShm(path string, size int64) (*os.File, error) {
	var f *os.File
	if path == "" {
		fd, err := unix.MemfdCreate("ivshmem", unix.MFD_CLOEXEC)
		if err != nil {
			return nil, fmt.Errorf("create memfd: %w", err)
		}
		f = os.NewFile(uintptr(fd), "memfd:ivshmem")
	} else {
		var err error
		if f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600); err != nil {
			return nil, fmt.Errorf("create shared memory: %w", err)
		}
	}
	if err := f.Truncate(size); err != nil {
		return nil, errors.Join(fmt.Errorf("size shared memory %s: %w", f.Name(), err), f.Close())
	}
	return f, nil
}

// Addr is the socket path the server listens on.
func (s *Server) Addr() string { return s.cfg.SocketPath }

// Serve accepts clients until ctx is done or the server is closed; a done
// ctx closes the server. It returns nil after Close and ctx.Err() after
// cancellation. Serve may be called once.
func (s *Server) Serve(ctx context.Context) error {
	if s.serving.Swap(true) {
		return errors.New("ivshmem serve: already serving")
	}
	stop := context.AfterFunc(ctx, func() { _ = s.Close() })
	defer stop()
	for {
		conn, err := s.ln.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if s.isClosed() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
				time.Sleep(10 * time.Millisecond) // fd exhaustion: back off, like net/http
				continue
			}
			return fmt.Errorf("ivshmem serve: %w", err)
		}
		s.admit(conn)
	}
}

func (s *Server) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// admit gives conn an id and eventfds, sends it the handshake and
// announces it to the others. A client that cannot be served is dropped.
func (s *Server) admit(conn *net.UnixConn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = conn.Close()
		return
	}
	id := s.freeIDLocked()
	if id < 0 {
		_ = conn.Close()
		return
	}
	p := &serverPeer{id: id, conn: conn}
	for range s.cfg.Vectors {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
		if err != nil {
			p.close()
			return
		}
		p.fds = append(p.fds, fd)
	}
	if err := s.handshakeLocked(p); err != nil {
		p.close()
		return
	}
	for _, q := range s.peers {
		if err := q.sendVectors(p); err != nil {
			// q is gone or stuck; its runPeer announces the disconnect.
			_ = q.conn.Close()
		}
	}
	s.peers[id] = p
	s.wg.Add(1)
	go s.runPeer(p)
}

// freeIDLocked returns the lowest unused peer id, or -1.
func (s *Server) freeIDLocked() int {
	for id := range MaxPeers {
		if _, ok := s.peers[id]; !ok {
			return id
		}
	}
	return -1
}

func (s *Server) handshakeLocked(p *serverPeer) error {
	if err := p.send(protocolVersion, -1); err != nil {
		return err
	}
	if err := p.send(int64(p.id), -1); err != nil {
		return err
	}
	if err := p.send(shmMarker, int(s.shm.Fd())); err != nil {
		return err
	}
	ids := make([]int, 0, len(s.peers))
	for id := range s.peers {
		ids = append(ids, id)
	}
	sort.Ints(ids)
	for _, id := range ids {
		if err := p.sendVectors(s.peers[id]); err != nil {
			return err
		}
	}
	return p.sendVectors(p)
}

// runPeer waits for the client to hang up (or to break the protocol by
// sending anything), then removes it and announces its departure.
func (s *Server) runPeer(p *serverPeer) {
	defer s.wg.Done()
	var b [1]byte
	_, _ = p.conn.Read(b[:]) // returns on data, EOF, error or Close
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.peers, p.id)
	p.close()
	if s.closed {
		return
	}
	for _, q := range s.peers {
		if err := q.send(int64(p.id), -1); err != nil {
			_ = q.conn.Close()
		}
	}
}

// send writes one message, with fd attached unless fd < 0.
func (p *serverPeer) send(v int64, fd int) error {
	var b [msgSize]byte
	binary.LittleEndian.PutUint64(b[:], uint64(v))
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	if err := p.conn.SetWriteDeadline(time.Now().Add(sendTimeout)); err != nil {
		return err
	}
	n, oobn, err := p.conn.WriteMsgUnix(b[:], oob, nil)
	if err == nil && (n != len(b) || oobn != len(oob)) {
		err = fmt.Errorf("short write to peer %d", p.id)
	}
	return err
}

// sendVectors tells p about q: q's id with each of q's eventfds.
func (p *serverPeer) sendVectors(q *serverPeer) error {
	for _, fd := range q.fds {
		if err := p.send(int64(q.id), fd); err != nil {
			return err
		}
	}
	return nil
}

func (p *serverPeer) close() {
	_ = p.conn.Close()
	for _, fd := range p.fds {
		_ = unix.Close(fd)
	}
	p.fds = nil
}

// Close stops the server: it stops listening (removing the socket file),
// disconnects every client, closes every eventfd and the shared-memory fd,
// and waits for its goroutines. Clients keep their mappings and fds. Close
// is idempotent.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		for _, p := range s.peers {
			_ = p.conn.Close() // runPeer cleans up
		}
		s.mu.Unlock()
		s.closeErr = s.release()
		s.wg.Wait()
	})
	return s.closeErr
}

func (s *Server) release() error {
	var errs []error
	if s.ln != nil {
		// Closing the listener unlinks the socket file.
		if err := s.ln.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close ivshmem listener: %w", err))
		}
	}
	if s.shm != nil {
		if err := s.shm.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close shared memory: %w", err))
		}
	}
	return errors.Join(errs...)
}
