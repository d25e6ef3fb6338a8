package workload

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// FileServer serves deterministic pseudorandom files over net/http: GET
// (or HEAD, or a Range of) /file/<size> returns FileContent(size, seed)
// for each size given to NewFileServer, with its SHA-256 in the
// X-Content-Sha256 header; any other path is 404.
//
// The files are generated once, in NewFileServer, and kept in memory
// until the FileServer is dropped; handlers only read them.
type FileServer struct {
	seed  uint64
	files map[int]servedFile // immutable after NewFileServer
	srv   *http.Server
}

type servedFile struct {
	data []byte
	sum  string // hex SHA-256 of data
}

// NewFileServer generates a file of each size (negative sizes panic) from
// seed; call Serve to start serving them.
func NewFileServer(sizes []int, seed uint64) *FileServer {
	fs := &FileServer{seed: seed, files: make(map[int]servedFile, len(sizes))}
	for _, n := range sizes {
		if n < 0 {
			panic(fmt.Sprintf("workload: NewFileServer: negative size %d", n))
		}
		data := FileContent(n, seed)
		sum := sha256.Sum256(data)
		fs.files[n] = servedFile{data: data, sum: hex.EncodeToString(sum[:])}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /file/{size}", fs.serveFile)
	fs.srv = &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	return fs
}

// FileContent returns the file of size bytes that a FileServer with seed
// serves: the splitmix64 stream from a hash of (seed, size).
func FileContent(size int, seed uint64) []byte {
	b := make([]byte, size)
	fillStream(b, mix64(seed)^mix64(uint64(size)+1))
	return b
}

// FileURLPath is the path of the file of size bytes.
func FileURLPath(size int) string { return "/file/" + strconv.Itoa(size) }

func (fs *FileServer) serveFile(w http.ResponseWriter, r *http.Request) {
	size, err := strconv.Atoi(r.PathValue("size"))
	f, ok := fs.files[size]
	if err != nil || !ok {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("X-Content-Sha256", f.sum)
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.data))
}

// Serve serves HTTP on ln until Close; it returns nil after Close and
// otherwise the error that stopped it. ln is closed either way.
func (fs *FileServer) Serve(ln net.Listener) error {
	if err := fs.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("file server: serve: %w", err)
	}
	return nil
}

// Close closes the listeners and every connection at once, as
// http.Server.Close does; handlers still running end on their next write.
func (fs *FileServer) Close() error {
	if err := fs.srv.Close(); err != nil {
		return fmt.Errorf("file server: close: %w", err)
	}
	return nil
}

var _ io.Closer = (*FileServer)(nil)

// HTTPConfig configures RunHTTP.
type HTTPConfig struct {
	Dial        DialFunc // nil: a plain net.Dialer
	BaseURL     string   // "http://host:port", the FileServer's root
	Size        int      // which file to fetch, in bytes
	Seed        uint64   // the FileServer's seed, to know the expected bytes
	Requests    int64    // requests in all; 0: until Duration
	Duration    time.Duration
	Concurrency int // concurrent clients, each with its own keep-alive connection
	// Timeout bounds each request, body included; 0 means 60 s.
	Timeout time.Duration
}

// HTTPResult is what RunHTTP measured. Requests counts every request sent;
// Errors and VerifyErrors are those that failed or returned wrong bytes.
// Bytes counts body bytes received; MBPerSec is Bytes per second of the
// run, in 10^6 bytes. Latency is from sending a request to the end of its
// body.
type HTTPResult struct {
	Size         int            `json:"size"`
	Concurrency  int            `json:"concurrency"`
	Requests     uint64         `json:"requests"`
	Bytes        uint64         `json:"bytes"`
	Errors       uint64         `json:"errors"`
	VerifyErrors uint64         `json:"verify_errors"`
	Elapsed      time.Duration  `json:"elapsed_ns"`
	MBPerSec     float64        `json:"mb_per_s"`
	Latency      LatencySummary `json:"latency"`
}

const defaultHTTPTimeout = 60 * time.Second

