package ivshmem

// msgKind is what one server message meant, as the decoder understood it.
type msgKind int

const (
	kindVersion    msgKind = iota // protocol version, no fd
	kindOwnID                     // the client's own id, no fd
	kindShm                       // -1 with the shared-memory fd
	kindPeerVector                // a peer's eventfd for vector .vector
	kindOwnVector                 // the client's own eventfd for vector .vector
	kindPeerGone                  // a peer disconnected, no fd
)

// decoded is one validated server message. complete is set on the last
// vector of a peer (kindPeerVector) and on the client's last own vector
// (kindOwnVector: the handshake is done).
type decoded struct {
	kind     msgKind
	peer     int
	vector   int
	complete bool
}

type decodeState int

const (
	stVersion decodeState = iota
	stOwnID
	stShm
	stHandshake // existing peers' vectors, then our own
	stRunning
	stBroken
)

// decoder checks the sequence of server messages against the protocol. It
// does no I/O and holds no fds: the caller reads a message, asks next what
// it means and does what it says with the fd (if any). After an error the
// decoder stays broken.
type decoder struct {
	vectors int
	state   decodeState
	self    int
	known   map[int]bool // peers with all vectors received
	cur     int          // peer whose vectors are arriving, -1 for none
	got     int          // vectors of cur received so far
}

func newDecoder(vectors int) *decoder {
	return &decoder{vectors: vectors, known: make(map[int]bool), cur: -1}
}

// next decodes one message: the int64 v and whether it came with an fd.
func (d *decoder) next(v int64, hasFD bool) (decoded, error) {
	m, err := d.step(v, hasFD)
	if err != nil {
		d.state = stBroken
	}
	return m, err
}

func (d *decoder) step(v int64, hasFD bool) (decoded, error) {
	switch d.state {
	case stVersion:
		if v != protocolVersion {
			return decoded{}, protoErr("protocol version %d, want %d", v, protocolVersion)
		}
		if hasFD {
			return decoded{}, protoErr("fd attached to the version message")
		}
		d.state = stOwnID
		return decoded{kind: kindVersion}, nil
	case stOwnID:
		if err := checkID(v, "own id"); err != nil {
			return decoded{}, err
		}
		if hasFD {
			return decoded{}, protoErr("fd attached to the own-id message")
		}
		d.self = int(v)
		d.state = stShm
		return decoded{kind: kindOwnID, peer: d.self}, nil
	case stShm:
		if v != shmMarker {
			return decoded{}, protoErr("got %d where the shared-memory message (-1) belongs", v)
		}
		if !hasFD {
			return decoded{}, protoErr("shared-memory message without an fd")
		}
		d.state = stHandshake
		return decoded{kind: kindShm}, nil
	case stHandshake, stRunning:
		if err := checkID(v, "peer id"); err != nil {
			return decoded{}, err
		}
		if hasFD {
			return d.vector(int(v))
		}
		return d.gone(int(v))
	default:
		return decoded{}, protoErr("message after an earlier error")
	}
}

func checkID(v int64, what string) error {
	if v < 0 || v >= MaxPeers {
		return protoErr("%s %d outside 0..%d", what, v, MaxPeers-1)
	}
	return nil
}

// vector handles a peer id with an fd: the next vector of a peer (or of
// the client itself during the handshake).
func (d *decoder) vector(id int) (decoded, error) {
	if d.cur >= 0 && id != d.cur {
		return decoded{}, protoErr("peer %d's vector arrived while peer %d had sent %d of %d", id, d.cur, d.got, d.vectors)
	}
	if d.cur < 0 {
		switch {
		case id == d.self && d.state == stRunning:
			return decoded{}, protoErr("own id %d announced as a new peer", id)
		case d.known[id]:
			return decoded{}, protoErr("peer %d announced twice (more than %d vectors)", id, d.vectors)
		}
		d.cur, d.got = id, 0
	}
	m := decoded{kind: kindPeerVector, peer: id, vector: d.got}
	if id == d.self {
		m.kind = kindOwnVector
	}
	d.got++
	if d.got == d.vectors {
		m.complete = true
		d.cur = -1
		if id == d.self {
			d.state = stRunning
		} else {
			d.known[id] = true
		}
	}
	return m, nil
}

// gone handles a peer id without an fd: a disconnect.
func (d *decoder) gone(id int) (decoded, error) {
	switch {
	case d.state == stHandshake:
		return decoded{}, protoErr("peer id %d without an fd during the handshake", id)
	case d.cur >= 0:
		return decoded{}, protoErr("disconnect of peer %d while peer %d had sent %d of %d vectors", id, d.cur, d.got, d.vectors)
	case id == d.self:
		return decoded{}, protoErr("disconnect of our own id %d", id)
	case !d.known[id]:
		return decoded{}, protoErr("disconnect of unknown peer %d", id)
	}
	delete(d.known, id)
	return decoded{kind: kindPeerGone, peer: id}, nil
}
