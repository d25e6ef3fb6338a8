package workload

import (
	"bufio"
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"math"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// KV is an in-memory key-value server speaking RESP2, enough of Redis for
// go-redis and the YCSB workload: PING, ECHO, GET, SET (EX, PX, NX, XX,
// KEEPTTL), DEL, EXISTS, INCR, INCRBY, DECR, DECRBY, MGET, MSET, DBSIZE,
// FLUSHALL, SELECT 0, CLIENT SETNAME/SETINFO/GETNAME/ID, COMMAND (minimal)
// and QUIT. HELLO is refused with a NOPROTO error, which makes clients
// that try RESP3 first (go-redis v9) fall back to RESP2.
//
// Each connection has its own goroutine with a buffered reader and writer;
// replies to pipelined requests are flushed together, when the reader has
// no more buffered input. The keyspace is split over numShards maps, each
// behind its own RWMutex; commands on several keys (MGET, MSET, DEL,
// EXISTS) lock the shards they touch in ascending order, so they are
// atomic as in Redis.
type KV struct {
	seed   maphash.Seed
	shards [numShards]shard

	commands  atomic.Uint64
	accepted  atomic.Uint64
	protoErrs atomic.Uint64
	nextID    atomic.Int64

	wg sync.WaitGroup // one per connection goroutine

	// mu protects the following fields.
	mu        sync.Mutex
	closed    bool
	listeners map[net.Listener]struct{}
	conns     map[net.Conn]struct{}
}

// numShards is the number of keyspace shards: a power of two, at most 64
// so a command's set of shards fits in a uint64 mask.
const numShards = 64

type shard struct {
	// mu protects m.
	mu sync.RWMutex
	m  map[string]entry
}

// entry is a stored value. val is never modified after it is stored (a
// SET or INCR stores a new slice), so readers may use it after unlocking.
type entry struct {
	val     []byte
	expires int64 // time.Now().UnixNano() deadline; 0: never
}

func (e entry) live(now int64) bool { return e.expires == 0 || now < e.expires }

// NewKV returns an empty KV server; call Serve to start it.
func NewKV() *KV {
	kv := &KV{
		seed:      maphash.MakeSeed(),
		listeners: make(map[net.Listener]struct{}),
		conns:     make(map[net.Conn]struct{}),
	}
	for i := range kv.shards {
		kv.shards[i].m = make(map[string]entry)
	}
	return kv
}

// KVStats are a KV server's counters since NewKV.
type KVStats struct {
	Conns          uint64 // connections accepted
	Commands       uint64 // commands answered, errors included
	ProtocolErrors uint64 // connections closed for malformed requests
}

// Stats returns the server's counters.
func (kv *KV) Stats() KVStats {
	return KVStats{
		Conns:          kv.accepted.Load(),
		Commands:       kv.commands.Load(),
		ProtocolErrors: kv.protoErrs.Load(),
	}
}

var errKVClosed = errors.New("kv server closed")

// Serve accepts connections on ln and serves each on its own goroutine
// until ln fails or Close is called. It returns nil after Close, and
// otherwise the error that stopped it; ln is closed either way.
func (kv *KV) Serve(ln net.Listener) error {
	kv.mu.Lock()
	if kv.closed {
		kv.mu.Unlock()
		ln.Close()
		return fmt.Errorf("kv serve: %w", errKVClosed)
	}
	kv.listeners[ln] = struct{}{}
	kv.mu.Unlock()
	defer func() {
		kv.mu.Lock()
		delete(kv.listeners, ln)
		kv.mu.Unlock()
		ln.Close()
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			if kv.isClosed() {
				return nil
			}
			return fmt.Errorf("kv serve: accept: %w", err)
		}
		kv.mu.Lock()
		if kv.closed {
			kv.mu.Unlock()
			c.Close()
			return nil
		}
		kv.conns[c] = struct{}{}
		kv.wg.Add(1)
		kv.mu.Unlock()
		kv.accepted.Add(1)
		go kv.runConn(c)
	}
}

func (kv *KV) isClosed() bool {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	return kv.closed
}

