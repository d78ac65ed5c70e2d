// Package render calls a controller's hook outside the bus, with the
// request metabus would send for a parent, and compares the answer with
// the state the parent and its children are in: what `metabus render`
// prints. It drives the controller's kind through the same seams as the
// dispatcher (kinds.Syncing: gate, hook choice, request building, answer
// decoding), makes the call through package hooks as the dispatcher does
// (hooks.Item), and judges the answer with the applier's merge (package
// apply), so a render shows what a sync would do.
//
// What it does not do: call the customize hook (related objects are not
// observed: the request lists none, and the result says so), render older
// revisions of a rolling update (only the parent as it is), or serve a
// MapController (whose hook is called per input object).
package render

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/discovery"
	"github.com/metabus/metabus/pkg/hooks"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/kindtable"
	"github.com/metabus/metabus/pkg/snapshot"
)

// Observer reads a parent's owned objects from somewhere (the cluster),
// one group per plan.Owned entry, as the watcher's caches would.
type Observer func(ctx context.Context, plan *kinds.WatchPlan, parentRes *discovery.Resource, parent *unstructured.Unstructured) ([]snapshot.Group, string, error)

// Input is one render.
type Input struct {
	Controller *unstructured.Unstructured
	Parent     *unstructured.Unstructured
	// Children are the observed children to show the hook (ignored with
	// Observe): each goes into the owned group of its apiVersion and kind.
	Children []*unstructured.Unstructured
	// Observe, if set, reads the observed children instead (--from-cluster).
	Observe Observer
	// Resolve resolves the controller's resources (API discovery, or
	// Offline).
	Resolve kinds.WatchResolver
	// HookURL, if set, replaces the URL of the hook called (a new hook
	// version, a local copy).
	HookURL string
	// Hooks makes the call.
	Hooks *hooks.Client
}

// Result is what a render found.
type Result struct {
	Controller string `json:"controller"`
	Parent     string `json:"parent"`
	// Hook is the hook kind called (sync, finalize), "" when none was.
	Hook string `json:"hook,omitempty"`
	// Skipped says why no hook was called.
	Skipped string `json:"skipped,omitempty"`
	// Requests are the bodies sent.
	Requests []json.RawMessage `json:"requests,omitempty"`
	// Desired is the answer as the dispatcher would publish it.
	Desired *bus.DesiredState `json:"desired,omitempty"`
	// Changes are what the applier would do with it.
	Changes Changes  `json:"changes"`
	Notes   []string `json:"notes,omitempty"`
}

// Changed reports whether the desired state differs from the observed one.
func (r *Result) Changed() bool { return r.Changes.Any() }

