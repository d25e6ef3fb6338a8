// Package workload holds the rack-scale integration workloads: programs
// that exercise a transport the way real applications do and check every
// byte that comes back. They are transport-agnostic: a server takes a
// net.Listener and a client takes a dial function with the signature of
// net.Dialer.DialContext, so the same run can go over ntstack's socklike
// connections and over plain TCP for comparison.
//
// The workloads:
//
//   - KV, a key-value server speaking RESP2 (the Redis protocol) with a
//     strict, bounded, fuzzed request parser;
//   - RunYCSB, a YCSB-style load (workloads A and B, scrambled zipfian key
//     choice) driven through github.com/redis/go-redis/v9 against any
//     RESP2 server, verifying every value it reads;
//   - FileServer and RunHTTP, net/http serving and fetching deterministic
//     pseudorandom files, comparing each body with the file's bytes;
//   - Recorder, the bounded latency histogram they all report with.
//
// Concurrency contract: KV and FileServer are safe for concurrent use; Serve
// may be called from several goroutines with different listeners, and
// Close may be called from any goroutine, more than once. Close closes the
// listeners and every open connection and returns when the connection
// goroutines have ended; Serve then returns nil. RunYCSB and RunHTTP start
// their own goroutines and return only after all of them have ended and
// every connection they opened is closed. A Recorder is not safe for
// concurrent use: give each goroutine its own and Merge them at the end.
//
// Lifetime pitfalls: KV stores the byte slices its parser allocated for a
// command (they are never reused), so a value is immutable once stored and
// replies are written without holding a lock. Expired keys are removed
// lazily, when a command touches them. FileServer keeps every file in
// memory for its lifetime (the sizes given to NewFileServer, summed).
package workload