// Close closes every listener given to Serve and every open connection,
// and waits for the connection goroutines to end. It is idempotent; the
// stored keys stay readable by nobody and are dropped with the KV.
func (kv *KV) Close() error {
	kv.mu.Lock()
	kv.closed = true
	var errs []error
	for ln := range kv.listeners {
		if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, fmt.Errorf("kv close: listener %v: %w", ln.Addr(), err))
		}
	}
	for c := range kv.conns {
		c.Close() // the connection goroutine sees the error and ends
	}
	kv.mu.Unlock()
	kv.wg.Wait()
	return errors.Join(errs...)
}

// runConn serves one connection until it closes, sends QUIT or sends a
// malformed request.
func (kv *KV) runConn(c net.Conn) {
	defer kv.wg.Done()
	defer func() {
		kv.mu.Lock()
		delete(kv.conns, c)
		kv.mu.Unlock()
		c.Close()
	}()
	cs := &connState{id: kv.nextID.Add(1)}
	r := bufio.NewReaderSize(c, readBufSize)
	bw := bufio.NewWriterSize(c, writeBufSize)
	w := respWriter{bw}
	for {
		args, err := readCommand(r)
		if err != nil {
			var pe *ProtocolError
			if errors.As(err, &pe) {
				kv.protoErrs.Add(1)
				w.err("ERR Protocol error: " + pe.Msg)
				if bw.Flush() == nil {
					lingerClose(c)
				}
			}
			return // io.EOF, a closed connection or a protocol error
		}
		if len(args) == 0 {
			continue
		}
		kv.commands.Add(1)
		quit := kv.do(cs, w, args)
		if quit || r.Buffered() == 0 {
			if bw.Flush() != nil || quit {
				return
			}
		}
	}
}

// lingerMax bounds how long and how much lingerClose reads.
const (
	lingerTime  = time.Second
	lingerBytes = 1 << 20
)

// lingerClose prepares c, whose last reply is written, for closing while
// the peer may still be sending: closing a TCP socket with unread input
// sends a reset, which can destroy the reply before the peer reads it. It
// half-closes c if it can and reads and discards what the peer sends, up
// to lingerBytes or lingerTime, as net/http does before closing.
func lingerClose(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	if c.SetReadDeadline(time.Now().Add(lingerTime)) == nil {
		io.Copy(io.Discard, io.LimitReader(c, lingerBytes))
	}
}

// connState is the per-connection state commands may set.
type connState struct {
	id   int64
	name []byte
}

// upperName returns args[0] in ASCII upper case in buf, or nil if it is
// longer than buf: no command is.
func upperName(buf []byte, name []byte) []byte {
	if len(name) > len(buf) {
		return nil
	}
	for i, c := range name {
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		buf[i] = c
	}
	return buf[:len(name)]
}

// Reply texts shared with Redis, so clients that match on them work.
const (
	errSyntax     = "ERR syntax error"
	errNotInteger = "ERR value is not an integer or out of range"
	errOverflow   = "ERR increment or decrement would overflow"
)

func errArity(name []byte) string {
	return "ERR wrong number of arguments for '" + lowerASCII(name) + "' command"
}

func lowerASCII(b []byte) string {
	out := make([]byte, len(b))
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		out[i] = c
	}
	return string(out)
}

