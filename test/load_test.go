//go:build integration

package test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ntstack/ntstack/ntb/shm"
	"github.com/ntstack/ntstack/socklike"
)

// Issue 41's load test: real protocol stacks over embedded endpoints, on
// a machine whose CPUs are saturated, lose nothing.

const (
	// loadDurationEnv overrides how long TestHTTPUnderLoad runs (a Go
	// duration; default loadDuration), for local runs.
	loadDurationEnv = "NTSTACK_LOAD_DURATION"
	loadDuration    = 60 * time.Second

	loadPortHTTP1 = 1080
	loadPortH2C   = 1081
	loadPortGRPC  = 1082
	loadMaxBody   = 1 << 20 // bodies and gRPC messages are 0..loadMaxBody bytes

	loadWorkersHTTP1 = 32 // each with a keep-alive connection of its own
	loadWorkersH2C   = 32 // streams on one connection
	loadWorkersGRPC  = 16 // streams on one connection
	grpcMsgsPerCall  = 4  // messages each way on one gRPC stream, at most
	// grpcWindow is gRPC's flow-control window per stream (four per
	// connection): its default of 64 KiB costs a window update per 64 KiB,
	// a round trip that a saturated CPU makes long.
	grpcWindow = 4 << 20

	// sumHeader carries the SHA-256 of the request body as the server
	// received it.
	sumHeader = "X-Ntstack-Sha256"
	// grpcEchoMethod is the one method of the gRPC server: a
	// bidirectional stream that echoes every message.
	grpcEchoMethod = "/ntstack.test.Echo/Stream"
	// loadRequestTimeout bounds one request or one gRPC stream: far beyond
	// what one takes on a loaded machine, so that reaching it means a hang.
	loadRequestTimeout = 2 * time.Minute
	// h2FrameSize and h2Window are h2c's largest frame and its upload
	// windows per stream (eight times that per connection): its defaults
	// (16 KiB, 1 MiB for all streams) make many small frames and window
	// updates, round trips that a saturated CPU makes long, and starve
	// some of 32 streams each uploading up to 1 MiB.
	h2FrameSize = 1 << 20
	h2Window    = 4 << 20
)

