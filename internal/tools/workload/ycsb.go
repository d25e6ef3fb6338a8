package workload

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// DialFunc dials a connection; net.Dialer.DialContext and socklike's
// dialer both have this signature.
type DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// ErrVerify marks a value or body that is not what the server was given:
// wrong length, wrong bytes, or a version no writer produced.
var ErrVerify = errors.New("verification failed")

// YCSBConfig configures RunYCSB.
type YCSBConfig struct {
	Dial     DialFunc // nil: a plain net.Dialer
	Addr     string   // the RESP2 server, "host:port" for Dial
	Records  int      // keys loaded, then chosen zipfian-distributed
	Clients  int      // concurrent clients in the run phase (and the load)
	Duration time.Duration
	Ops      int64  // run-phase operations, all clients together
	Workload string // "A" (50 % reads, 50 % updates) or "B" (95 % / 5 %)
	Seed     uint64 // seeds every client's choice of keys and operations
	// OpTimeout bounds each command's read and write; 0 means 10 s.
	OpTimeout time.Duration
}

// YCSBResult is what RunYCSB measured. Ops counts every operation of the
// run phase that was sent; Errors and VerifyErrors are those that failed
// or read a wrong value. Latencies are from sending a command to its
// reply, verification excluded.
type YCSBResult struct {
	Workload     string         `json:"workload"`
	Records      int            `json:"records"`
	Clients      int            `json:"clients"`
	LoadElapsed  time.Duration  `json:"load_ns"`
	Elapsed      time.Duration  `json:"elapsed_ns"`
	Ops          uint64         `json:"ops"`
	Reads        uint64         `json:"reads"`
	Updates      uint64         `json:"updates"`
	Errors       uint64         `json:"errors"`
	VerifyErrors uint64         `json:"verify_errors"`
	OpsPerSec    float64        `json:"ops_per_s"`
	Read         LatencySummary `json:"read"`
	Update       LatencySummary `json:"update"`
	All          LatencySummary `json:"all"`
}

// readProportion returns the share of reads in a YCSB core workload.
func readProportion(w string) (float64, bool) {
	switch strings.ToUpper(w) {
	case "A":
		return 0.50, true
	case "B":
		return 0.95, true
	}
	return 0, false
}

// defaultOpTimeout bounds one command when YCSBConfig.OpTimeout is 0.
const defaultOpTimeout = 10 * time.Second

// loadBatch is how many SETs a load-phase client pipelines at a time.
const loadBatch = 64

// RunYCSB loads cfg.Records keys into the RESP2 server at cfg.Addr and runs
// a YCSB core workload on them with cfg.Clients concurrent clients, until
// cfg.Ops operations or cfg.Duration, whichever comes first (at least one
// must be set), or ctx ends. It uses go-redis with cfg.Dial, RESP2 and no
// retries, so every failure is seen.
//
// Each key's value is f(key, version): its size is fixed per key (log-
// uniform from 8 B to 4 KiB), its first 4 bytes are the version, the rest
// is derived from key and version. Every GET is checked against that, and
// its version against the highest a writer has issued for the key.
//
// The result is filled in whenever the run started. The error is non-nil
// if the configuration is invalid, the load failed, ctx ended, or any
// operation failed (matching ErrVerify if a value was wrong); it names
// the first failure of each kind.
func RunYCSB(ctx context.Context, cfg YCSBConfig) (YCSBResult, error) {
	readProp, ok := readProportion(cfg.Workload)
	res := YCSBResult{Workload: strings.ToUpper(cfg.Workload), Records: cfg.Records, Clients: cfg.Clients}
	switch {
	case !ok:
		return res, fmt.Errorf("ycsb: workload %q: want A or B", cfg.Workload)
	case cfg.Records < 1 || cfg.Records > math.MaxUint32:
		return res, fmt.Errorf("ycsb: records %d: want 1 to %d", cfg.Records, uint32(math.MaxUint32))
	case cfg.Clients < 1:
		return res, fmt.Errorf("ycsb: clients %d: want at least 1", cfg.Clients)
	case cfg.Ops <= 0 && cfg.Duration <= 0:
		return res, errors.New("ycsb: neither ops nor duration set")
	case cfg.Addr == "":
		return res, errors.New("ycsb: no address")
	}
	dial := cfg.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	timeout := cfg.OpTimeout
	if timeout <= 0 {
		timeout = defaultOpTimeout
	}
	client := redis.NewClient(&redis.Options{
		Addr:          cfg.Addr,
		Dialer:        dial,
		Protocol:      2,
		MaxRetries:    -1, // none: errors surface
		DialerRetries: 1,  // one attempt: a failed dial surfaces too
		PoolSize:      cfg.Clients,
		DialTimeout:   timeout,
		ReadTimeout:   timeout,
		WriteTimeout:  timeout,
		PoolTimeout:   timeout,
	})
	defer client.Close()

	db := &ycsbKeys{versions: make([]atomic.Uint32, cfg.Records)}
	loadStart := time.Now()
	if err := db.load(ctx, client, cfg.Clients); err != nil {
		return res, fmt.Errorf("ycsb load: %w", err)
	}
	res.LoadElapsed = time.Since(loadStart)

	b := &budget{ctx: ctx, ops: cfg.Ops}
	zipf := NewZipfian(uint64(cfg.Records), ZipfianTheta)
	workers := make([]ycsbWorker, cfg.Clients)
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
		w.rng = rand.New(rand.NewPCG(cfg.Seed, uint64(i)))
		wg.Go(func() { w.run(ctx, b, client, db, zipf, readProp, &fails) })
	}
	wg.Wait()
	res.Elapsed = time.Since(start)

	var read, update, all Recorder
	for i := range workers {
		w := &workers[i]
		read.Merge(&w.read)
		update.Merge(&w.update)
		res.Errors += w.errors
		res.VerifyErrors += w.verifyErrors
	}
	all.Merge(&read)
	all.Merge(&update)
	res.Reads, res.Updates = read.Count(), update.Count()
	res.Ops = res.Reads + res.Updates
	res.Read, res.Update, res.All = read.Summary(), update.Summary(), all.Summary()
	if res.Elapsed > 0 {
		res.OpsPerSec = float64(res.Ops) / res.Elapsed.Seconds()
	}
	if err := fails.err(ctx, res.Errors, res.VerifyErrors); err != nil {
		return res, fmt.Errorf("ycsb run: %w", err)
	}
	return res, nil
}