// Render makes one render.
func Render(ctx context.Context, in Input) (*Result, error) {
	c, err := kindtable.Decode(in.Controller)
	if err != nil {
		return nil, fmt.Errorf("controller: %w", err)
	}
	res := &Result{
		Controller: strings.ToLower(c.Ref().Kind) + "/" + c.Object().GetName(),
		Parent:     objectName(in.Parent),
	}
	plan, err := c.WatchPlan(in.Resolve)
	if err != nil {
		return nil, fmt.Errorf("controller %s: %w", res.Controller, err)
	}
	if plan.Keyed != nil {
		return nil, fmt.Errorf("%s: render does not serve keyed controllers (MapController calls its map hook once per input object)", res.Controller)
	}
	parentRes, err := parentResource(plan, in.Parent)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", res.Controller, err)
	}
	if !plan.Rules.Selects(in.Parent) {
		res.Notes = append(res.Notes, "the controller's selector does not select this parent: metabus would not sync it")
	}
	snap := &snapshot.Response{
		Result: snapshot.OK, Controller: in.Controller, Parent: in.Parent,
		ParentResource: parentRes.GVR.Resource, ParentHasStatus: parentRes.HasStatus,
	}
	if in.Observe != nil {
		if snap.Children, snap.SelectorError, err = in.Observe(ctx, plan, parentRes, in.Parent); err != nil {
			return nil, err
		}
	} else {
		var extra []string
		snap.Children, extra = groupChildren(plan.Owned, in.Children)
		for _, e := range extra {
			res.Notes = append(res.Notes, "ignored "+e+": not a child resource of the controller")
		}
	}
	gate, err := c.SyncGate(snap)
	if err != nil {
		return nil, fmt.Errorf("the sync would fail before any hook call: %w", err)
	}
	if gate.Release != "" {
		res.Skipped = "metabus would remove the finalizer " + gate.Release + " (the controller has no finalize hook any more)"
		return res, nil
	}
	if gate.Skip {
		res.Skipped = "metabus would not sync the parent now (it waits for the garbage collector)"
		return res, nil
	}
	if c.SyncCustomizeHook() != nil {
		res.Notes = append(res.Notes, "the controller has a customize hook: render does not call it, so the request shows no related objects")
	}
	choice, err := c.SyncHook(snap, parentRes.GVR.Resource)
	if err != nil {
		return nil, fmt.Errorf("the sync would fail: %w", err)
	}
	if choice.Hook == nil || choice.Local {
		res.Skipped = "no hook to call for this parent (deleting without a finalize hook, or not selected)"
		return res, nil
	}
	res.Hook = choice.Kind
	hook := choice.Hook
	if in.HookURL != "" {
		hook = withURL(hook, in.HookURL)
		choice.Hook = hook
	}
	if revs, err := c.SyncRevisions(in.Parent); err == nil && revs != nil {
		res.Notes = append(res.Notes, "rolling update: only the latest revision (the parent as it is) is rendered")
	}
	calls, err := c.SyncCalls(kinds.SyncInput{Snapshot: snap, Hook: choice})
	if err != nil {
		return nil, fmt.Errorf("build the hook request: %w", err)
	}
	pref := parentRef(in.Parent, parentRes)
	it := hooks.Item{Controller: c.Ref(), ControllerName: c.Object().GetName(), Parent: pref, Endpoints: c.SyncEndpoints()}
	for _, call := range calls {
		body, err := json.Marshal(call.Request)
		if err != nil {
			return nil, fmt.Errorf("encode the hook request: %w", err)
		}
		res.Requests = append(res.Requests, body)
		if err := in.Hooks.Do(ctx, it.SyncCall(hook, choice.Kind, "", call.Request), call.Response); err != nil {
			return res, fmt.Errorf("%s hook: %w", choice.Kind, err)
		}
	}
	ds, err := c.SyncDesired(calls)
	if err != nil {
		return res, fmt.Errorf("the hook's answer would be refused: %w", err)
	}
	ds.Controller, ds.Parent, ds.Hook = c.Ref(), pref, choice.Kind
	if ds.Children == nil {
		ds.Children = []*unstructured.Unstructured{}
	}
	res.Desired = &ds
	planParent := in.Parent
	if planParent.GetUID() == "" {
		// A parent that does not exist yet: the plan needs an owner UID
		// (never sent to the hook).
		planParent = planParent.DeepCopy()
		planParent.SetUID(placeholderUID)
	}
	observed := snap.Children
	if in.Observe == nil {
		observed = ownedBy(planParent, plan.Owned, observed)
	}
	if res.Changes.Children, err = Compare(c, in.Resolve, planParent, observed, &ds); err != nil {
		return res, err
	}
	if res.Changes.Parent, err = ParentChanges(c, in.Parent, parentRes, &ds); err != nil {
		return res, err
	}
	return res, nil
}

// withURL is hook with its webhook sent to url instead (a copy).
func withURL(h *v1alpha1.Hook, url string) *v1alpha1.Hook {
	out := *h
	var wh v1alpha1.Webhook
	if h.Webhook != nil {
		wh = *h.Webhook
	}
	wh.URL, wh.Service, wh.Path = &url, nil, nil
	out.Webhook = &wh
	return &out
}

// parentResource is the plan's parent resource of parent's apiVersion and
// kind.
func parentResource(plan *kinds.WatchPlan, parent *unstructured.Unstructured) (*discovery.Resource, error) {
	gvk := parent.GroupVersionKind()
	for _, p := range plan.Parents {
		if p.Res.Kind == gvk.Kind && p.Res.GVR.Group == gvk.Group {
			return p.Res, nil
		}
	}
	var have []string
	for _, p := range plan.Parents {
		have = append(have, p.Res.APIVersion()+" "+p.Res.Kind)
	}
	return nil, fmt.Errorf("a %s %s is not one of its parents (%s)", parent.GetAPIVersion(), parent.GetKind(), strings.Join(have, ", "))
}

// groupChildren puts given children into the owned groups (one per owned
// resource, in order, every group present); it returns the names of
// objects that fit no group.
func groupChildren(owned []*discovery.Resource, children []*unstructured.Unstructured) ([]snapshot.Group, []string) {
	groups := make([]snapshot.Group, len(owned))
	for i, r := range owned {
		groups[i] = snapshot.GroupOf(r)
	}
	var extra []string
	for _, o := range children {
		gvk := o.GroupVersionKind()
		placed := false
		for i, r := range owned {
			if r.Kind == gvk.Kind && r.GVR.Group == gvk.Group {
				groups[i].Objects = append(groups[i].Objects, o)
				placed = true
				break
			}
		}
		if !placed {
			extra = append(extra, o.GetAPIVersion()+" "+o.GetKind()+" "+objectName(o))
		}
	}
	return groups, extra
}

func parentRef(p *unstructured.Unstructured, res *discovery.Resource) bus.ObjectRef {
	return bus.ObjectRef{
		APIVersion: p.GetAPIVersion(), Kind: p.GetKind(), Resource: res.GVR.Resource, Namespace: p.GetNamespace(),
		Name: p.GetName(), UID: string(p.GetUID()), ResourceVersion: p.GetResourceVersion(), Generation: p.GetGeneration(),
	}
}

func objectName(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetName()
	}
	return o.GetNamespace() + "/" + o.GetName()
}

