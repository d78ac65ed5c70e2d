package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"reflect"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/kubeapi"
	"github.com/metabus/metabus/pkg/ujson"
)

// maxAnswer bounds a hook's answer.
const maxAnswer = 8 << 20

// sync is one parent's: the hook called with what the cache holds, its
// answer applied.
func (f *floor) sync(ctx context.Context, key string) error {
	obj, exists, err := f.parents.Informer().GetIndexer().GetByKey(key)
	if err != nil {
		return err
	}
	if !exists {
		f.mu.Lock()
		delete(f.expect, key)
		f.mu.Unlock()
		return nil
	}
	parent, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return fmt.Errorf("cached parent is a %T", obj)
	}
	cc := f.cc.Load()
	if cc == nil {
		return nil // the controller's add event syncs every parent
	}
	if parent.GetDeletionTimestamp() != nil {
		return nil // no finalize hook: the garbage collector takes the children
	}
	observed := f.children.OwnedBy(string(parent.GetUID()))
	if !f.caughtUp(key, parent, observed) {
		return nil // the event that catches the cache up syncs it again
	}
	resp, err := f.call(ctx, cc, parent, observed)
	if err != nil {
		return err
	}
	return f.apply(ctx, key, cc, parent, observed, resp)
}

// caughtUp reports whether the cache holds the parent's last writes,
// forgetting them once it does.
func (f *floor) caughtUp(key string, parent *unstructured.Unstructured, observed []*unstructured.Unstructured) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.expect[key]
	if !ok {
		return true
	}
	rvs := make(map[string]string, len(observed))
	for _, c := range observed {
		rvs[c.GetName()] = c.GetResourceVersion()
	}
	if !caughtUp(e, parent.GetResourceVersion(), rvs, f.children.HasSeen) {
		return false
	}
	delete(f.expect, key)
	return true
}

// childAPIVersion is the child resource's apiVersion.
func (f *floor) childAPIVersion() string {
	return f.childGVR.GroupVersion().String()
}