// ycsbKeys is the keyspace the clients share: for each key, the highest
// version a writer has issued. A writer increments it before sending its
// SET, so a value read back may carry any version from 1 up to the count
// as it stands once the reply is in.
type ycsbKeys struct {
	versions []atomic.Uint32
}

// load writes version 1 of every key, clients splitting the keyspace.
func (db *ycsbKeys) load(ctx context.Context, client *redis.Client, clients int) error {
	n := len(db.versions)
	per := (n + clients - 1) / clients
	errs := make([]error, clients)
	var wg sync.WaitGroup
	for c := range clients {
		lo, hi := min(c*per, n), min((c+1)*per, n)
		wg.Go(func() {
			for i := lo; i < hi && errs[c] == nil; i += loadBatch {
				pipe := client.Pipeline()
				for k := i; k < min(i+loadBatch, hi); k++ {
					db.versions[k].Store(1)
					pipe.Set(ctx, ycsbKey(uint64(k)), ycsbValue(uint64(k), 1), 0)
				}
				if _, err := pipe.Exec(ctx); err != nil {
					errs[c] = fmt.Errorf("set keys %d to %d: %w", i, min(i+loadBatch, hi)-1, err)
				}
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// ycsbWorker is one run-phase client; only its goroutine touches it until
// RunYCSB's wait returns.
type ycsbWorker struct {
	rng                  *rand.Rand
	read, update         Recorder
	errors, verifyErrors uint64
}

func (w *ycsbWorker) run(ctx context.Context, b *budget, client *redis.Client, db *ycsbKeys, zipf *Zipfian, readProp float64, fails *failures) {
	for b.take() {
		k := zipf.Next(w.rng)
		key := ycsbKey(k)
		if w.rng.Float64() < readProp {
			start := time.Now()
			v, err := client.Get(ctx, key).Bytes()
			w.read.Record(time.Since(start))
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				w.errors++
				fails.op(fmt.Errorf("get %s: %w", key, err))
				continue
			}
			if err := checkYCSBValue(k, db.versions[k].Load(), v); err != nil {
				w.verifyErrors++
				fails.verify(fmt.Errorf("get %s: %w", key, err))
			}
			continue
		}
		ver := db.versions[k].Add(1)
		val := ycsbValue(k, ver)
		start := time.Now()
		err := client.Set(ctx, key, val, 0).Err()
		w.update.Record(time.Since(start))
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			w.errors++
			fails.op(fmt.Errorf("set %s: %w", key, err))
		}
	}
}

// ycsbKey names key k: "user" and 10 digits, as YCSB's keys look.
func ycsbKey(k uint64) string {
	b := make([]byte, 0, 14)
	b = append(b, "user"...)
	s := strconv.FormatUint(k, 10)
	for range 10 - len(s) {
		b = append(b, '0')
	}
	return string(append(b, s...))
}

// Value layout, for a key of size n (ycsbValueSize, 8 to 4096):
//
//	[0:4)    version, uint32 little-endian, ≥ 1
//	[4:n-4)  splitmix64 stream seeded by (key, version)
//	[n-4:n)  tag: low 32 bits of mix(key, version, n)
//
// A flipped byte anywhere changes the version (caught by the tag, and by
// the stream), the stream or the tag.
const (
	ycsbMinValue = 8
	ycsbMaxValue = 4096
	ycsbVerSize  = 4
	ycsbTagSize  = 4
)

// ycsbValueSize is key k's value size: log-uniform in [8, 4096], from a
// hash of k, so the same for every writer and reader.
func ycsbValueSize(k uint64) int {
	f := float64(mix64(k^0x5bd1e995)>>11) / (1 << 53) // [0, 1)
	return int(math.Round(ycsbMinValue * math.Exp2(f*math.Log2(ycsbMaxValue/ycsbMinValue))))
}

func ycsbValue(k uint64, ver uint32) []byte {
	v := make([]byte, ycsbValueSize(k))
	binary.LittleEndian.PutUint32(v, ver)
	fillStream(v[ycsbVerSize:len(v)-ycsbTagSize], mix64(k)^mix64(uint64(ver)+0x9e3779b97f4a7c15))
	binary.LittleEndian.PutUint32(v[len(v)-ycsbTagSize:], ycsbTag(k, ver, len(v)))
	return v
}

func ycsbTag(k uint64, ver uint32, n int) uint32 {
	return uint32(mix64(mix64(k) ^ uint64(ver)<<32 ^ uint64(n)))
}

// checkYCSBValue checks that v is key k's value at some version from 1 to
// maxVer; the error matches ErrVerify.
func checkYCSBValue(k uint64, maxVer uint32, v []byte) error {
	if want := ycsbValueSize(k); len(v) != want {
		return fmt.Errorf("value is %d bytes, want %d: %w", len(v), want, ErrVerify)
	}
	ver := binary.LittleEndian.Uint32(v)
	if tag := binary.LittleEndian.Uint32(v[len(v)-ycsbTagSize:]); tag != ycsbTag(k, ver, len(v)) {
		return fmt.Errorf("value tag %#x does not match version %d: %w", tag, ver, ErrVerify)
	}
	if ver < 1 || ver > maxVer {
		return fmt.Errorf("value version %d was never written (highest %d): %w", ver, maxVer, ErrVerify)
	}
	want := ycsbValue(k, ver)
	if !bytes.Equal(v, want) {
		i := 0
		for v[i] == want[i] {
			i++
		}
		return fmt.Errorf("value byte %d is %#02x, want %#02x (version %d): %w", i, v[i], want[i], ver, ErrVerify)
	}
	return nil
}

// mix64 is splitmix64's finalizer: a bijective 64-bit hash.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// fillStream fills b with the splitmix64 stream from seed.
func fillStream(b []byte, seed uint64) {
	s := seed
	for len(b) >= 8 {
		s += 0x9e3779b97f4a7c15
		binary.LittleEndian.PutUint64(b, mix64(s))
		b = b[8:]
	}
	if len(b) > 0 {
		s += 0x9e3779b97f4a7c15
		var last [8]byte
		binary.LittleEndian.PutUint64(last[:], mix64(s))
		copy(b, last[:])
	}
}

// budget hands out operations to a run's workers until ops have been
// handed out (if ops > 0) or ctx ends.
type budget struct {
	ctx    context.Context
	ops    int64
	issued atomic.Int64
}

func (b *budget) take() bool {
	if b.ctx.Err() != nil {
		return false
	}
	return b.ops <= 0 || b.issued.Add(1) <= b.ops
}

// failures keeps the first failure of each kind a run's workers report.
type failures struct {
	// mu protects the following fields.
	mu                  sync.Mutex
	firstOp, firstCheck error
}

func (f *failures) op(err error) {
	f.mu.Lock()
	if f.firstOp == nil {
		f.firstOp = err
	}
	f.mu.Unlock()
}

func (f *failures) verify(err error) {
	f.mu.Lock()
	if f.firstCheck == nil {
		f.firstCheck = err
	}
	f.mu.Unlock()
}

// err summarizes a finished run: nil if nothing failed and ctx is live.
func (f *failures) err(ctx context.Context, ops, checks uint64) error {
	var errs []error
	if checks > 0 {
		errs = append(errs, fmt.Errorf("%d failed verification, first: %w", checks, f.firstCheck))
	}
	if ops > 0 {
		errs = append(errs, fmt.Errorf("%d failed, first: %w", ops, f.firstOp))
	}
	if err := ctx.Err(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