// do runs one command and writes its reply; it reports whether the
// connection should close after the reply (QUIT).
func (kv *KV) do(cs *connState, w respWriter, args [][]byte) (quit bool) {
	var nb [16]byte
	name := upperName(nb[:], args[0])
	argc := len(args)
	// arity checks argc against Redis's arity for the command: n means
	// exactly n, -n at least n.
	arity := func(n int) bool {
		if (n >= 0 && argc != n) || (n < 0 && argc < -n) {
			w.err(errArity(args[0]))
			return false
		}
		return true
	}
	switch string(name) {
	case "PING":
		switch argc {
		case 1:
			w.simple("PONG")
		case 2:
			w.bulk(args[1])
		default:
			w.err(errArity(args[0]))
		}
	case "ECHO":
		if arity(2) {
			w.bulk(args[1])
		}
	case "GET":
		if arity(2) {
			if v, ok := kv.get(args[1]); ok {
				w.bulk(v)
			} else {
				w.null()
			}
		}
	case "SET":
		if arity(-3) {
			kv.cmdSet(w, args)
		}
	case "DEL":
		if arity(-2) {
			w.int(kv.del(args[1:]))
		}
	case "EXISTS":
		if arity(-2) {
			w.int(kv.exists(args[1:]))
		}
	case "INCR":
		if arity(2) {
			kv.cmdIncr(w, args[1], 1)
		}
	case "DECR":
		if arity(2) {
			kv.cmdIncr(w, args[1], -1)
		}
	case "INCRBY", "DECRBY":
		if arity(3) {
			by, ok := parseInt64(args[2])
			if !ok {
				w.err(errNotInteger)
				break
			}
			if name[0] == 'D' {
				if by == math.MinInt64 {
					w.err("ERR decrement would overflow")
					break
				}
				by = -by
			}
			kv.cmdIncr(w, args[1], by)
		}
	case "MGET":
		if arity(-2) {
			vals := kv.mget(args[1:])
			w.array(len(vals))
			for _, v := range vals {
				if v == nil {
					w.null()
				} else {
					w.bulk(v)
				}
			}
		}
	case "MSET":
		if argc < 3 || argc%2 == 0 {
			w.err(errArity(args[0]))
			break
		}
		kv.mset(args[1:])
		w.simple("OK")
	case "DBSIZE":
		if arity(1) {
			w.int(kv.dbsize())
		}
	case "FLUSHALL", "FLUSHDB":
		if argc > 2 || (argc == 2 && !oneOf(args[1], "ASYNC", "SYNC")) {
			w.err(errSyntax)
			break
		}
		kv.flush()
		w.simple("OK")
	case "SELECT":
		if arity(2) {
			switch n, ok := parseInt64(args[1]); {
			case !ok:
				w.err(errNotInteger)
			case n != 0:
				w.err("ERR DB index is out of range")
			default:
				w.simple("OK")
			}
		}
	case "HELLO":
		// Not "unknown command": a HELLO-aware client reads NOPROTO as
		// "this server speaks RESP2 only" and carries on in RESP2.
		w.err("NOPROTO this server speaks RESP2 only")
	case "CLIENT":
		if arity(-2) {
			kv.cmdClient(cs, w, args)
		}
	case "COMMAND":
		switch {
		case argc == 1:
			w.array(0) // the command table is not described
		case oneOf(args[1], "COUNT"):
			w.int(int64(len(commandNames)))
		case oneOf(args[1], "DOCS", "INFO"):
			w.array(0)
		default:
			w.err("ERR unknown subcommand '" + printable(args[1], 128) + "'")
		}
	case "QUIT":
		w.simple("OK")
		return true
	default:
		w.err(unknownCommand(args))
	}
	return false
}

// commandNames is what COMMAND COUNT counts.
var commandNames = []string{
	"PING", "ECHO", "GET", "SET", "DEL", "EXISTS", "INCR", "DECR", "INCRBY",
	"DECRBY", "MGET", "MSET", "DBSIZE", "FLUSHALL", "FLUSHDB", "SELECT",
	"HELLO", "CLIENT", "COMMAND", "QUIT",
}

func unknownCommand(args [][]byte) string {
	s := "ERR unknown command '" + printable(args[0], 128) + "', with args beginning with:"
	for _, a := range args[1:min(len(args), 4)] {
		s += " '" + printable(a, 128) + "'"
	}
	return s
}

// printable returns b, truncated to n bytes, with bytes that would break
// an error line (CR, LF and other controls) replaced by '?'.
func printable(b []byte, n int) string {
	out := make([]byte, min(len(b), n))
	for i := range out {
		c := b[i]
		if c < ' ' || c == 0x7f {
			c = '?'
		}
		out[i] = c
	}
	return string(out)
}

// oneOf reports whether b equals one of the upper-case words, ignoring
// ASCII case.
func oneOf(b []byte, words ...string) bool {
	var nb [16]byte
	u := upperName(nb[:], b)
	for _, w := range words {
		if string(u) == w {
			return true
		}
	}
	return false
}