// call POSTs the sync request, as upstream builds it, to the controller's
// sync webhook and decodes the answer.
func (f *floor) call(ctx context.Context, cc, parent *unstructured.Unstructured, observed []*unstructured.Unstructured) (*hookapi.CompositeSyncResponse, error) {
	url, _, _ := unstructured.NestedString(cc.Object, "spec", "hooks", "sync", "webhook", "url")
	if url == "" {
		return nil, fmt.Errorf("CompositeController %s has no sync webhook URL", f.ccName)
	}
	children := hookapi.NewObjectMap("", true)
	children.Ensure(f.childAPIVersion(), f.childKind)
	for _, c := range observed {
		if err := children.Add(c, true); err != nil {
			return nil, err
		}
	}
	body, err := f.enc.Encode(&hookapi.CompositeSyncRequest{
		Controller: cc,
		Parent:     parent,
		Children:   children.Map(),
	})
	if err != nil {
		return nil, fmt.Errorf("encode the sync request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := f.hook.Do(req)
	if err != nil {
		return nil, fmt.Errorf("sync hook: %w", err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(io.LimitReader(res.Body, maxAnswer+1))
	if err != nil {
		return nil, fmt.Errorf("sync hook: read the answer: %w", err)
	}
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("sync hook: %s", res.Status)
	}
	if len(data) > maxAnswer {
		return nil, fmt.Errorf("sync hook: answer larger than %d bytes", maxAnswer)
	}
	var resp hookapi.CompositeSyncResponse
	if err := hookapi.Decode(data, false, &resp); err != nil {
		return nil, err
	}
	return &resp, nil
}

// apply makes the writes the answer asks for and no other, and remembers
// them (expectation) for the parent's next sync.
func (f *floor) apply(ctx context.Context, key string, cc, parent *unstructured.Unstructured, observed []*unstructured.Unstructured, resp *hookapi.CompositeSyncResponse) error {
	ns, uid := parent.GetNamespace(), string(parent.GetUID())
	owner := ownerRef{apiVersion: parent.GetAPIVersion(), kind: parent.GetKind(), namespace: ns, name: parent.GetName(), uid: uid}
	generate, _, _ := unstructured.NestedBool(cc.Object, "spec", "generateSelector")
	byName := make(map[string]*unstructured.Unstructured, len(observed))
	for _, c := range observed {
		byName[c.GetName()] = c
	}
	e := expectation{children: map[string]string{}}
	var errs []error
	desired := make(map[string]bool, len(resp.Children))
	for _, d := range resp.Children {
		name := d.GetName()
		if d.GetAPIVersion() != f.childAPIVersion() || d.GetKind() != f.childKind {
			errs = append(errs, fmt.Errorf("child %s: a %s %s, the controller declares %s %s only", name, d.GetAPIVersion(), d.GetKind(), f.childAPIVersion(), f.childKind))
			continue
		}
		if n := d.GetNamespace(); n != "" && n != ns {
			errs = append(errs, fmt.Errorf("child %s: in namespace %s, not the parent's", name, n))
			continue
		}
		desired[name] = true
		want := withSelectorLabel(d.Object, uid, generate)
		var (
			rv  string
			err error
		)
		switch o := byName[name]; {
		case o == nil:
			rv, err = f.write(ctx, f.rc.Post().AbsPath(kubeapi.Path(f.childGVR, ns, "", "")...), newChild(want, owner))
		case childDiffers(o.Object, want):
			rv, err = f.write(ctx, f.rc.Put().AbsPath(kubeapi.Path(f.childGVR, ns, name, "")...), mergeChild(o.Object, want))
		default:
			continue
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("child %s: %w", name, err))
			continue
		}
		e.children[name] = rv
	}
	for name, o := range byName {
		if desired[name] {
			continue
		}
		// The UID precondition: never a child of the same name made since.
		pre := fmt.Appendf(nil, `{"kind":"DeleteOptions","apiVersion":"v1","preconditions":{"uid":%q}}`, string(o.GetUID()))
		err := f.rc.Delete().AbsPath(kubeapi.Path(f.childGVR, ns, name, "")...).SetHeader("Content-Type", "application/json").Body(pre).Do(ctx).Error()
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete child %s: %w", name, err))
			continue
		}
		e.children[name] = ""
	}

	status := desiredStatus(resp.Status, parent.GetGeneration())
	if !reflect.DeepEqual(parent.Object["status"], status) {
		body := maps.Clone(parent.Object)
		body["status"] = status
		rv, err := f.write(ctx, f.rc.Put().AbsPath(kubeapi.Path(f.parentGVR, ns, parent.GetName(), "status")...), body)
		switch {
		case err == nil:
			e.parentRV = rv
		case apierrors.IsConflict(err):
			// The parent changed since the cache's copy: its event
			// syncs it again (upstream ignores the conflict too).
		default:
			errs = append(errs, fmt.Errorf("status: %w", err))
		}
	}
	if e.parentRV != "" || len(e.children) > 0 {
		f.mu.Lock()
		f.expect[key] = e
		f.mu.Unlock()
	}
	return errors.Join(errs...)
}

// write sends obj as the body of req and returns the resourceVersion the
// API server answered with; the rest of the answer reaches the cache by
// the watch.
func (f *floor) write(ctx context.Context, req *rest.Request, obj map[string]any) (string, error) {
	body, err := ujson.Marshal(obj)
	if err != nil {
		return "", fmt.Errorf("encode: %w", err)
	}
	raw, err := kubeapi.Answer(req.SetHeader("Content-Type", "application/json").Body(body).Do(ctx))
	if err != nil {
		return "", err
	}
	var answer struct {
		Metadata struct {
			ResourceVersion string `json:"resourceVersion"`
		} `json:"metadata"`
	}
	if err := json.Unmarshal(raw, &answer); err != nil {
		return "", fmt.Errorf("decode the API server's answer: %w", err)
	}
	return answer.Metadata.ResourceVersion, nil
}
