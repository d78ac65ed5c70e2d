package jsbus

import (
	"net/http"
)

// LeaseGuard wraps the transport of a Kubernetes client whose writes are
// made by Consume handlers (the applier's): a mutating request whose
// context belongs to a handler whose partition lease no longer holds is
// refused before it is sent. It is the point of writing the lease is
// checked at, whatever the call site, and it sees the lease's end even in
// a context derived from the handler's (which learns of it only once the
// fence has run). Reads and requests of other contexts pass.
func LeaseGuard(rt http.RoundTripper) http.RoundTripper { return leaseGuard{rt} }

type leaseGuard struct{ rt http.RoundTripper }

func (g leaseGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
	default:
		if err := LeaseValid(req.Context()); err != nil {
			if req.Body != nil {
				_ = req.Body.Close()
			}
			return nil, err
		}
	}
	return g.rt.RoundTrip(req)
}