func (kv *KV) cmdClient(cs *connState, w respWriter, args [][]byte) {
	switch {
	case oneOf(args[1], "SETNAME") && len(args) == 3:
		cs.name = args[2]
		w.simple("OK")
	case oneOf(args[1], "SETINFO") && len(args) == 4:
		w.simple("OK") // library name and version: accepted, not kept
	case oneOf(args[1], "GETNAME") && len(args) == 2:
		if cs.name == nil {
			w.null()
		} else {
			w.bulk(cs.name)
		}
	case oneOf(args[1], "ID") && len(args) == 2:
		w.int(cs.id)
	case oneOf(args[1], "SETNAME", "SETINFO", "GETNAME", "ID"):
		w.err(errSyntax)
	default:
		w.err("ERR unknown subcommand '" + printable(args[1], 128) + "'")
	}
}

// setOptions are SET's parsed options.
type setOptions struct {
	ttl     time.Duration // 0: none
	nx, xx  bool
	keepTTL bool
}

// parseSetOptions parses SET's options after key and value. It returns a
// Redis error reply text on failure.
func parseSetOptions(opts [][]byte) (setOptions, string) {
	var o setOptions
	expireSet := false
	for i := 0; i < len(opts); i++ {
		switch {
		case oneOf(opts[i], "NX") && !o.xx:
			o.nx = true
		case oneOf(opts[i], "XX") && !o.nx:
			o.xx = true
		case oneOf(opts[i], "KEEPTTL") && !expireSet:
			o.keepTTL, expireSet = true, true
		case oneOf(opts[i], "EX", "PX") && !expireSet && i+1 < len(opts):
			n, ok := parseInt64(opts[i+1])
			if !ok {
				return o, errNotInteger
			}
			unit := time.Second
			if oneOf(opts[i], "PX") {
				unit = time.Millisecond
			}
			if n <= 0 || n > math.MaxInt64/int64(unit) {
				return o, "ERR invalid expire time in 'set' command"
			}
			o.ttl, expireSet = time.Duration(n)*unit, true
			i++
		default:
			return o, errSyntax
		}
	}
	return o, ""
}

func (kv *KV) cmdSet(w respWriter, args [][]byte) {
	o, e := parseSetOptions(args[3:])
	if e != "" {
		w.err(e)
		return
	}
	if kv.set(args[1], args[2], o) {
		w.simple("OK")
	} else {
		w.null() // NX or XX condition not met
	}
}

func (kv *KV) cmdIncr(w respWriter, key []byte, by int64) {
	n, e := kv.incr(key, by)
	if e != "" {
		w.err(e)
		return
	}
	w.int(n)
}

// The keyspace.

func (kv *KV) shardOf(key []byte) int {
	return int(maphash.Bytes(kv.seed, key) % numShards)
}

// lockShards locks, in ascending order, every shard holding one of keys;
// for reading if !write. It returns the unlock function.
func (kv *KV) lockShards(keys [][]byte, write bool) (unlock func()) {
	var mask uint64
	for _, k := range keys {
		mask |= 1 << kv.shardOf(k)
	}
	for i := range numShards {
		if mask&(1<<i) != 0 {
			if write {
				kv.shards[i].mu.Lock()
			} else {
				kv.shards[i].mu.RLock()
			}
		}
	}
	return func() {
		for i := range numShards {
			if mask&(1<<i) != 0 {
				if write {
					kv.shards[i].mu.Unlock()
				} else {
					kv.shards[i].mu.RUnlock()
				}
			}
		}
	}
}

// lookupLocked returns key's live value; the caller holds its shard's
// lock, for reading at least.
func (kv *KV) lookupLocked(key []byte, now int64) (entry, bool) {
	e, ok := kv.shards[kv.shardOf(key)].m[string(key)]
	if !ok || !e.live(now) {
		return entry{}, false
	}
	return e, true
}

