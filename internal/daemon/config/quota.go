package config

// DefaultQuotaMemory is quota.memory when the file leaves it out: 1 GiB,
// the memory links of the default 64 applications of a user (two 4 MiB
// windows each, 512 MiB) and as much again for their direct links.
const DefaultQuotaMemory = 1 << 30

// NoLimit in a quota means no bound.
const NoLimit = -1

// Quota bounds what one local user's applications may hold together in
// their host's ntproxy (the [quota] table).
type Quota struct {
	// Memory is the window memory ntproxy grants one user's applications
	// together, in bytes: their memory links (two proxy.app_window each)
	// and their direct links (two proxy.direct_window each). Shared pools
	// are bounded per application by proxy.pool_slots instead. -1: no
	// bound. Root is not bounded unless UID names it: it is trusted with
	// everything.
	Memory int64 `toml:"memory"`
	// UID sets the bound of particular users ([[quota.uid]] tables).
	UID []UIDQuota `toml:"uid"`
}

// UIDQuota is one user's bound.
type UIDQuota struct {
	UID    int   `toml:"uid"`
	Memory int64 `toml:"memory"` // bytes, -1: no bound
}

// MemoryOf returns the window memory uid's applications may hold
// together, or NoLimit.
func (q Quota) MemoryOf(uid int) int64 {
	for _, u := range q.UID {
		if u.UID == uid {
			return u.Memory
		}
	}
	if uid == 0 {
		return NoLimit
	}
	return q.Memory
}

func (q *Quota) setDefaults() {
	if q.Memory == 0 {
		q.Memory = DefaultQuotaMemory
	}
}

func (q Quota) validate(bad func(string, ...any)) {
	if q.Memory < NoLimit {
		bad("quota.memory %d: want bytes, or -1 for no bound", q.Memory)
	}
	seen := map[int]bool{}
	for i, u := range q.UID {
		if u.UID < 0 {
			bad("quota.uid[%d].uid %d: want a uid", i, u.UID)
		}
		if seen[u.UID] {
			bad("quota.uid[%d].uid %d: listed twice", i, u.UID)
		}
		seen[u.UID] = true
		if u.Memory < NoLimit {
			bad("quota.uid[%d].memory %d: want bytes, or -1 for no bound", i, u.Memory)
		}
	}
}
