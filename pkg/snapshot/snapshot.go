// Package snapshot defines the observed-state snapshot protocol: the
// watcher's informer caches answer "what does parent P of controller C look
// like now, with its children and related objects" for the dispatcher
// (before calling hooks) and the applier (before writing). Over NATS it is a
// request/reply micro service on bus.SnapshotSubject; in one process the same
// Source is called directly.
package snapshot

import (
	"context"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/bus"
)

// Request asks for the observed state of one parent.
type Request struct {
	Controller bus.ControllerRef `json:"controller"`
	ParentUID  string            `json:"parentUID"`
	// MinResourceVersions maps "<group>/<resource>" to a resourceVersion the
	// answer must reflect (the version that triggered the work).
	MinResourceVersions map[string]string `json:"minResourceVersions,omitempty"`
	// Related carries the parent's customize-hook rules: the answer then
	// includes the related objects, and the watcher starts resyncing the
	// parent when one of them changes.
	Related *bus.RelatedRules `json:"related,omitempty"`
	// MapKey asks for one map key of a keyed kind's parent (MapController):
	// the answer holds the parent, the key's input (Input) and only the
	// outputs tagged with the key (Children). "" asks for the parent as a
	// whole: for a keyed kind that is the parent and its Summary, with no
	// children at all (a parent may have thousands of outputs; nothing
	// that needs the whole parent needs them on the bus).
	MapKey string `json:"mapKey,omitempty"`
}

// Result codes.
const (
	// OK: the snapshot is complete and at least as fresh as requested.
	OK = "ok"
	// NotFound: the parent does not exist (any more), or the controller is
	// not served by this installation.
	NotFound = "notFound"
	// ControllerGone: the controller object was deleted. Its finalizer may
	// still be on the parent.
	ControllerGone = "controllerGone"
	// Retry: the cache has not caught up yet (or is still syncing); ask again
	// shortly.
	Retry = "retry"
	// Invalid: the controller cannot be served (e.g. its resources are not
	// served by the API server); Message says why.
	Invalid = "invalid"
)

// Group is the observed objects of one declared child (or related)
// resource.
type Group struct {
	APIVersion string `json:"apiVersion"`
	Resource   string `json:"resource"`
	Kind       string `json:"kind"`
	Namespaced bool   `json:"namespaced"`
	// Objects are the children the hook is shown: owned ones that match
	// the parent's selector, plus Adopt.
	Objects []*unstructured.Unstructured `json:"objects"`
	// Adopt are orphans (also in Objects) that match the selector and must
	// be adopted before acting on the hook's answer.
	Adopt []*unstructured.Unstructured `json:"adopt,omitempty"`
	// Release are owned objects that no longer match the selector: the
	// parent must let go of them.
	Release []*unstructured.Unstructured `json:"release,omitempty"`
}

// Response is the observed state of a parent.
type Response struct {
	Result  string `json:"result"`
	Message string `json:"message,omitempty"`
	// Controller is the controller object as the watcher sees it.
	Controller *unstructured.Unstructured `json:"controllerObject,omitempty"`
	Parent     *unstructured.Unstructured `json:"parent,omitempty"`
	// ParentResource is the parent's resource name and scope.
	ParentResource  string `json:"parentResource,omitempty"`
	ParentHasStatus bool   `json:"parentHasStatus,omitempty"`
	// SelectorError says why the parent's selector cannot be used (the
	// sync must fail with it); children are then only the owned ones.
	SelectorError string `json:"selectorError,omitempty"`
	// Children has one group per declared child resource, in spec order,
	// holding the children the parent controls.
	Children []Group `json:"children,omitempty"`
	// Related has one group per related-resource rule.
	Related []Group `json:"related,omitempty"`
	// MapKey echoes the request's map key.
	MapKey string `json:"mapKey,omitempty"`
	// Input is the key's input object when it exists and the parent
	// selects it; nil for a detached key (its input is gone or no longer
	// selected), whose outputs are then a tombstone's business.
	Input *unstructured.Unstructured `json:"input,omitempty"`
	// Summary is what a keyed kind computes from the watcher's caches for
	// the parent as a whole (MapController: its aggregated status), in
	// answer to a request without a map key. nil for other kinds.
	Summary map[string]any `json:"summary,omitempty"`
}

// Source answers snapshot requests.
type Source interface {
	Snapshot(ctx context.Context, req Request) (*Response, error)
}

// Fetch asks src until it answers something other than Retry, waiting
// between attempts, for at most wait in total. A Retry after that is
// returned as is.
func Fetch(ctx context.Context, src Source, req Request, wait time.Duration) (*Response, error) {
	deadline := time.Now().Add(wait)
	delay := 20 * time.Millisecond
	for {
		resp, err := src.Snapshot(ctx, req)
		if err != nil {
			return nil, err
		}
		left := time.Until(deadline)
		if resp.Result != Retry || left <= 0 {
			return resp, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(min(delay, left)):
		}
		if delay < 500*time.Millisecond {
			delay *= 2
		}
	}
}

// GroupOf is an empty group of a resolved resource: every group a snapshot
// holds starts so, with an empty list rather than null, so that a hook
// request lists every declared type.
func GroupOf(res *apiresource.Resource) Group {
	return Group{
		APIVersion: res.APIVersion(),
		Resource:   res.GVR.Resource,
		Kind:       res.Kind,
		Namespaced: res.Namespaced,
		Objects:    []*unstructured.Unstructured{},
	}
}