// get returns key's value; the caller may keep it (values are immutable).
func (kv *KV) get(key []byte) ([]byte, bool) {
	s := &kv.shards[kv.shardOf(key)]
	s.mu.RLock()
	e, ok := s.m[string(key)]
	s.mu.RUnlock()
	if !ok {
		return nil, false
	}
	if e.expires != 0 {
		if now := time.Now().UnixNano(); !e.live(now) {
			s.mu.Lock()
			if e, ok := s.m[string(key)]; ok && !e.live(now) {
				delete(s.m, string(key))
			}
			s.mu.Unlock()
			return nil, false
		}
	}
	return e.val, true
}

// set stores val under key as o says; it reports false if an NX or XX
// condition kept it from doing so.
func (kv *KV) set(key, val []byte, o setOptions) bool {
	s := &kv.shards[kv.shardOf(key)]
	now := time.Now().UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	old, exists := s.m[string(key)]
	exists = exists && old.live(now)
	if (o.nx && exists) || (o.xx && !exists) {
		return false
	}
	e := entry{val: val}
	switch {
	case o.ttl > 0:
		e.expires = now + int64(o.ttl)
	case o.keepTTL && exists:
		e.expires = old.expires
	}
	s.m[string(key)] = e
	return true
}

func (kv *KV) del(keys [][]byte) int64 {
	now := time.Now().UnixNano()
	defer kv.lockShards(keys, true)()
	var n int64
	for _, k := range keys {
		if _, ok := kv.lookupLocked(k, now); ok {
			n++
		}
		delete(kv.shards[kv.shardOf(k)].m, string(k))
	}
	return n
}

// exists counts the keys that exist, a key named twice counting twice.
func (kv *KV) exists(keys [][]byte) int64 {
	now := time.Now().UnixNano()
	defer kv.lockShards(keys, false)()
	var n int64
	for _, k := range keys {
		if _, ok := kv.lookupLocked(k, now); ok {
			n++
		}
	}
	return n
}

func (kv *KV) mget(keys [][]byte) [][]byte {
	now := time.Now().UnixNano()
	vals := make([][]byte, len(keys))
	defer kv.lockShards(keys, false)()
	for i, k := range keys {
		if e, ok := kv.lookupLocked(k, now); ok {
			vals[i] = e.val
		}
	}
	return vals
}

// mset stores key-value pairs kvs[0]=kvs[1], ...; MSET clears TTLs.
func (kv *KV) mset(kvs [][]byte) {
	keys := make([][]byte, 0, len(kvs)/2)
	for i := 0; i < len(kvs); i += 2 {
		keys = append(keys, kvs[i])
	}
	defer kv.lockShards(keys, true)()
	for i := 0; i < len(kvs); i += 2 {
		kv.shards[kv.shardOf(kvs[i])].m[string(kvs[i])] = entry{val: kvs[i+1]}
	}
}

// incr adds by to key's integer value (a missing key counts as 0), keeping
// its TTL, and returns the new value or a Redis error reply text.
func (kv *KV) incr(key []byte, by int64) (int64, string) {
	s := &kv.shards[kv.shardOf(key)]
	now := time.Now().UnixNano()
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.m[string(key)]
	var n int64
	if ok && old.live(now) {
		if n, ok = parseInt64(old.val); !ok {
			return 0, errNotInteger
		}
	} else {
		old = entry{}
	}
	if (by > 0 && n > math.MaxInt64-by) || (by < 0 && n < math.MinInt64-by) {
		return 0, errOverflow
	}
	n += by
	s.m[string(key)] = entry{val: strconv.AppendInt(nil, n, 10), expires: old.expires}
	return n, ""
}

// dbsize counts the live keys.
func (kv *KV) dbsize() int64 {
	now := time.Now().UnixNano()
	var n int64
	for i := range kv.shards {
		s := &kv.shards[i]
		s.mu.RLock()
		for _, e := range s.m {
			if e.live(now) {
				n++
			}
		}
		s.mu.RUnlock()
	}
	return n
}

func (kv *KV) flush() {
	for i := range kv.shards {
		s := &kv.shards[i]
		s.mu.Lock()
		s.m = make(map[string]entry)
		s.mu.Unlock()
	}
}

var _ io.Closer = (*KV)(nil)
