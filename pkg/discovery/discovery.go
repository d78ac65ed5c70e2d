// Package discovery keeps a map of the API server's resources (group,
// version, resource, kind, scope, subresources), refreshed periodically and
// on demand, so controllers can name resources by apiVersion + resource or
// apiVersion + kind. The entries are apiresource.Resource values: the
// cores that plan with them import that leaf, not this client.
package discovery

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metabus/metabus/pkg/apiresource"
)

// Map is a snapshot of discovery, safe for concurrent use.
type Map struct {
	client Source

	mu         sync.RWMutex
	byResource map[string]*apiresource.Resource // apiVersion + "/" + resource
	byKind     map[string]*apiresource.Resource // apiVersion + "/" + kind
	refreshed  time.Time

	// refreshMu serializes refreshes; lastForced rate-limits on-demand ones.
	refreshMu  sync.Mutex
	lastForced time.Time
}

// New returns an empty map of what client lists (APIServer: the API
// server's discovery); call Refresh or Run.
func New(client Source) *Map {
	return &Map{client: client, byResource: map[string]*apiresource.Resource{}, byKind: map[string]*apiresource.Resource{}}
}

// Refresh reloads discovery. A partial failure (one aggregated API down)
// keeps what was discovered and reports the error.
func (m *Map) Refresh(ctx context.Context) error {
	m.refreshMu.Lock()
	defer m.refreshMu.Unlock()
	lists, err := m.client.ServerResources(ctx)
	var partial *PartialError
	if err != nil && !errors.As(err, &partial) {
		return fmt.Errorf("discovery: %w", err)
	}
	byResource, byKind := index(lists)
	m.mu.Lock()
	m.byResource, m.byKind, m.refreshed = byResource, byKind, time.Now()
	m.mu.Unlock()
	if err != nil {
		return fmt.Errorf("partial discovery: %w", err)
	}
	return nil
}

func index(lists []*metav1.APIResourceList) (map[string]*apiresource.Resource, map[string]*apiresource.Resource) {
	byResource := map[string]*apiresource.Resource{}
	byKind := map[string]*apiresource.Resource{}
	for _, list := range lists {
		if list == nil {
			continue
		}
		gv, err := schema.ParseGroupVersion(list.GroupVersion)
		if err != nil {
			continue
		}
		subs := map[string]bool{}
		for _, r := range list.APIResources {
			if base, sub, ok := strings.Cut(r.Name, "/"); ok && sub == "status" {
				subs[base] = true
			}
		}
		for _, r := range list.APIResources {
			if strings.Contains(r.Name, "/") {
				continue
			}
			res := &apiresource.Resource{
				GVR:        gv.WithResource(r.Name),
				Kind:       r.Kind,
				Namespaced: r.Namespaced,
				HasStatus:  subs[r.Name],
				Verbs:      r.Verbs,
			}
			byResource[list.GroupVersion+"/"+r.Name] = res
			byKind[list.GroupVersion+"/"+r.Kind] = res
		}
	}
	return byResource, byKind
}

// Run refreshes every interval until ctx is done.
func (m *Map) Run(ctx context.Context, interval time.Duration, onError func(error)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := m.Refresh(ctx); err != nil && onError != nil {
				onError(err)
			}
		}
	}
}

// Get finds a resource by apiVersion and plural resource name.
func (m *Map) Get(apiVersion, resource string) (*apiresource.Resource, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	r, ok := m.byResource[apiVersion+"/"+resource]
	return r, ok
}

// GetKind finds a resource by apiVersion and kind.
func (m *Map) GetKind(apiVersion, kind string) (*apiresource.Resource, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	r, ok := m.byKind[apiVersion+"/"+kind]
	return r, ok
}

// Resolve is Get, refreshing discovery once (at most every 2s) on a miss, so
// a controller created right after its CRD does not wait for the next
// periodic refresh.
func (m *Map) Resolve(ctx context.Context, apiVersion, resource string) (*apiresource.Resource, error) {
	if r, ok := m.Get(apiVersion, resource); ok {
		return r, nil
	}
	if err := m.forceRefresh(ctx); err != nil {
		return nil, err
	}
	if r, ok := m.Get(apiVersion, resource); ok {
		return r, nil
	}
	return nil, fmt.Errorf("resource %q in %q is not served by the API server", resource, apiVersion)
}

// ResolveKind is GetKind with the same on-demand refresh.
func (m *Map) ResolveKind(ctx context.Context, apiVersion, kind string) (*apiresource.Resource, error) {
	if r, ok := m.GetKind(apiVersion, kind); ok {
		return r, nil
	}
	if err := m.forceRefresh(ctx); err != nil {
		return nil, err
	}
	if r, ok := m.GetKind(apiVersion, kind); ok {
		return r, nil
	}
	return nil, fmt.Errorf("kind %q in %q is not served by the API server", kind, apiVersion)
}

func (m *Map) forceRefresh(ctx context.Context) error {
	m.refreshMu.Lock()
	recent := time.Since(m.lastForced) < 2*time.Second
	if !recent {
		m.lastForced = time.Now()
	}
	m.refreshMu.Unlock()
	if recent {
		return nil
	}
	var partial *PartialError
	if err := m.Refresh(ctx); err != nil && !errors.As(err, &partial) {
		return err
	}
	return nil
}
