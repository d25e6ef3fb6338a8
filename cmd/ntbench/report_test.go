package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ntstack/ntstack/internal/prim/proc"
)

func TestFormatNs(t *testing.T) {
	for ns, want := range map[int64]string{
		0:             "0ns",
		170:           "170ns",
		999:           "999ns",
		1000:          "1.00µs",
		17_340:        "17.3µs",
		123_456:       "123µs",
		1_234_567:     "1.23ms",
		2_500_000_000: "2.50s",
	} {
		if got := formatNs(ns); got != want {
			t.Errorf("formatNs(%d) = %q, want %q", ns, got, want)
		}
	}
}

func TestFormatRate(t *testing.T) {
	for v, want := range map[float64]string{
		0.5:       "0.50",
		950:       "950",
		57_240:    "57.2k",
		1_234_000: "1.23M",
		5e9:       "5.00G",
	} {
		if got := formatRate(v); got != want {
			t.Errorf("formatRate(%v) = %q, want %q", v, got, want)
		}
	}
}

var (
	testHost = proc.Host{Hostname: "vm", CPUs: 2, CPUModel: "AMD EPYC", Kernel: "6.1.0"}

	tcpPingpong = result{
		Transport: "tcp", Mode: "pingpong", Size: 64, Conns: 1,
		P50: 17_300, P90: 19_000, P99: 25_100, P999: 60_200, Max: 1_200_000, Stalls: 3,
		MsgsPerS: 57_200, BytesPerS: 57_200 * 64, CPUPct: 98.5,
		Pin: "split", Count: 28_600, DurationNs: 500_000_000, GOMAXPROCS: 2, ReadBuf: 256 << 10, Host: testHost,
	}
	ntbPingpong = result{
		Transport: "ntb", Mode: "pingpong", Size: 64, Conns: 1,
		P50: 430, P90: 500, P99: 1255, P999: 9000, Max: 2_000_000, Stalls: 1,
		MsgsPerS: 2_000_000, BytesPerS: 2_000_000 * 64, CPUPct: 197,
		Pin: "split", Count: 100_000, DurationNs: 50_000_000, GOMAXPROCS: 2, Host: testHost,
	}
	tcpStream = result{
		Transport: "tcp", Mode: "stream", Size: 65536, Conns: 1,
		MsgsPerS: 80_000, BytesPerS: 80_000 * 65536, CPUPct: 160,
		Pin: "split", Count: 40_000, DurationNs: 500_000_000, GOMAXPROCS: 2, Host: testHost,
	}
	ntbStream = result{
		Transport: "ntb", Mode: "stream", Size: 65536, Conns: 1,
		MsgsPerS: 256_000, BytesPerS: 256_000 * 65536, CPUPct: 200,
		Pin: "split", Count: 100_000, DurationNs: 390_625_000, GOMAXPROCS: 2, Host: testHost,
	}
)

func TestTable(t *testing.T) {
	var out bytes.Buffer
	o := &options{pin: "split", conns: 1, warmup: 1000, count: 100_000, duration: 500 * time.Millisecond}
	r := &report{o: o, w: &out}
	r.begin(testHost, 2, 0, 1)
	for _, res := range []result{ntbPingpong, ntbStream, tcpPingpong, tcpStream} {
		r.add(res)
	}
	r.end()
	want := `host vm: 2 CPUs, AMD EPYC, kernel 6.1.0
pin=split (client on CPU 0, server on CPU 1), GOMAXPROCS 2
1 connection(s), each: 1000 warm-up msgs, then up to 100000 msgs or 500ms

transport mode        size conns      p50      p90      p99    p99.9      max stalls   msgs/s      MB/s   cpu%
ntb       pingpong      64     1    430ns    500ns   1.25µs   9.00µs   2.00ms      1    2.00M     128.0  197.0
ntb       stream     65536     1        -        -        -        -        -      -     256k   16777.2  200.0
tcp       pingpong      64     1   17.3µs   19.0µs   25.1µs   60.2µs   1.20ms      3    57.2k       3.7   98.5
tcp       stream     65536     1        -        -        -        -        -      -    80.0k    5242.9  160.0

against tcp in this run (pin=split):
  ntb pingpong 64: p50 40.2x lower than tcp, p99 20.0x lower than tcp, cpu per msg 0.06x tcp
  ntb stream 65536: throughput 3.20x tcp, cpu per msg 0.39x tcp
`
	if got := out.String(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}

	// Quiet: rows only.
	out.Reset()
	o.quiet = true
	r = &report{o: o, w: &out}
	r.begin(testHost, 2, 0, 1)
	r.add(tcpStream)
	r.add(ntbStream)
	r.end()
	if lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[0], "tcp ") {
		t.Errorf("quiet output:\n%s\nwant two rows", out.String())
	}
}

func TestJSON(t *testing.T) {
	var out bytes.Buffer
	r := &report{o: &options{json: true, pin: "split"}, w: &out}
	r.begin(testHost, 2, 0, 1)
	r.add(tcpPingpong)
	r.add(tcpStream)
	r.end()
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("want one line per result, got:\n%s", out.String())
	}
	var row map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &row); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"transport": "tcp", "mode": "pingpong", "size": 64.0, "conns": 1.0,
		"p50_ns": 17300.0, "p90_ns": 19000.0, "p99_ns": 25100.0, "p999_ns": 60200.0, "max_ns": 1.2e6,
		"stalls": 3.0, "msgs_per_s": 57200.0, "bytes_per_s": 57200.0 * 64, "cpu_pct": 98.5,
		"pin": "split", "count": 28600.0, "duration_ns": 5e8, "gomaxprocs": 2.0, "read_buf": 262144.0,
		"host": map[string]any{"hostname": "vm", "nproc": 2.0, "cpu_model": "AMD EPYC", "kernel": "6.1.0"},
	}
	for k, v := range want {
		if got, ok := row[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		} else if b1, b2 := mustJSON(t, got), mustJSON(t, v); b1 != b2 {
			t.Errorf("JSON %q = %s, want %s", k, b1, b2)
		}
	}
	for k := range row {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected JSON key %q", k)
		}
	}

	var back result
	if err := json.Unmarshal([]byte(lines[1]), &back); err != nil || back != tcpStream {
		t.Errorf("round trip = %+v, %v; want %+v", back, err, tcpStream)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestCompare(t *testing.T) {
	slow := tcpPingpong
	slow.Transport, slow.P50, slow.P99 = "slow", 2*tcpPingpong.P50, tcpPingpong.P99
	for _, tc := range []struct {
		res, tcp result
		want     string
	}{
		{ntbPingpong, tcpPingpong, "p50 40.2x lower than tcp, p99 20.0x lower than tcp, cpu per msg 0.06x tcp"},
		{slow, tcpPingpong, "p50 2.0x higher than tcp, p99 1.0x lower than tcp, cpu per msg 1.00x tcp"},
		{ntbStream, tcpStream, "throughput 3.20x tcp, cpu per msg 0.39x tcp"},
	} {
		if got := compare(tc.res, tc.tcp); got != tc.want {
			t.Errorf("compare(%s %s) = %q, want %q", tc.res.Transport, tc.res.Mode, got, tc.want)
		}
	}
}
