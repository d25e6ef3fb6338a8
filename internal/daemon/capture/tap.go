package capture

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ntstack/ntstack/internal/transport"
)

// QueueBytes bounds the payload bytes a Tap's queue holds: the queue has
// QueueBytes/snap entries (at least minQueue, at most maxQueue), so a
// reader that falls behind costs at most ~QueueBytes of memory, and frames
// beyond that are dropped and counted, never waited for.
const (
	QueueBytes = 8 << 20
	minQueue   = 64
	maxQueue   = 16384
)

// TapOptions configure a Tap.
type TapOptions struct {
	// Link names the link in the records (the pcapng interface).
	Link string
	// Leg marks the link as one between two ntproxies (FlagLeg).
	Leg bool
	// Conn, if not 0, keeps only the frames of the capturing endpoint's
	// connection with this id (transport.Conn.ID; TapRecord.Local). A
	// received OPEN belongs to no connection yet: an accepted
	// connection's capture starts at its ACCEPT.
	Conn uint32
	// Snap is the payload bytes kept per frame (0: DefaultSnap), within
	// [MinSnap, MaxSnap].
	Snap int
}

// Tap copies an endpoint's frames into a bounded queue.
type Tap struct {
	o       TapOptions
	ch      chan Record
	seen    atomic.Uint64 // frames that passed the filter
	dropped atomic.Uint64 // of those, lost to a full queue
	stopped atomic.Bool
	remove  func()
}

// StartTap taps ep until Stop.
func StartTap(ep *transport.Endpoint, o TapOptions) (*Tap, error) {
	if o.Snap == 0 {
		o.Snap = DefaultSnap
	}
	if o.Snap < MinSnap || o.Snap > MaxSnap {
		return nil, fmt.Errorf("start tap on %s: snap %d outside [%d, %d]", o.Link, o.Snap, MinSnap, MaxSnap)
	}
	t := &Tap{o: o, ch: make(chan Record, min(max(QueueBytes/o.Snap, minQueue), maxQueue))}
	t.remove = ep.AddTap(t.tap)
	return t, nil
}

// tap runs on the data path: filter, copy, queue or drop.
func (t *Tap) tap(r transport.TapRecord) {
	if t.stopped.Load() || (t.o.Conn != 0 && r.Local != t.o.Conn) {
		return
	}
	t.seen.Add(1)
	rec := Record{
		Time: time.Now(), Dir: r.Dir, Ring: r.Ring, Kind: r.Kind, Leg: t.o.Leg,
		Conn: r.Conn, Local: r.Local, Link: t.o.Link, Length: len(r.Payload),
		Payload: append([]byte(nil), r.Payload[:min(len(r.Payload), t.o.Snap)]...),
	}
	select {
	case t.ch <- rec:
	default:
		t.dropped.Add(1)
	}
}

// Records is the queue of tapped frames, oldest first. It is never closed.
func (t *Tap) Records() <-chan Record { return t.ch }

// Dropped is the number of frames lost so far to a full queue. Copy
// writes the drops counted since the previous record into the next one's
// drop count: a drop is placed within a few records of where it happened.
func (t *Tap) Dropped() uint64 { return t.dropped.Load() }

// Seen is the number of frames that passed the filter so far, dropped or
// not.
func (t *Tap) Seen() uint64 { return t.seen.Load() }

// Snap is the tap's snap length.
func (t *Tap) Snap() int { return t.o.Snap }

// Stop removes the tap from its endpoint; records already queued stay
// readable. Idempotent.
func (t *Tap) Stop() {
	t.stopped.Store(true)
	t.remove()
}

// Limits end a Copy.
type Limits struct {
	Count    int           // records written (0: no limit)
	Duration time.Duration // from the start of Copy (0: no limit)
}

// End says why a Copy ended.
type End string

const (
	EndCount    End = "count reached"
	EndDuration End = "duration elapsed"
	EndContext  End = "stopped" // ctx ended: the client went away or the daemon is closing
)

// Copy writes t's records to w until a limit is reached or ctx ends,
// flushing w (then calling flushed, if set) whenever the queue runs dry,
// so a reader at the far end of a stream sees frames promptly. It stops
// the tap and closes w (statistics) before it returns, except on a write
// error.
func Copy(ctx context.Context, t *Tap, w *Writer, lim Limits, flushed func()) (n int, end End, err error) {
	defer t.Stop()
	var timeout <-chan time.Time
	if lim.Duration > 0 {
		timer := time.NewTimer(lim.Duration)
		defer timer.Stop()
		timeout = timer.C
	}
	var reported uint64 // drops written into packets so far
	flush := func() error {
		if err := w.Flush(); err != nil {
			return err
		}
		if flushed != nil {
			flushed()
		}
		return nil
	}
	for {
		if lim.Count > 0 && n >= lim.Count {
			end = EndCount
			break
		}
		select {
		case <-timeout:
			end = EndDuration
		case <-ctx.Done():
			end = EndContext
		default:
		}
		if end != "" {
			break
		}
		var r Record
		select {
		case r = <-t.ch:
		default:
			if err := flush(); err != nil {
				return n, EndContext, err
			}
			select {
			case r = <-t.ch:
			case <-timeout:
				end = EndDuration
			case <-ctx.Done():
				end = EndContext
			}
		}
		if end != "" {
			break
		}
		d := t.Dropped()
		if err := w.Write(&r, d-reported); err != nil {
			return n, EndContext, err
		}
		reported = d
		n++
	}
	t.Stop()
	return n, end, w.Close(t.Dropped())
}
