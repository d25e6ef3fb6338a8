// Package test is ntstack's integration tier: tests that run two real
// processes over the emulated fabric (ntb/shm) and check what only a pair of
// processes can show — data integrity under load in both directions, a peer
// killed with SIGKILL, and the CPU cost of an idle pair.
//
// Tests hold connections to what TCP gives: HTTP/1.1, h2c and gRPC beside
// a CPU hog that saturates every core (TestHTTPUnderLoad; its duration is
// NTSTACK_LOAD_DURATION, default 60 s), 1 GiB across an embedded link
// forced down for 2 s (TestEmbeddedLinkDown) and across the NTB link under
// a direct-mode connection pulled for 2 s, which moves the connection to
// the fallback and back (TestRackDirectLinkDown), and
// ECONNRESET after a peer's crash, told apart from its orderly close
// (TestPeerCrashVsClose, TestKillPeer). make loadcheck runs TestStress and
// ntbench's TestRingManyConns ten times each beside the hog.
//
// The package holds only tests. The test binary is also the peer: TestMain
// re-executes it as a child process with NTSTACK_TEST_ROLE naming a role
// function and NTSTACK_TEST_PARAMS its JSON parameters. A child reports to
// the test on stdout (one JSON object per line), takes commands on stdin
// (one word per line; EOF means "finish and exit"), and logs to stderr,
// which the test copies into its log.
//
// Its files carry the build tag integration, so that go test ./... is the
// unit tier alone. Run it with `go test -tags integration -count=1 ./test/`
// (or `make test`); -short shrinks the stress test. NTSTACK_TEST_SEED overrides the seed of every random choice;
// the seed is logged so that a failure can be replayed.
//
// Concurrency and lifetime: the tests measure throughput, latency and CPU
// time, so none of them runs in parallel with another. Every child is tied
// to the test binary with a parent-death signal and killed and reaped by
// the test's cleanup, and every link file lives in a directory under
// /dev/shm unique to its test and removed at cleanup, so a failed or
// interrupted run leaves no process and no link behind.
package test
