package socklike

// Route is the path a connection took and why: "shm" (both ends on one host,
// shared memory), "ntb" (a rack peer over an NTB link), "rdma" or "tcp"
// (off the rack). A fallback nobody can see is the commonest complaint about
// socket-compatible stacks; every Conn says which path it is on.
type Route struct {
	Path   string
	Reason string
}

// Route returns the connection's path and the reason it was chosen.
func (c *Conn) Route() Route { return c.route }