// TestHTTPUnderLoad runs HTTP/1.1, h2c and gRPC streams between two
// processes over embedded endpoints (the server in a child, the clients
// here), with bodies of random sizes up to 1 MiB echoed and checked by
// SHA-256, from concurrent clients, while busy child processes saturate
// every CPU. No request may fail and no connection may be lost: a peer
// starved of CPU is alive, and its connections must survive.
func TestHTTPUnderLoad(t *testing.T) {
	duration := loadDuration
	if v := os.Getenv(loadDurationEnv); v != "" {
		var err error
		duration, err = time.ParseDuration(v)
		require.NoError(t, err, "%s", loadDurationEnv)
	}
	seed := seed(t)
	dir := fabricDir(t)
	srv := startChild(t, "loadserve", childParams{Dir: dir, Side: shm.Side1})
	ep, _ := openSocklike(t, dir, shm.Side0)
	require.True(t, srv.next(30*time.Second).Ready, "the server child is ready")
	stopHog := startHog(t)

	d := &socklike.Dialer{Endpoint: ep}
	http1 := &protoLoad{name: "HTTP/1.1"}
	h2 := &protoLoad{name: "h2c"}
	grpcs := &protoLoad{name: "gRPC"}
	http1Client := &http.Client{Transport: &http.Transport{
		DialContext:         http1.dialer(d, loadPortHTTP1),
		MaxIdleConnsPerHost: loadWorkersHTTP1,
		MaxConnsPerHost:     loadWorkersHTTP1,
	}}
	defer http1Client.CloseIdleConnections()
	h2Client := &http.Client{Transport: &http.Transport{
		Protocols:   h2cOnly(),
		HTTP2:       &http.HTTP2Config{MaxReadFrameSize: h2FrameSize},
		DialContext: h2.dialer(d, loadPortH2C),
	}}
	defer h2Client.CloseIdleConnections()
	gc, err := grpc.NewClient("passthrough:///peer",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return grpcs.dialer(d, loadPortGRPC)(ctx, "tcp", addr)
		}),
		grpc.WithInitialWindowSize(grpcWindow), grpc.WithInitialConnWindowSize(4*grpcWindow),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{}), grpc.MaxCallRecvMsgSize(2*loadMaxBody), grpc.MaxCallSendMsgSize(2*loadMaxBody)))
	require.NoError(t, err)
	defer gc.Close()

	t.Logf("%v of HTTP/1.1 (%d clients), h2c (%d streams on one connection) and gRPC (%d streams on one connection), bodies 0..%d B, beside %d busy processes",
		duration, loadWorkersHTTP1, loadWorkersH2C, loadWorkersGRPC, loadMaxBody, 2*runtime.NumCPU())
	// One h2c request first: its connection then carries every stream
	// (concurrent first requests would each dial one).
	wctx, wcancel := context.WithTimeout(context.Background(), loadRequestTimeout)
	_, err = httpRound(wctx, h2Client, "http://peer/echo", 2, rand.New(rand.NewPCG(seed, 0)), make([]byte, 1024))
	wcancel()
	require.NoError(t, err, "the first h2c request")

	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	var wg sync.WaitGroup
	worker := func(p *protoLoad, i int, round func(ctx context.Context, rng *rand.Rand, buf []byte) (int64, error)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(i)))
			buf := make([]byte, loadMaxBody)
			for ctx.Err() == nil {
				rctx, rcancel := context.WithTimeout(context.Background(), loadRequestTimeout)
				start := time.Now()
				n, err := round(rctx, rng, buf)
				p.took(time.Since(start))
				rcancel()
				p.done(n, err)
				if err != nil {
					return // the test fails; a worker retrying a dead connection would only spin
				}
			}
		}()
	}
	for i := range loadWorkersHTTP1 {
		worker(http1, 100+i, func(ctx context.Context, rng *rand.Rand, buf []byte) (int64, error) {
			return httpRound(ctx, http1Client, "http://peer/echo", 1, rng, buf)
		})
	}
	for i := range loadWorkersH2C {
		worker(h2, 200+i, func(ctx context.Context, rng *rand.Rand, buf []byte) (int64, error) {
			return httpRound(ctx, h2Client, "http://peer/echo", 2, rng, buf)
		})
	}
	for i := range loadWorkersGRPC {
		worker(grpcs, 300+i, func(ctx context.Context, rng *rand.Rand, buf []byte) (int64, error) {
			return grpcRound(ctx, gc, rng, buf)
		})
	}
	wg.Wait()
	stopHog()

	// Close the clients' connections in order, then have the server
	// report the connections it lost.
	http1Client.CloseIdleConnections()
	h2Client.CloseIdleConnections()
	require.NoError(t, gc.Close())
	srv.finish(30 * time.Second)
	var serverResets []string
	select {
	case r := <-srv.reports:
		serverResets = r.Resets
	default:
		t.Fatal("the server child exited without reporting the connections it lost")
	}

	var failed []string
	for _, p := range []*protoLoad{http1, h2, grpcs} {
		t.Log(p.summary(duration))
		failed = append(failed, p.failures()...)
	}
	require.Empty(t, failed, "requests failed or connections were lost under load (issue 41: zero failed requests, zero resets)")
	require.Empty(t, serverResets, "the server lost connections under load (issue 41: zero resets)")
	for _, p := range []*protoLoad{http1, h2, grpcs} {
		require.Positive(t, p.ok.Load(), "%s: no request completed in %v", p.name, duration)
	}
	// A lost connection that the client replaced quietly is a reset too:
	// h2c and gRPC hold one connection for the whole run, each HTTP/1.1
	// client one of its own.
	require.EqualValues(t, 1, h2.dials.Load(), "h2c dialed more than one connection: the first was lost and replaced")
	require.EqualValues(t, 1, grpcs.dials.Load(), "gRPC dialed more than one connection: the first was lost and replaced")
	// net/http's client may close a keep-alive connection of its own
	// accord (a request's context ends as its response is done) and dial
	// another; a connection the server or the stack ended is among the
	// failures above.
}

// protoLoad counts one protocol's requests and connections.
type protoLoad struct {
	name  string
	ok    atomic.Int64
	bytes atomic.Int64 // request body bytes echoed and checked
	dials atomic.Int64

	mu sync.Mutex
	// mu protects the following fields.
	slowest time.Duration // the longest request or gRPC stream
	nFailed int
	errs    []string // the first few failures
	resets  []string // connections that failed under the client
}

