package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"mime"
	"slices"
	"strings"
	"sync"
	"time"

	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metabus/metabus/pkg/kubeapi"
)

// Source lists the resources the API server serves, one list per group
// version. A group version whose resources could not be listed (an
// aggregated API that is down) is left out and named in a *PartialError,
// returned with the lists that did load.
type Source interface {
	ServerResources(ctx context.Context) ([]*metav1.APIResourceList, error)
}

// SourceFunc is a function serving as a Source.
type SourceFunc func(ctx context.Context) ([]*metav1.APIResourceList, error)

// ServerResources calls f.
func (f SourceFunc) ServerResources(ctx context.Context) ([]*metav1.APIResourceList, error) {
	return f(ctx)
}

// PartialError names the group versions whose resources could not be
// listed, and why.
type PartialError struct {
	Failed map[schema.GroupVersion]error
}

func (e *PartialError) Error() string {
	gvs := slices.SortedFunc(maps.Keys(e.Failed), func(a, b schema.GroupVersion) int {
		return strings.Compare(a.String(), b.String())
	})
	msgs := make([]string, 0, len(gvs))
	for _, gv := range gvs {
		msgs = append(msgs, fmt.Sprintf("%s: %v", gv, e.Failed[gv]))
	}
	return "unable to list the resources of " + strings.Join(msgs, "; ")
}

// requestTimeout bounds each discovery request, as client-go's discovery
// client's default timeout did: one hanging aggregated API must not hold
// up every refresh (and every Resolve waiting for it) forever.
const requestTimeout = 30 * time.Second

// Discovery document media types. The aggregated form
// (apidiscovery.k8s.io/v2, Kubernetes 1.30+) has every group's resources
// in the answers to /api and /apis; older API servers answer those with
// the plain APIVersions and APIGroupList, whose resources take a request
// per group version.
const (
	acceptAggregated = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
	acceptPlain      = "application/json"
)

// APIServer is the Source of the API server behind API: its discovery
// documents, read as client-go's discovery client reads them (the
// aggregated form when served, else /api, /apis and every group version),
// without client-go's discovery package, which imports the scheme of
// every API group.
type APIServer struct {
	API *kubeapi.Client
	// plain asks for the unaggregated documents only (tests compare both).
	plain bool
}

// ServerResources lists the resources of every served group version.
func (s APIServer) ServerResources(ctx context.Context) ([]*metav1.APIResourceList, error) {
	var lists []*metav1.APIResourceList
	var gvs []schema.GroupVersion // to list one by one
	failed := map[schema.GroupVersion]error{}
	for _, root := range []string{"/api", "/apis"} {
		doc, err := s.root(ctx, root)
		if err != nil {
			return nil, err
		}
		lists = append(lists, doc.lists...)
		gvs = append(gvs, doc.gvs...)
		maps.Copy(failed, doc.failed)
	}
	byGV := make([]*metav1.APIResourceList, len(gvs))
	errs := make([]error, len(gvs))
	var wg sync.WaitGroup
	for i, gv := range gvs {
		wg.Go(func() { byGV[i], errs[i] = s.groupVersion(ctx, gv) })
	}
	wg.Wait()
	for i, gv := range gvs {
		if errs[i] != nil {
			failed[gv] = errs[i]
			continue
		}
		lists = append(lists, byGV[i])
	}
	if len(failed) > 0 {
		return lists, &PartialError{Failed: failed}
	}
	return lists, nil
}

// rootDoc is what /api or /apis said: the resources of the group versions
// it described (aggregated form) or the group versions to list.
type rootDoc struct {
	lists  []*metav1.APIResourceList
	gvs    []schema.GroupVersion
	failed map[schema.GroupVersion]error
}

