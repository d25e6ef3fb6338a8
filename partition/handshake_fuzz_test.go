package partition

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/ntstack/ntstack/ntb"
	"github.com/ntstack/ntstack/ntb/ntbtest"
)

// Steps of FuzzHandshake: what the peer, the link or the layer above does
// between two looks of our side at the link.
const (
	hsOpSpad    = iota // the peer writes v into our scratchpad a%8 (0..3 are the handshake's)
	hsOpAnswer         // the peer answers as it should: echo our hello with epoch v (follower), ack our epoch (leader)
	hsOpFormat         // the peer formats its window
	hsOpCorrupt        // the peer writes byte v>>8 at 256a+v%256 of its window (header, ring controls, first ring header)
	hsOpLink           // the link goes down (v odd) or up
	hsOpFail           // the layer above fails the session
	hsOps
)

// hsOp encodes one step: operation op with argument a (a byte), value v.
func hsOp(op, a int, v uint16) []byte {
	return binary.LittleEndian.AppendUint16([]byte{byte(a*hsOps + op)}, v)
}

// hsMaxSteps bounds an execution. The fuzzer minimises every input it
// keeps at a cost that grows with the square of its length, so an input's
// bytes past what the target reads are cut at once, and what it reads
// stays short: 32 steps establish and end several sessions.
const hsMaxSteps = 32