// dialer dials port on d and watches the connection for failures.
func (p *protoLoad) dialer(d *socklike.Dialer, port int) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, _ string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, fmt.Sprintf("peer:%d", port))
		if err != nil {
			p.done(0, fmt.Errorf("dial: %w", err))
			return nil, err
		}
		n := p.dials.Add(1)
		return watchConn(c, true, func(op string, err error) {
			p.mu.Lock()
			defer p.mu.Unlock()
			p.resets = append(p.resets, fmt.Sprintf("connection %d: %s: %v", n, op, err))
		}), nil
	}
}

func (p *protoLoad) took(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.slowest = max(p.slowest, d)
}

func (p *protoLoad) done(n int64, err error) {
	if err == nil {
		p.ok.Add(1)
		p.bytes.Add(n)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.nFailed++
	if len(p.errs) < 3 {
		p.errs = append(p.errs, err.Error())
	}
}

func (p *protoLoad) summary(d time.Duration) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return fmt.Sprintf("%s: %d requests ok (%.0f/s, %.0f MB/s each way, the slowest %v), %d failed, %d connections, %d lost",
		p.name, p.ok.Load(), float64(p.ok.Load())/d.Seconds(), float64(p.bytes.Load())/1e6/d.Seconds(), p.slowest.Round(time.Millisecond),
		p.nFailed, p.dials.Load(), len(p.resets))
}

// failures describes the failed requests and lost connections, the first
// few of each in full.
func (p *protoLoad) failures() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	if p.nFailed > 0 {
		out = append(out, fmt.Sprintf("%s: %d requests failed, the first %d: %s", p.name, p.nFailed, len(p.errs), strings.Join(p.errs, "; ")))
	}
	if n := len(p.resets); n > 0 {
		first := p.resets[:min(n, 3)]
		out = append(out, fmt.Sprintf("%s: %d connections lost, the first %d: %s", p.name, n, len(first), strings.Join(first, "; ")))
	}
	return out
}

// httpRound posts a body of random size to url and checks the echo and
// the server's checksum of what it received. It returns the body's size.
func httpRound(ctx context.Context, c *http.Client, url string, protoMajor int, rng *rand.Rand, buf []byte) (int64, error) {
	body := randomBody(rng, buf)
	sum := sha256.Sum256(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, fmt.Errorf("POST of %d B: %w", len(body), err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		return 0, fmt.Errorf("POST of %d B: reading the echo after %d B: %w", len(body), len(got), err)
	case resp.StatusCode != http.StatusOK:
		return 0, fmt.Errorf("POST of %d B: status %s", len(body), resp.Status)
	case resp.ProtoMajor != protoMajor:
		return 0, fmt.Errorf("POST of %d B: answered over %s, want HTTP/%d", len(body), resp.Proto, protoMajor)
	case resp.Header.Get(sumHeader) != hex.EncodeToString(sum[:]):
		return 0, fmt.Errorf("POST of %d B: the server received a body with SHA-256 %s, sent %x", len(body), resp.Header.Get(sumHeader), sum)
	case !bytes.Equal(got, body):
		return 0, fmt.Errorf("POST of %d B: the echo (%d B) differs from the body at byte %d", len(body), len(got), firstDiff(got, body))
	}
	return int64(len(body)), nil
}

// grpcRound runs one bidirectional gRPC stream: a few messages of random
// sizes, each echoed and checked, then an orderly end.
func grpcRound(ctx context.Context, cc *grpc.ClientConn, rng *rand.Rand, buf []byte) (int64, error) {
	s, err := cc.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, grpcEchoMethod)
	if err != nil {
		return 0, fmt.Errorf("new stream: %w", err)
	}
	var total int64
	msgs := 1 + rng.IntN(grpcMsgsPerCall)
	for i := range msgs {
		msg := randomBody(rng, buf)
		if err := s.SendMsg(&msg); err != nil {
			return total, fmt.Errorf("message %d of %d B: send: %w", i, len(msg), err)
		}
		var got []byte
		if err := s.RecvMsg(&got); err != nil {
			return total, fmt.Errorf("message %d of %d B: receive the echo: %w", i, len(msg), err)
		}
		if !bytes.Equal(got, msg) {
			return total, fmt.Errorf("message %d of %d B: the echo (%d B, SHA-256 %x) differs at byte %d (sent SHA-256 %x)",
				i, len(msg), len(got), sha256.Sum256(got), firstDiff(got, msg), sha256.Sum256(msg))
		}
		total += int64(len(msg))
	}
	if err := s.CloseSend(); err != nil {
		return total, fmt.Errorf("close send: %w", err)
	}
	var extra []byte
	if err := s.RecvMsg(&extra); err != io.EOF {
		return total, fmt.Errorf("end of stream: got %v, want io.EOF", err)
	}
	return total, nil
}

