// Package apiresource holds Resource, one resource the API server serves,
// as plain data: the kind cores plan watches and snapshots in terms of it
// and import this package, not the discovery client that fills it
// (pkg/discovery), so that they link no client-go transport
// (internal/layers TestCoresLinkNoTransport).
package apiresource

import "k8s.io/apimachinery/pkg/runtime/schema"

// Resource is one served resource.
type Resource struct {
	GVR        schema.GroupVersionResource
	Kind       string
	Namespaced bool
	// HasStatus reports a status subresource: status must then be written
	// through it, and (for parents) observedGeneration is meaningful.
	HasStatus bool
	Verbs     []string
}

// APIVersion returns group/version (or version for the core group).
func (r *Resource) APIVersion() string { return r.GVR.GroupVersion().String() }