// FuzzHandshake plays the peer of the scratchpad session handshake against
// one side of it (the leader or the follower), step by step, one step of
// 3 bytes (operation and argument, value) each followed by one look at the
// link (step).
// The peer controls its scratchpads and its window; the handshake must not
// panic, and must establish a session only when the handshake says so:
// the leader once the follower acknowledged the epoch it announced in
// answer to the hello it saw, the follower once the leader echoed its
// latest hello with a non-zero epoch — never on stale or guessed values —
// and only over a peer window whose header checks. With the link down
// there is no session.
func FuzzHandshake(f *testing.F) {
	cat := func(ops ...[]byte) []byte {
		var b []byte
		for _, o := range ops {
			b = append(b, o...)
		}
		return b
	}
	// The smallest window of one partition: rings of ring.MinSize. One
	// pair serves every execution, reset to zeros and the link up (fresh
	// pairs made the garbage collector the fuzzer's main cost).
	const window = 20 << 10
	layout, err := NewLayout(window, 1)
	if err != nil {
		f.Fatal(err)
	}
	// Follower (port 1): the leader formats and answers; then a new epoch.
	f.Add(uint8(1), cat(hsOp(hsOpFormat, 0, 0), hsOp(hsOpAnswer, 0, 5), hsOp(hsOpAnswer, 0, 6), hsOp(hsOpAnswer, 0, 0)))
	// Leader (port 0): a hello, the follower formats and acknowledges.
	f.Add(uint8(0), cat(hsOp(hsOpSpad, spadHello, 77), hsOp(hsOpFormat, 0, 0), hsOp(hsOpAnswer, 0, 0), hsOp(hsOpFail, 0, 0)))
	f.Add(uint8(0), cat(hsOp(hsOpSpad, spadHello, 77), hsOp(hsOpFormat, 0, 0), hsOp(hsOpAnswer, 0, 0),
		hsOp(hsOpLink, 0, 1), hsOp(hsOpLink, 0, 0), hsOp(hsOpSpad, spadHello, 78)))
	f.Add(uint8(1), cat(hsOp(hsOpSpad, spadEcho, 9), hsOp(hsOpSpad, spadEpoch, 3), hsOp(hsOpFormat, 0, 0)))                   // a guessed echo
	f.Add(uint8(1), cat(hsOp(hsOpFormat, 0, 0), hsOp(hsOpCorrupt, 0, 0x7f06), hsOp(hsOpAnswer, 0, 5)))                        // peer's partitions
	f.Add(uint8(1), cat(hsOp(hsOpFormat, 0, 0), hsOp(hsOpCorrupt, layout.DataOffset(0)/256, 0x0100), hsOp(hsOpAnswer, 0, 5))) // peer's first ring
	f.Add(uint8(3), cat(hsOp(hsOpFormat, 0, 0), hsOp(hsOpAnswer, 0, 5), hsOp(hsOpCorrupt, ctlBase/256, 0xff00)))              // follower, hello at every look
	da, db := ntbtest.NewPair(window)
	f.Fuzz(func(t *testing.T, role uint8, in []byte) {
		da.SetLink(ntb.LinkUp, "fuzz")
		for _, d := range []*ntbtest.Device{da, db} {
			for i := range 8 {
				_ = d.SetPeerScratchpad(i, 0)
			}
			d.ClearDoorbells(^uint64(0))
			clear(d.InboundWindow())
		}
		ours, peer := ntb.Device(da), db
		if role&1 != 0 {
			ours, peer = db, da
		}
		// role&2: hello again at every look (a timeout always passed), else
		// never after the first.
		hello := time.Hour
		if role&2 != 0 {
			hello = time.Nanosecond
		}
		l := &Link{dev: ours, cfg: Config{Partitions: 1, HelloTimeout: hello}, layout: layout, done: make(chan struct{})}
		h := &handshake{leader: ours.Port() == 0}
		defer l.end(h, ErrSessionEnded)
		told := func(i int) uint32 { v, _ := peer.Scratchpad(i); return v } // what our side wrote the peer
		seen := func(i int) uint32 { v, _ := ours.Scratchpad(i); return v } // what the peer wrote us
		look := func() {
			before := h.s
			up, err := l.step(h)
			if err != nil {
				t.Fatal(err)
			}
			if !up && (h.s != nil || h.nonce != 0 || h.epoch != 0 || h.lastHello != 0) {
				t.Fatalf("link down, handshake state %+v", *h)
			}
			if h.s == nil || h.s == before {
				return
			}
			if h.s.Err() != nil || h.s.Epoch == 0 {
				t.Fatalf("new session of epoch %#x, error %v", h.s.Epoch, h.s.Err())
			}
			if _, err := peerLayout(ours.OutboundWindow(), 1); err != nil {
				t.Fatalf("session over a peer window refused as %v", err)
			}
			if h.leader {
				if h.s.Epoch != h.epoch || seen(spadAck) != h.epoch || told(spadEpoch) != h.epoch || told(spadEcho) != h.lastHello || h.lastHello == 0 {
					t.Fatalf("leader established epoch %#x: announced %#x for hello %#x, acknowledged %#x", h.s.Epoch, told(spadEpoch), told(spadEcho), seen(spadAck))
				}
			} else if h.nonce == 0 || seen(spadEcho) != h.nonce || told(spadHello) != h.nonce || seen(spadEpoch) != h.s.Epoch || told(spadAck) != h.s.Epoch {
				t.Fatalf("follower established epoch %#x: hello %#x, echo %#x, epoch %#x, ack %#x", h.s.Epoch, h.nonce, seen(spadEcho), seen(spadEpoch), told(spadAck))
			}
		}
		look()
		for k := 0; len(in) >= 3 && k < hsMaxSteps; in, k = in[3:], k+1 {
			op, a, v := int(in[0])%hsOps, int(in[0])/hsOps, binary.LittleEndian.Uint16(in[1:])
			switch op {
			case hsOpSpad:
				_ = peer.SetPeerScratchpad(a%8, uint32(v))
			case hsOpAnswer:
				if h.leader {
					_ = peer.SetPeerScratchpad(spadAck, told(spadEpoch))
				} else {
					_ = peer.SetPeerScratchpad(spadEcho, told(spadHello))
					_ = peer.SetPeerScratchpad(spadEpoch, uint32(v))
				}
			case hsOpFormat:
				if err := layout.format(peer.InboundWindow()); err != nil {
					t.Fatal(err)
				}
			case hsOpCorrupt:
				w := peer.InboundWindow()
				w[(256*a+int(v%256))%len(w)] = byte(v >> 8)
			case hsOpLink:
				if v&1 != 0 {
					da.SetLink(ntb.LinkDown, "fuzz")
				} else {
					da.SetLink(ntb.LinkUp, "fuzz")
				}
			case hsOpFail:
				if h.s != nil {
					h.s.Fail(errors.New("fuzz"))
				}
			}
			look()
		}
	})
}