// randomBody fills a prefix of buf, of random length 0..len(buf), with
// random bytes.
func randomBody(rng *rand.Rand, buf []byte) []byte {
	b := buf[:rng.IntN(len(buf)+1)]
	for i := 0; i < len(b); i += 8 {
		v := rng.Uint64()
		for j := i; j < i+8 && j < len(b); j++ {
			b[j] = byte(v)
			v >>= 8
		}
	}
	return b
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// h2cOnly is the protocols of h2c: HTTP/2 without TLS, with prior
// knowledge (no HTTP/1.1 upgrade).
func h2cOnly() *http.Protocols {
	p := new(http.Protocols)
	p.SetUnencryptedHTTP2(true)
	return p
}

// rawCodec is a gRPC codec for messages that are plain byte slices (a
// *[]byte), so the test needs no generated code.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return *b, nil
}

func (rawCodec) Unmarshal(data []byte, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	*b = append((*b)[:0], data...)
	return nil
}

func (rawCodec) Name() string { return "ntstack-raw" }

// watchedConn reports a connection's failures: any error of a Read or
// Write but a deadline (net/http and gRPC use deadlines to interrupt their
// own reads) or a call after Close, and with eofFails the end of the
// stream too (the clients' connections: the server never closes first).
type watchedConn struct {
	net.Conn
	eofFails bool
	closed   atomic.Bool
	failed   func(op string, err error)
	once     sync.Once
}

func watchConn(c net.Conn, eofFails bool, failed func(op string, err error)) *watchedConn {
	return &watchedConn{Conn: c, eofFails: eofFails, failed: failed}
}

func (c *watchedConn) check(op string, err error) {
	if err == nil || err == io.EOF && !c.eofFails || errors.Is(err, os.ErrDeadlineExceeded) || c.closed.Load() {
		return
	}
	if err == io.EOF {
		err = errors.New("closed by the server, which never closes first")
	}
	c.once.Do(func() { c.failed(op, err) })
}

func (c *watchedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.check("read", err)
	return n, err
}

func (c *watchedConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.check("write", err)
	return n, err
}

func (c *watchedConn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

// watchListener watches every connection it accepts.
type watchListener struct {
	net.Listener
	failed func(op string, err error)
}

func (l *watchListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return watchConn(c, false, l.failed), nil
}

// echoHandler answers a POST with its body and the body's SHA-256 in
// sumHeader. It reads the whole body first: HTTP/1.1 is not full duplex.
func echoHandler(w http.ResponseWriter, r *http.Request) {
	in, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, fmt.Sprintf("reading the body after %d B: %v", len(in), err), http.StatusBadRequest)
		return
	}
	sum := sha256.Sum256(in)
	w.Header().Set(sumHeader, hex.EncodeToString(sum[:]))
	w.Write(in)
}

// grpcEcho is the gRPC server's handler of every method: it echoes each
// message of the stream until the client's end of it.
func grpcEcho(_ any, s grpc.ServerStream) error {
	var msg []byte
	for {
		if err := s.RecvMsg(&msg); err == io.EOF {
			return nil
		} else if err != nil {
			return err
		}
		if err := s.SendMsg(&msg); err != nil {
			return err
		}
	}
}

