package workload

import (
	"bufio"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/ntstack/ntstack/internal/prim/waitfor"
)

func TestKVCommands(t *testing.T) {
	kv, addr := startKV(t, nil)
	c := newRedis(t, addr) // tries HELLO 3 first: the NOPROTO reply must make it fall back
	ctx := testCtx(t, 20*time.Second)

	require.Equal(t, "PONG", c.Ping(ctx).Val())
	require.Equal(t, "hi", c.Echo(ctx, "hi").Val())
	require.Equal(t, "hello", c.Do(ctx, "PING", "hello").Val())

	_, err := c.Get(ctx, "missing").Result()
	require.ErrorIs(t, err, redis.Nil)
	require.NoError(t, c.Set(ctx, "k", "v1", 0).Err())
	require.Equal(t, "v1", c.Get(ctx, "k").Val())
	bin := "\x00\r\n$3\r\nbinary\xff"
	require.NoError(t, c.Set(ctx, "bin", bin, 0).Err())
	require.Equal(t, bin, c.Get(ctx, "bin").Val())

	// SET options.
	ok, err := c.SetNX(ctx, "k", "v2", 0).Result()
	require.NoError(t, err)
	require.False(t, ok)
	ok, err = c.SetXX(ctx, "k", "v2", 0).Result()
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = c.SetXX(ctx, "nokey", "v", 0).Result()
	require.NoError(t, err)
	require.False(t, ok)
	require.NoError(t, c.Set(ctx, "ttl", "x", 40*time.Millisecond).Err()) // PX 40
	require.NoError(t, c.Set(ctx, "ttls", "x", 5*time.Second).Err())      // EX 5
	require.Equal(t, int64(2), c.Exists(ctx, "ttl", "ttls").Val())
	waitfor.True(t, "the 40 ms key to expire", func() bool { return c.Exists(ctx, "ttl").Val() == 0 })
	for _, bad := range [][]any{
		{"SET", "a", "b", "EX", "0"},
		{"SET", "a", "b", "EX", "x"},
		{"SET", "a", "b", "PX", "-5"},
		{"SET", "a", "b", "EX", "1", "PX", "1"},
		{"SET", "a", "b", "NX", "XX"},
		{"SET", "a", "b", "EX"},
		{"SET", "a", "b", "BOGUS"},
	} {
		require.Error(t, c.Do(ctx, bad...).Err(), "%v", bad)
	}

	// DEL, EXISTS, DBSIZE.
	require.NoError(t, c.MSet(ctx, "m1", "a", "m2", "b", "m3", "c").Err())
	require.Equal(t, []any{"a", nil, "c"}, c.MGet(ctx, "m1", "none", "m3").Val())
	require.Equal(t, int64(3), c.Exists(ctx, "m1", "m2", "m2").Val())
	require.Equal(t, int64(2), c.Del(ctx, "m1", "m2", "none").Val())
	require.Equal(t, int64(4), c.DBSize(ctx).Val()) // k, bin, ttls, m3
	// INCR family.
	require.Equal(t, int64(1), c.Incr(ctx, "n").Val())
	require.Equal(t, int64(11), c.IncrBy(ctx, "n", 10).Val())
	require.Equal(t, int64(10), c.Decr(ctx, "n").Val())
	require.Equal(t, int64(-5), c.DecrBy(ctx, "n", 15).Val())
	require.NoError(t, c.Set(ctx, "max", "9223372036854775807", 0).Err())
	require.ErrorContains(t, c.Incr(ctx, "max").Err(), "overflow")

	// Errors come back as Redis errors, and the connection goes on.
	err = c.Incr(ctx, "k").Err()
	require.ErrorContains(t, err, "ERR value is not an integer")
	var rerr redis.Error
	require.ErrorAs(t, err, &rerr)
	require.ErrorContains(t, c.Do(ctx, "NOSUCH", "x").Err(), "ERR unknown command 'NOSUCH'")
	require.ErrorContains(t, c.Do(ctx, "GET").Err(), "wrong number of arguments for 'get'")
	require.ErrorContains(t, c.Do(ctx, "SELECT", "1").Err(), "out of range")
	require.NoError(t, c.Do(ctx, "SELECT", "0").Err())
	require.Equal(t, "PONG", c.Ping(ctx).Val())

	require.NoError(t, c.FlushAll(ctx).Err())
	require.Equal(t, int64(0), c.DBSize(ctx).Val())
	require.Greater(t, kv.Stats().Commands, uint64(30))
	require.Equal(t, uint64(0), kv.Stats().ProtocolErrors)
}

