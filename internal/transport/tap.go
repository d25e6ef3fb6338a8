package transport

import "fmt"

// Taps: packet capture at the frame level. A tap sees every frame the
// endpoint writes into a ring and every frame it takes off one, at the
// single places where that happens (Conn.serveOnce's send, the loose-frame
// sends of state.sendLoose and state.flushCtl, and state.pollLocked), so
// internal/daemon/capture can write them to a pcapng file for Wireshark.
//
// Cost: with no tap, each of those places loads one atomic pointer and
// finds it nil. With taps, every frame calls each tap synchronously on the
// data path (from application goroutines, workers and the poller, often
// with a ring lock held), so a tap must be quick and must never block: copy
// what it wants, hand it to a goroutine of its own through a bounded
// queue, and drop (and count) what does not fit.
//
// Order: a ring's frames of one direction are tapped in ring order, except
// that a loose frame (REFUSE, CREDIT, a CLOSE answering a stale ACCEPT) is
// tapped just after its send returns and may swap places with a frame sent
// concurrently on the same ring by another goroutine.

// TapDir is the direction of a tapped frame.
type TapDir uint8

const (
	TapTX TapDir = iota // this endpoint wrote the frame into its peer's ring
	TapRX               // this endpoint took the frame off its own ring
)

func (d TapDir) String() string {
	switch d {
	case TapTX:
		return "tx"
	case TapRX:
		return "rx"
	}
	return fmt.Sprintf("TapDir(%d)", uint8(d))
}

// TapControl is TapRecord.Ring for a frame on the control ring (CREDIT).
const TapControl = -1

// FrameKind is the kind of a frame, from the top 4 bits of its ring tag
// (see the table in frame.go).
type FrameKind uint8

const (
	FrameOpen   FrameKind = kindOpen
	FrameAccept FrameKind = kindAccept
	FrameRefuse FrameKind = kindRefuse
	FrameData   FrameKind = kindData
	FrameFin    FrameKind = kindFin
	FrameClose  FrameKind = kindClose
	FrameCredit FrameKind = kindCredit
	FrameMove   FrameKind = kindMove
	FrameWant   FrameKind = kindWant
	FrameResume FrameKind = kindResume
	FrameReset  FrameKind = kindReset
)

var frameKindNames = [...]string{
	FrameOpen: "OPEN", FrameAccept: "ACCEPT", FrameRefuse: "REFUSE", FrameData: "DATA",
	FrameFin: "FIN", FrameClose: "CLOSE", FrameCredit: "CREDIT", FrameMove: "MOVE",
	FrameWant: "WANT", FrameResume: "RESUME", FrameReset: "RESET",
}

func (k FrameKind) String() string {
	if int(k) < len(frameKindNames) && frameKindNames[k] != "" {
		return frameKindNames[k]
	}
	return fmt.Sprintf("FrameKind(%d)", uint8(k))
}

// TapRecord is one tapped frame.
type TapRecord struct {
	Dir  TapDir
	Ring int // data partition index, or TapControl
	Kind FrameKind
	// Conn is the connection id in the frame's tag: the id at the frame's
	// receiver (for OPEN, the dialer's id). A peer may write any 20-bit
	// value.
	Conn uint32
	// Local is the id of this endpoint's connection the frame belongs to,
	// 0 when there is none: a received OPEN (the connection does not exist
	// yet), a REFUSE sent, a CLOSE answering an ACCEPT for a dial given up.
	Local uint32
	// Payload is the frame's payload. It aliases ring memory or the
	// writer's buffer: read it during the call only, never modify it, and
	// copy what must outlive the call.
	Payload []byte
}

// tapSet is an immutable set of taps; adding or removing one swaps in a new
// set.
type tapSet struct {
	taps []*tapEntry
}

type tapEntry struct{ fn func(TapRecord) }

// AddTap calls fn for every frame the endpoint sends or receives from now
// on, until remove is called; any number of taps may be added. fn runs
// synchronously on the data path, concurrently from several goroutines: it
// must be safe for concurrent use, quick and non-blocking, and must not
// keep TapRecord.Payload (see TapRecord). remove is idempotent; a call of
// fn already under way when remove returns may still complete.
func (ep *Endpoint) AddTap(fn func(TapRecord)) (remove func()) {
	e := &tapEntry{fn: fn}
	ep.swapTaps(func(old []*tapEntry) []*tapEntry { return append(old[:len(old):len(old)], e) })
	return func() {
		ep.swapTaps(func(old []*tapEntry) []*tapEntry {
			out := make([]*tapEntry, 0, len(old))
			for _, o := range old {
				if o != e {
					out = append(out, o)
				}
			}
			return out
		})
	}
}

// swapTaps replaces the tap set with edit's result (nil when empty, so the
// data path's check stays a nil test).
func (ep *Endpoint) swapTaps(edit func([]*tapEntry) []*tapEntry) {
	for {
		old := ep.taps.Load()
		var cur []*tapEntry
		if old != nil {
			cur = old.taps
		}
		var next *tapSet
		if taps := edit(cur); len(taps) > 0 {
			next = &tapSet{taps: taps}
		}
		if ep.taps.CompareAndSwap(old, next) {
			return
		}
	}
}

// emit calls every tap with one frame. ring is a partition's Index; the
// control ring's (the last) becomes TapControl.
func (ts *tapSet) emit(st *state, dir TapDir, ring int, tag, local uint32, payload []byte) {
	kind, id := splitTag(tag)
	if ring >= len(st.parts) {
		ring = TapControl
	}
	r := TapRecord{Dir: dir, Ring: ring, Kind: FrameKind(kind), Conn: id, Local: local, Payload: payload}
	for _, t := range ts.taps {
		t.fn(r)
	}
}