// RunHTTP fetches cfg.BaseURL/file/<cfg.Size> with cfg.Concurrency clients
// until cfg.Requests requests or cfg.Duration, whichever comes first (at
// least one must be set), or ctx ends, over an http.Transport that dials
// with cfg.Dial (keep-alives on, compression off). Every body is compared,
// byte for byte, with FileContent(cfg.Size, cfg.Seed).
//
// The result is filled in whenever the run started. The error is non-nil
// if the configuration is invalid, ctx ended, or any request failed
// (matching ErrVerify if a body was wrong); it names the first failure of
// each kind.
func RunHTTP(ctx context.Context, cfg HTTPConfig) (HTTPResult, error) {
	res := HTTPResult{Size: cfg.Size, Concurrency: cfg.Concurrency}
	switch {
	case cfg.Size < 0:
		return res, fmt.Errorf("http run: size %d: want at least 0", cfg.Size)
	case cfg.Concurrency < 1:
		return res, fmt.Errorf("http run: concurrency %d: want at least 1", cfg.Concurrency)
	case cfg.Requests <= 0 && cfg.Duration <= 0:
		return res, errors.New("http run: neither requests nor duration set")
	case !strings.HasPrefix(cfg.BaseURL, "http://"):
		return res, fmt.Errorf("http run: base URL %q: want http://host:port", cfg.BaseURL)
	}
	url := strings.TrimSuffix(cfg.BaseURL, "/") + FileURLPath(cfg.Size)
	want := FileContent(cfg.Size, cfg.Seed)
	dial := cfg.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = defaultHTTPTimeout
	}
	tr := &http.Transport{
		DialContext:         dial,
		DisableCompression:  true,
		MaxIdleConns:        cfg.Concurrency,
		MaxIdleConnsPerHost: cfg.Concurrency,
		// A request that finds no idle connection starts a dial even if
		// one frees up a moment later (the dialed connection is then
		// closed as surplus). Over TCP that is cheap; in direct mode each
		// dial holds a window slice until its lease is released, and a
		// burst of surplus dials ran into proxy.direct_quota (make demo's
		// 8 KiB files, 1 run in 8). Bound the dials instead.
		MaxConnsPerHost:       cfg.Concurrency,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: timeout,
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: timeout}

	b := &budget{ctx: ctx, ops: cfg.Requests}
	workers := make([]httpWorker, cfg.Concurrency)
	var fails failures
	var wg sync.WaitGroup
	start := time.Now()
	if cfg.Duration > 0 {
		var cancel context.CancelFunc
		b.ctx, cancel = context.WithDeadline(ctx, start.Add(cfg.Duration))
		defer cancel()
	}
	for i := range workers {
		w := &workers[i]
		wg.Go(func() { w.run(ctx, b, client, url, want, &fails) })
	}
	wg.Wait()
	res.Elapsed = time.Since(start)

	var lat Recorder
	for i := range workers {
		w := &workers[i]
		lat.Merge(&w.lat)
		res.Bytes += w.bytes
		res.Errors += w.errors
		res.VerifyErrors += w.verifyErrors
	}
	res.Requests = lat.Count()
	res.Latency = lat.Summary()
	if res.Elapsed > 0 {
		res.MBPerSec = float64(res.Bytes) / res.Elapsed.Seconds() / 1e6
	}
	if err := fails.err(ctx, res.Errors, res.VerifyErrors); err != nil {
		return res, fmt.Errorf("http run: %w", err)
	}
	return res, nil
}

// httpWorker is one client; only its goroutine touches it until RunHTTP's
// wait returns.
type httpWorker struct {
	lat                  Recorder
	bytes                uint64
	errors, verifyErrors uint64
}

// httpCopyBuf is each worker's body read size.
const httpCopyBuf = 256 << 10

func (w *httpWorker) run(ctx context.Context, b *budget, client *http.Client, url string, want []byte, fails *failures) {
	buf := make([]byte, httpCopyBuf)
	for b.take() {
		start := time.Now()
		n, at, err := fetch(ctx, client, url, buf, want)
		w.lat.Record(time.Since(start))
		w.bytes += uint64(n)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			w.errors++
			fails.op(fmt.Errorf("get %s: %w", url, err))
		case at >= 0:
			w.verifyErrors++
			fails.verify(fmt.Errorf("get %s: body differs from the file at byte %d: %w", url, at, ErrVerify))
		case n != int64(len(want)):
			w.verifyErrors++
			fails.verify(fmt.Errorf("get %s: body is %d bytes, want %d: %w", url, n, len(want), ErrVerify))
		}
	}
}

// fetch GETs url and compares its body with want as it arrives. It returns
// the body's length and the offset of its first byte that differs from
// want (a byte beyond want counts), or -1 if none does.
//
// The check is a comparison with the expected bytes, not a hash of the
// body: SHA-256 is slower than the transports it would check, so hashing
// would take most of a large-file run's CPU and measure the hash more
// than the transport (docs/perf-log.md, 2026-12-02); a comparison runs at
// memory speed and tells where a body went wrong.
func fetch(ctx context.Context, client *http.Client, url string, buf, want []byte) (n, at int64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, -1, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, -1, err
	}
	defer resp.Body.Close()
	c := compareWriter{want: want, at: -1}
	n, err = io.CopyBuffer(&c, resp.Body, buf)
	if err != nil {
		return n, c.at, fmt.Errorf("read body: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return n, c.at, fmt.Errorf("status %s", resp.Status)
	}
	return n, c.at, nil
}

// compareWriter compares what is written to it with want, in order,
// recording the offset of the first byte that differs (or lies beyond
// want) in at; it never fails a write.
type compareWriter struct {
	want []byte
	off  int64 // bytes written so far
	at   int64 // first differing offset, or -1
}

func (c *compareWriter) Write(p []byte) (int, error) {
	if c.at < 0 {
		rest := c.want[min(c.off, int64(len(c.want))):]
		m := min(len(p), len(rest))
		if !bytes.Equal(p[:m], rest[:m]) {
			for i := range m {
				if p[i] != rest[i] {
					c.at = c.off + int64(i)
					break
				}
			}
		} else if m < len(p) {
			c.at = c.off + int64(m)
		}
	}
	c.off += int64(len(p))
	return len(p), nil
}

var _ io.Writer = (*compareWriter)(nil)