// TestKVRaw speaks RESP over a plain TCP connection: pipelined requests,
// inline commands, HELLO, QUIT.
func TestKVRaw(t *testing.T) {
	_, addr := startKV(t, nil)
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
	_, err = io.WriteString(c, "*3\r\n$3\r\nSET\r\n$1\r\na\r\n$2\r\nxy\r\n"+
		"*2\r\n$3\r\nGET\r\n$1\r\na\r\n"+
		"PING\r\n"+
		"GET a\n"+
		"*2\r\n$5\r\nHELLO\r\n$1\r\n3\r\n"+
		"*1\r\n$4\r\nQUIT\r\n"+
		"PING\r\n") // never answered: QUIT closed the connection
	require.NoError(t, err)
	got, err := io.ReadAll(c)
	require.NoError(t, err)
	require.Equal(t, "+OK\r\n$2\r\nxy\r\n+PONG\r\n$2\r\nxy\r\n-NOPROTO this server speaks RESP2 only\r\n+OK\r\n", string(got))
}

func TestKVMalformed(t *testing.T) {
	kv, addr := startKV(t, nil)
	for i, tc := range []struct{ in, reply string }{
		{"*1\r\n$abc\r\n", "invalid bulk length"},
		{"*1\r\n$-1\r\n", "invalid bulk length"},
		{"*1\r\n$67108865\r\n", "invalid bulk length"},
		{"*x\r\n", "invalid multibulk length"},
		{"*1048577\r\n", "invalid multibulk length"},
		{"*+1\r\n", "invalid multibulk length"},
		{"*1\r\n:1\r\n", "expected '$', got \":\""},
		{"*1\r\n$1\r\nab\r\n", "bulk string not terminated by CRLF"},
		{"*1\r\n$1\n", "line not terminated by CRLF"},
		{strings.Repeat("A", readBufSize+10) + "\r\n", "line longer than"},
	} {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		require.NoError(t, c.SetDeadline(time.Now().Add(10*time.Second)))
		_, err = io.WriteString(c, tc.in)
		require.NoError(t, err)
		require.NoError(t, c.(*net.TCPConn).CloseWrite())
		got, err := io.ReadAll(c) // the server closes after the reply
		c.Close()
		require.NoError(t, err, "case %d", i)
		require.Equal(t, "-ERR Protocol error: "+tc.reply, strings.TrimSuffix(string(got), "\r\n")[:min(len(got)-2, 21+len(tc.reply))], "case %d", i)
		require.True(t, strings.HasSuffix(string(got), "\r\n"), "case %d: %q", i, got)
		require.Equal(t, 1, strings.Count(string(got), "\r\n"), "case %d: %q", i, got)
	}
	require.Equal(t, uint64(10), kv.Stats().ProtocolErrors)

	// The server goes on serving everyone else.
	c := newRedis(t, addr)
	require.Equal(t, "PONG", c.Ping(testCtx(t, 10*time.Second)).Val())
}

// TestKVLargeValue round-trips a value far larger than the buffers.
func TestKVLargeValue(t *testing.T) {
	_, addr := startKV(t, nil)
	c := newRedis(t, addr)
	ctx := testCtx(t, 20*time.Second)
	big := FileContent(3<<20+7, 1)
	require.NoError(t, c.Set(ctx, "big", big, 0).Err())
	got, err := c.Get(ctx, "big").Bytes()
	require.NoError(t, err)
	require.Equal(t, big, got)
}

func TestKVCloseLeavesNoGoroutines(t *testing.T) {
	check := checkGoroutines(t)
	ln := listen(t)
	kv := NewKV()
	served := make(chan error, 1)
	go func() { served <- kv.Serve(ln) }()

	// Open connections in every state: idle after a command, mid-command,
	// and through go-redis's pool.
	idle, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer idle.Close()
	_, err = io.WriteString(idle, "PING\r\n")
	require.NoError(t, err)
	line, err := bufio.NewReader(idle).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "+PONG\r\n", line)
	partial, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer partial.Close()
	_, err = io.WriteString(partial, "*2\r\n$3\r\nGET\r\n$100\r\nabc")
	require.NoError(t, err)
	rc := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), Dialer: tcpDial, MaxRetries: -1, DialerRetries: 1, Protocol: 2})
	require.NoError(t, rc.Set(t.Context(), "a", "b", 0).Err())

	require.NoError(t, kv.Close())
	require.NoError(t, <-served)
	require.NoError(t, kv.Close()) // idempotent
	require.Error(t, kv.Serve(listen(t)), "serve after close")

	// The server side is gone: clients see their connections closed.
	require.NoError(t, idle.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = idle.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF)
	rc.Close()
	idle.Close()
	partial.Close()
	check()
}
