package applier

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/pkg/kubeapi"
	"github.com/metabus/metabus/pkg/ujson"
)

// rawClient makes the applier's hottest writes (child creates and updates,
// server-side applies, parent status updates) without decoding the API server's answer into an
// object: the applier needs at most the new resourceVersion from it, and
// decoding the whole object was 4% of the all-in-one's CPU while parents
// were being created (B1). Errors are the API server's Status errors, as
// from the dynamic client (apierrors.IsConflict and friends work).
type rawClient struct {
	rc rest.Interface
}

// newRawClient builds a raw client with the dynamic client's settings
// (kubeapi.NewREST).
func newRawClient(cfg *rest.Config) (*rawClient, error) {
	rc, err := kubeapi.NewREST(cfg)
	if err != nil {
		return nil, fmt.Errorf("raw REST client: %w", err)
	}
	return &rawClient{rc: rc}, nil
}

// create POSTs obj and returns the created object's identity: its UID and
// resourceVersion (the rest of the answer is not decoded).
func (r *rawClient) create(ctx context.Context, gvr schema.GroupVersionResource, namespace string, obj *unstructured.Unstructured) (written, error) {
	raw, err := r.post(ctx, gvr, namespace, obj, "")
	if err != nil {
		return written{}, err
	}
	return readWritten(raw, obj.GetName(), "create")
}

// post POSTs obj, as fieldManager if not "", and returns the answer
// undecoded. A POST never writes an object that exists: the name taken
// is an AlreadyExists error.
func (r *rawClient) post(ctx context.Context, gvr schema.GroupVersionResource, namespace string, obj *unstructured.Unstructured, fieldManager string) ([]byte, error) {
	body, err := ujson.Marshal(obj.Object)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", obj.GetName(), err)
	}
	req := r.rc.Post().AbsPath(kubeapi.Path(gvr, namespace, "", "")...)
	if fieldManager != "" {
		req = req.Param("fieldManager", fieldManager)
	}
	return kubeapi.Answer(req.SetHeader("Content-Type", "application/json").Body(body).Do(ctx))
}

// written is the identity of an object as a write left it.
type written struct {
	UID, ResourceVersion string
	Generation           int64
}

// readWritten reads the identity from the API server's answer to a write.
func readWritten(raw []byte, name, verb string) (written, error) {
	var w struct {
		Metadata struct {
			UID             string `json:"uid"`
			ResourceVersion string `json:"resourceVersion"`
			Generation      int64  `json:"generation"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &w); err != nil {
		return written{}, fmt.Errorf("read the answer to the %s of %s: %w", verb, name, err)
	}
	return written{UID: w.Metadata.UID, ResourceVersion: w.Metadata.ResourceVersion, Generation: w.Metadata.Generation}, nil
}

// apply sends a server-side apply (PATCH application/apply-patch+yaml,
// of which JSON is a subset) of body to the object name, with force, as
// upstream does: metabus owns what its hook returns, whoever set it
// before. With dryRun the API server only answers what it would store.
// The answer is returned undecoded.
func (r *rawClient) apply(ctx context.Context, gvr schema.GroupVersionResource, namespace, name string, body []byte, fieldManager string, dryRun bool) ([]byte, error) {
	req := r.rc.Patch(types.ApplyPatchType).AbsPath(kubeapi.Path(gvr, namespace, name, "")...).
		Param("fieldManager", fieldManager).Param("force", "true")
	if dryRun {
		req = req.Param("dryRun", metav1.DryRunAll)
	}
	return kubeapi.Answer(req.Body(body).Do(ctx))
}

// update PUTs obj (to subresource, if not "") and returns the
// resourceVersion the write produced.
func (r *rawClient) update(ctx context.Context, gvr schema.GroupVersionResource, obj *unstructured.Unstructured, subresource string) (string, error) {
	body, err := ujson.Marshal(obj.Object)
	if err != nil {
		return "", fmt.Errorf("encode %s: %w", obj.GetName(), err)
	}
	raw, err := kubeapi.Answer(r.rc.Put().AbsPath(kubeapi.Path(gvr, obj.GetNamespace(), obj.GetName(), subresource)...).
		SetHeader("Content-Type", "application/json").Body(body).Do(ctx))
	if err != nil {
		return "", err
	}
	w, err := readWritten(raw, obj.GetName(), "update")
	if err != nil {
		return "", err
	}
	return w.ResourceVersion, nil
}

// withResourceVersion is obj at resourceVersion rv: a copy sharing every
// field but metadata (obj is not modified). It stands for the API
// server's answer to a write of obj, which only the resourceVersion
// changes (and fields nobody reads here, such as managedFields).
func withResourceVersion(obj *unstructured.Unstructured, rv string) *unstructured.Unstructured {
	out := &unstructured.Unstructured{Object: maps.Clone(obj.Object)}
	if meta, ok := obj.Object["metadata"].(map[string]any); ok {
		out.Object["metadata"] = maps.Clone(meta)
	}
	out.SetResourceVersion(rv)
	return out
}

// withStatus is parent with status replaced, sharing every other field
// (parent is not modified): the body of a status update.
func withStatus(parent *unstructured.Unstructured, status map[string]any) *unstructured.Unstructured {
	out := &unstructured.Unstructured{Object: maps.Clone(parent.Object)}
	out.Object["status"] = status
	return out
}