// Offline resolves resources without an API server: from the objects
// given (a resource named as the plural of their kind, lower case) and the
// built-in resources metabus controllers most often own. Scope comes from
// whether a given object has a namespace, and a given object's resource is
// taken to serve /status (parents must); built-in kinds know both.
func Offline(objs ...*unstructured.Unstructured) kinds.WatchResolver {
	type key struct{ group, resource string }
	known := map[key]*discovery.Resource{}
	add := func(gv schema.GroupVersion, kind, resource string, namespaced, status bool) {
		known[key{gv.Group, resource}] = &discovery.Resource{
			GVR: gv.WithResource(resource), Kind: kind, Namespaced: namespaced, HasStatus: status,
			Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"},
		}
	}
	for _, b := range builtins {
		add(schema.GroupVersion{Group: b.group, Version: b.version}, b.kind, b.resource, b.namespaced, b.status)
	}
	for _, o := range objs {
		if o == nil {
			continue
		}
		gvk := o.GroupVersionKind()
		res := strings.ToLower(gvk.Kind)
		switch {
		case strings.HasSuffix(res, "s"), strings.HasSuffix(res, "x"), strings.HasSuffix(res, "ch"), strings.HasSuffix(res, "sh"):
			res += "es"
		case strings.HasSuffix(res, "y") && len(res) > 1 && !strings.ContainsAny(res[len(res)-2:len(res)-1], "aeiou"):
			res = res[:len(res)-1] + "ies"
		default:
			res += "s"
		}
		// A custom resource is taken to serve /status: a parent must, and
		// a child's status is never written anyway.
		add(gvk.GroupVersion(), gvk.Kind, res, o.GetNamespace() != "", true)
	}
	return func(apiVersion, resource string) (*discovery.Resource, error) {
		gv, err := schema.ParseGroupVersion(apiVersion)
		if err != nil {
			return nil, err
		}
		r, ok := known[key{gv.Group, resource}]
		if !ok {
			return nil, fmt.Errorf("%s %s is not known offline: give an object of it, or use the cluster (--kubeconfig)", apiVersion, resource)
		}
		out := *r
		out.GVR.Version = gv.Version
		return &out, nil
	}
}

// builtins are the built-in resources render knows offline.
var builtins = []struct {
	group, version, kind, resource string
	namespaced, status             bool
}{
	{"", "v1", "ConfigMap", "configmaps", true, false},
	{"", "v1", "Secret", "secrets", true, false},
	{"", "v1", "Service", "services", true, true},
	{"", "v1", "ServiceAccount", "serviceaccounts", true, false},
	{"", "v1", "Pod", "pods", true, true},
	{"", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", true, true},
	{"", "v1", "Namespace", "namespaces", false, true},
	{"apps", "v1", "Deployment", "deployments", true, true},
	{"apps", "v1", "StatefulSet", "statefulsets", true, true},
	{"apps", "v1", "DaemonSet", "daemonsets", true, true},
	{"apps", "v1", "ReplicaSet", "replicasets", true, true},
	{"batch", "v1", "Job", "jobs", true, true},
	{"batch", "v1", "CronJob", "cronjobs", true, true},
	{"networking.k8s.io", "v1", "Ingress", "ingresses", true, true},
	{"networking.k8s.io", "v1", "NetworkPolicy", "networkpolicies", true, false},
	{"rbac.authorization.k8s.io", "v1", "Role", "roles", true, false},
	{"rbac.authorization.k8s.io", "v1", "RoleBinding", "rolebindings", true, false},
	{"rbac.authorization.k8s.io", "v1", "ClusterRole", "clusterroles", false, false},
	{"rbac.authorization.k8s.io", "v1", "ClusterRoleBinding", "clusterrolebindings", false, false},
	{"policy", "v1", "PodDisruptionBudget", "poddisruptionbudgets", true, true},
}

// placeholderUID owns a rendered parent that has no UID yet.
const placeholderUID = "00000000-0000-0000-0000-00000000render"

// ownedBy are given children as the parent's own: a child given without a
// controller reference gets one to the parent (the watcher would only show
// the hook the parent's own children, or orphans it adopts).
func ownedBy(parent *unstructured.Unstructured, owned []*discovery.Resource, groups []snapshot.Group) []snapshot.Group {
	out := make([]snapshot.Group, len(groups))
	t := true
	for i, g := range groups {
		out[i] = g
		out[i].Objects = make([]*unstructured.Unstructured, len(g.Objects))
		for j, o := range g.Objects {
			if controllerOf(o) == nil {
				cp := o.DeepCopy()
				cp.SetOwnerReferences(append(cp.GetOwnerReferences(), metav1.OwnerReference{
					APIVersion: parent.GetAPIVersion(), Kind: parent.GetKind(), Name: parent.GetName(),
					UID: parent.GetUID(), Controller: &t,
				}))
				o = cp
			}
			out[i].Objects[j] = o
		}
	}
	return out
}
