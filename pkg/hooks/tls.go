package hooks

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// secretRefresh is how long resolved Secret/ConfigMap material is reused before it is read
// again. Upstream reads it once per controller; re-reading picks up rotated certificates and
// tokens, while 30s keeps the API load negligible (the Secrets implementation normally reads
// an informer cache anyway).
const secretRefresh = 30 * time.Second

// endpointIdle is how long an unused endpoint (and its transport) is kept. Entries are keyed by
// a hash of their configuration, so every edit of a controller's TLS options leaves one behind.
const endpointIdle = 10 * time.Minute

// endpoint caches the resolved connection material for one (URL host, TLS/auth config).
type endpoint struct {
	// mu serialises refreshes, so a burst of calls reads the Secrets once.
	mu       sync.Mutex
	state    atomic.Pointer[resolvedEndpoint]
	lastUsed atomic.Int64 // unix nanoseconds
}

// resolvedEndpoint is immutable once published.
type resolvedEndpoint struct {
	client     *http.Client
	transport  *http.Transport // nil when the client's shared transport is used
	authHeader string          // "" for none
	hash       [sha256.Size]byte
	at         time.Time
}

// material is what the options resolve to, before it is turned into a transport.
type material struct {
	caPEM, certPEM, keyPEM []byte
	authHeader             string
}

func (m *material) hash() [sha256.Size]byte {
	h := sha256.New()
	for _, b := range [][]byte{m.caPEM, m.certPEM, m.keyPEM, []byte(m.authHeader)} {
		// Length-prefix each part so that no two different inputs hash alike.
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// newBaseTransport is the transport of hooks without custom TLS. A policy that does not allow
// everything checks every dial.
func newBaseTransport(dest *Destinations) *http.Transport {
	var t *http.Transport
	if dt, ok := http.DefaultTransport.(*http.Transport); ok {
		t = dt.Clone()
	} else {
		t = &http.Transport{Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true}
	}
	if !dest.AllowsAll() {
		// net/http's default dialer, checked.
		t.DialContext = dest.dialContext(&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second})
	}
	// Many workers call the same few hooks concurrently; Go's default of 2 idle connections
	// per host would make most calls open a new connection (and TLS handshake).
	t.MaxIdleConns = 256
	t.MaxIdleConnsPerHost = 64
	t.TLSClientConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	return t
}

// endpointFor returns the HTTP client and Authorization header for a call, resolving Secrets
// at most every secretRefresh.
func (c *Client) endpointFor(ctx context.Context, w *v1alpha1.Webhook, configs []v1alpha1.EndpointConfig, u *url.URL) (*resolvedEndpoint, error) {
	a, where := effectiveAuth(w, configs, u)
	target := u.Redacted()
	if a == nil {
		if err := c.checkInsecureCredentials(u, w, nil, where, target); err != nil {
			return nil, err
		}
		return c.plain, nil
	}
	if err := validateAuth(a); err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	// Both checks come before the endpoint cache: nothing is read or sent for a refused call,
	// and a cached endpoint cannot outlive a tightened policy.
	if err := c.checkNamespaces(a, where, target); err != nil {
		return nil, err
	}
	if err := c.checkInsecureCredentials(u, w, a, where, target); err != nil {
		return nil, err
	}
	cfg, err := json.Marshal(a)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	sum := sha256.Sum256(cfg)
	now := c.now()
	ep := c.endpoint(strings.ToLower(u.Host)+"|"+string(sum[:]), now)
	ep.lastUsed.Store(now.UnixNano())
	if r := ep.state.Load(); r != nil && now.Before(r.at.Add(secretRefresh)) {
		return r, nil
	}

	ep.mu.Lock()
	defer ep.mu.Unlock()
	old := ep.state.Load()
	if old != nil && now.Before(old.at.Add(secretRefresh)) {
		return old, nil // refreshed by a concurrent call
	}
	r, err := c.resolveEndpoint(ctx, a, old, now)
	if err != nil {
		if old == nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		// Keep calling with the last good material: a hiccup of the API server or a botched
		// rotation should not stop every sync. The error is retried after secretRefresh.
		c.log.Warn("cannot refresh hook TLS/auth material; keeping the previous one",
			zap.String("host", u.Host), zap.String("config", where), zap.Error(err))
		stale := *old
		stale.at = now
		ep.state.Store(&stale)
		return &stale, nil
	}
	if old != nil && old.transport != nil && old.transport != r.transport {
		old.transport.CloseIdleConnections()
	}
	ep.state.Store(r)
	return r, nil
}

// endpoint returns the cache entry of key, creating it (and evicting idle entries) if needed.
func (c *Client) endpoint(key string, now time.Time) *endpoint {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ep, ok := c.endpoints[key]; ok {
		return ep
	}
	for k, ep := range c.endpoints {
		if now.Sub(time.Unix(0, ep.lastUsed.Load())) > endpointIdle {
			if r := ep.state.Load(); r != nil && r.transport != nil {
				r.transport.CloseIdleConnections()
			}
			delete(c.endpoints, k)
		}
	}
	ep := &endpoint{}
	c.endpoints[key] = ep
	return ep
}

// resolveEndpoint reads the material and builds a client, reusing old's transport when the
// material has not changed so that its idle connections survive the refresh.
func (c *Client) resolveEndpoint(ctx context.Context, a *v1alpha1.WebhookAuth, old *resolvedEndpoint, now time.Time) (*resolvedEndpoint, error) {
	m, err := c.resolveMaterial(ctx, a)
	if err != nil {
		return nil, err
	}
	sum := m.hash()
	if old != nil && old.hash == sum {
		r := *old
		r.at = now
		return &r, nil
	}
	r := &resolvedEndpoint{client: c.plain.client, authHeader: m.authHeader, hash: sum, at: now}
	if len(m.caPEM) == 0 && len(m.certPEM) == 0 {
		return r, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if len(m.caPEM) > 0 {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(m.caPEM) {
			return nil, errors.New("caBundle: no valid PEM certificate found")
		}
		// Only the bundle is trusted, as upstream: the point of a caBundle is to pin the CA.
		tc.RootCAs = pool
	}
	if len(m.certPEM) > 0 {
		cert, err := tls.X509KeyPair(m.certPEM, m.keyPEM)
		if err != nil {
			// The tls errors describe the problem without echoing key material.
			return nil, fmt.Errorf("clientTLS: invalid certificate or key: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	t := c.baseTransport.Clone()
	t.TLSClientConfig = tc
	r.transport = t
	r.client = newHTTPClient(t)
	return r, nil
}