// root reads /api or /apis. Not found or forbidden is no group at all, as
// for client-go (an API server without the legacy group, say).
func (s APIServer) root(ctx context.Context, path string) (rootDoc, error) {
	accept := acceptAggregated + "," + acceptPlain
	if s.plain {
		accept = acceptPlain
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	var contentType string
	raw, err := kubeapi.Answer(s.API.REST().Get().AbsPath(path).SetHeader("Accept", accept).Do(ctx).ContentType(&contentType))
	if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
		return rootDoc{}, nil
	}
	if err != nil {
		return rootDoc{}, fmt.Errorf("GET %s: %w", path, err)
	}
	if aggregated(contentType) {
		var list apidiscoveryv2.APIGroupDiscoveryList
		if err := json.Unmarshal(raw, &list); err != nil {
			return rootDoc{}, fmt.Errorf("decode %s: %w", path, err)
		}
		lists, failed := fromAggregated(list)
		return rootDoc{lists: lists, failed: failed}, nil
	}
	if path == "/api" {
		var versions metav1.APIVersions
		if err := json.Unmarshal(raw, &versions); err != nil {
			return rootDoc{}, fmt.Errorf("decode %s: %w", path, err)
		}
		var doc rootDoc
		for _, v := range versions.Versions {
			doc.gvs = append(doc.gvs, schema.GroupVersion{Version: v})
		}
		return doc, nil
	}
	var groups metav1.APIGroupList
	if err := json.Unmarshal(raw, &groups); err != nil {
		return rootDoc{}, fmt.Errorf("decode %s: %w", path, err)
	}
	var doc rootDoc
	for _, g := range groups.Groups {
		for _, v := range g.Versions {
			doc.gvs = append(doc.gvs, schema.GroupVersion{Group: g.Name, Version: v.Version})
		}
	}
	return doc, nil
}

// aggregated reports whether contentType is the aggregated discovery
// document (an API server that does not serve it answers plain JSON).
func aggregated(contentType string) bool {
	base, params, err := mime.ParseMediaType(contentType)
	return err == nil && base == "application/json" &&
		params["g"] == "apidiscovery.k8s.io" && params["v"] == "v2" && params["as"] == "APIGroupDiscoveryList"
}

// groupVersion lists the resources of gv.
func (s APIServer) groupVersion(ctx context.Context, gv schema.GroupVersion) (*metav1.APIResourceList, error) {
	path := "/apis/" + gv.Group + "/" + gv.Version
	if gv.Group == "" {
		path = "/api/" + gv.Version
	}
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	list := &metav1.APIResourceList{}
	if err := s.API.Get(ctx, list, path); err != nil {
		return nil, fmt.Errorf("GET %s: %w", path, err)
	}
	// Old API servers left the group version out.
	list.GroupVersion = gv.String()
	return list, nil
}

// fromAggregated turns the aggregated document into a resource list per
// group version. A group version marked stale (its aggregated API did not
// answer the API server) is failed, as in client-go. Resources and
// subresources without a kind are left out, as in client-go.
func fromAggregated(list apidiscoveryv2.APIGroupDiscoveryList) ([]*metav1.APIResourceList, map[schema.GroupVersion]error) {
	var lists []*metav1.APIResourceList
	failed := map[schema.GroupVersion]error{}
	for _, g := range list.Items {
		for _, v := range g.Versions {
			gv := schema.GroupVersion{Group: g.Name, Version: v.Version}
			if v.Freshness == apidiscoveryv2.DiscoveryFreshnessStale {
				failed[gv] = fmt.Errorf("the API server's discovery of %s is stale", gv)
				continue
			}
			out := &metav1.APIResourceList{GroupVersion: gv.String()}
			for _, r := range v.Resources {
				namespaced := r.Scope == apidiscoveryv2.ScopeNamespace
				if k := r.ResponseKind; k != nil && k.Kind != "" {
					out.APIResources = append(out.APIResources, metav1.APIResource{
						Name: r.Resource, SingularName: r.SingularResource, Namespaced: namespaced,
						Group: k.Group, Version: k.Version, Kind: k.Kind,
						Verbs: r.Verbs, ShortNames: r.ShortNames, Categories: r.Categories,
					})
				}
				for _, sub := range r.Subresources {
					if k := sub.ResponseKind; k != nil && k.Kind != "" {
						out.APIResources = append(out.APIResources, metav1.APIResource{
							Name: r.Resource + "/" + sub.Subresource, SingularName: r.SingularResource, Namespaced: namespaced,
							Group: k.Group, Version: k.Version, Kind: k.Kind, Verbs: sub.Verbs,
						})
					}
				}
			}
			lists = append(lists, out)
		}
	}
	return lists, failed
}
