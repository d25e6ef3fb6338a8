package doctor

import (
	"fmt"
)

// checkAuth checks the host's identity: a key the daemons can load, and a
// pin or a CA for every peer. A host without a key that runs insecure is
// a warning that says so loudly; one that does not say insecure fails, as
// its daemons refuse to start.
func (h *host) checkAuth() Result {
	r := Result{Name: "auth"}
	cfg := h.opts.Config
	if cfg == nil {
		r.Status, r.Detail = Skip, "no host configuration"
		return r
	}
	keygen := fmt.Sprintf("ntmon keygen -host %s -out /etc/ntstack/%s.key, then set auth.key to that file and paste the printed key into each peer's peers.key for %s", cfg.Host, cfg.Host, cfg.Host)
	if !cfg.Secure() {
		if cfg.Auth.Insecure {
			r.Status, r.Detail, r.Fix = Warn, cfg.InsecureWarning(), keygen
			return r
		}
		r.Status, r.Detail, r.Fix = Fail, "no host key (auth.key) and auth.insecure not set: ntmon and ntproxy refuse to start", keygen
		return r
	}
	a, err := cfg.HostAuth()
	if err != nil {
		r.Status, r.Detail = Fail, err.Error()
		r.Fix = "check auth.key (ntmon keygen writes one, mode 0600), auth.ca and every peers.key"
		return r
	}
	pinned := 0
	for _, p := range cfg.Peers {
		if p.Key != "" {
			pinned++
		}
	}
	r.Status = Pass
	r.Detail = fmt.Sprintf("TLS 1.3 to every peer; this host's key %s; %d of %d peers pinned", a.Pin(), pinned, len(cfg.Peers))
	if cfg.Auth.CA != "" {
		r.Detail += ", the others through rack CA " + cfg.Auth.CA
	}
	return r
}