// roleLoadServe is TestHTTPUnderLoad's server: HTTP/1.1, h2c and gRPC on
// three ports of an embedded endpoint, until the test lets it go; then it
// reports the connections that failed under it.
func roleLoadServe(ctl *childCtl, p childParams) error {
	ep, err := socklike.Open(linkName, socklike.Config{Fabric: shm.Options{Dir: p.Dir, Side: p.Side}, Logf: ctl.logf})
	if err != nil {
		return err
	}
	defer ep.Close()
	var mu sync.Mutex
	var resets []string
	failed := func(proto string) func(op string, err error) {
		return func(op string, err error) {
			mu.Lock()
			defer mu.Unlock()
			resets = append(resets, fmt.Sprintf("%s server: %s: %v", proto, op, err))
		}
	}
	lc := &socklike.ListenConfig{Endpoint: ep}
	listen := func(port int, proto string) (net.Listener, error) {
		ln, err := lc.Listen(context.Background(), "tcp", fmt.Sprintf(":%d", port))
		if err != nil {
			return nil, err
		}
		return &watchListener{Listener: ln, failed: failed(proto)}, nil
	}
	errLog := log.New(os.Stderr, "server: ", log.Lmicroseconds)
	h1 := &http.Server{Handler: http.HandlerFunc(echoHandler), ErrorLog: errLog}
	h2 := &http.Server{Handler: http.HandlerFunc(echoHandler), ErrorLog: errLog, Protocols: h2cOnly(),
		HTTP2: &http.HTTP2Config{MaxReadFrameSize: h2FrameSize, MaxReceiveBufferPerStream: h2Window, MaxReceiveBufferPerConnection: 8 * h2Window}}
	gs := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}), grpc.UnknownServiceHandler(grpcEcho),
		grpc.MaxRecvMsgSize(2*loadMaxBody), grpc.MaxSendMsgSize(2*loadMaxBody),
		grpc.InitialWindowSize(grpcWindow), grpc.InitialConnWindowSize(4*grpcWindow))
	serveErr := make(chan error, 3)
	for _, s := range []struct {
		port  int
		proto string
		serve func(net.Listener) error
	}{{loadPortHTTP1, "HTTP/1.1", h1.Serve}, {loadPortH2C, "h2c", h2.Serve}, {loadPortGRPC, "gRPC", gs.Serve}} {
		ln, err := listen(s.port, s.proto)
		if err != nil {
			return fmt.Errorf("listen %s on %d: %w", s.proto, s.port, err)
		}
		go func() { serveErr <- fmt.Errorf("%s server: %w", s.proto, s.serve(ln)) }()
	}
	ctl.emit(report{Ready: true})
	select {
	case <-ctl.quit:
	case err := <-serveErr:
		return err
	}
	h1.Close()
	h2.Close()
	gs.Stop()
	mu.Lock()
	defer mu.Unlock()
	ctl.emit(report{Resets: append([]string{}, resets...)})
	return nil
}

// startHog starts two busy processes per CPU, so that every core is
// saturated and the processes under test compete for it, and returns a
// function that stops them (cleanup stops them too).
func startHog(t *testing.T) (stop func()) {
	t.Helper()
	var hogs []*child
	for range 2 * runtime.NumCPU() {
		h := startChild(t, "hog", childParams{})
		require.True(t, h.next(30*time.Second).Ready, "a CPU hog process is spinning")
		hogs = append(hogs, h)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			for _, h := range hogs {
				h.finish(30 * time.Second)
			}
		})
	}
}

// roleHog spins until the test lets it go: a CPU hog.
func roleHog(ctl *childCtl, _ childParams) error {
	var stop atomic.Bool
	go func() {
		<-ctl.quit
		stop.Store(true)
	}()
	ctl.emit(report{Ready: true})
	var x uint64
	for !stop.Load() {
		for i := range 1 << 16 {
			x = x*6364136223846793005 + uint64(i)
		}
	}
	if x == 0 { // keeps the loop from being optimised away
		ctl.logf("hog: the generator reached zero")
	}
	return nil
}

// openSocklike attaches the test process to side of the link in dir as a
// socklike Endpoint over a device of its own, for fault injection; both
// close at cleanup, and the device's link changes go to the test log.
func openSocklike(t *testing.T, dir string, side shm.Side) (*socklike.Endpoint, *shm.Device) {
	t.Helper()
	logf := func(format string, args ...any) { t.Logf("parent: "+format, args...) }
	dev, err := shm.Open(linkName, shm.Options{Dir: dir, Side: side})
	require.NoError(t, err)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range dev.LinkEvents() {
			logf("%s: link %v at %s: %s", dev.Name(), ev.State, ev.Time.Format("15:04:05.000000"), ev.Reason)
		}
	}()
	t.Cleanup(func() { <-done })
	t.Cleanup(func() { require.NoError(t, dev.Close()) })
	ep, err := socklike.Attach(dev, socklike.Config{Logf: logf})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, ep.Close()) })
	return ep, dev
}
