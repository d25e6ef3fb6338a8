package transport

import (
	"bytes"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWriteRoom checks that WriteRoom counts what the peer has not read
// against its window, and that a Write of that much does not wait for the
// peer to read.
func TestWriteRoom(t *testing.T) {
	a, b := endpoints(t, "ntbtest", Config{})
	c1, c2 := connPair(t, a, b, 7)
	defer c1.Close()
	defer c2.Close()
	room := c1.WriteRoom()
	require.Positive(t, room)
	msg := bytes.Repeat([]byte("x"), 1000)
	_, err := c1.Write(msg)
	require.NoError(t, err)
	require.Equal(t, room-int64(len(msg)), c1.WriteRoom(), "unread bytes count against the window")

	// The rest of the window goes without a reader.
	rest := make([]byte, c1.WriteRoom())
	_, err = c1.Write(rest)
	require.NoError(t, err)
	require.Zero(t, c1.WriteRoom())
	got := make([]byte, len(msg)+len(rest))
	_, err = io.ReadFull(c2, got)
	require.NoError(t, err)
	require.Equal(t, msg, got[:len(msg)])
}
