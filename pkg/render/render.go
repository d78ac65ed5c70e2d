// Package render calls a controller's hooks outside the bus, with the
// requests metabus would send for a parent, and compares the answers with
// the state the parent and its children are in: what `metabus render`
// prints. It drives the controller's kind through the same seams as the
// dispatcher (kinds.Syncing: gate, customize hook, hook choice, request
// building, answer decoding), makes the calls through package hooks as
// the dispatcher does (hooks.Item), takes a customize hook's answer in as
// the dispatcher does (related.Accept, under the dispatcher's default
// policy or the one given) and selects the related objects as the
// watcher's snapshot does (related.Resolve, related.Groups), and judges
// the answers with the applier's merge (package apply), so a render shows
// what a sync would do.
//
// A keyed controller (MapController: kinds.WatchPlan.Keyed) is rendered
// as the dispatcher syncs it, unit by unit: its per-parent item (the
// aggregated status, no hook) and one item per map key of the parent
// (the keys of the inputs it selects and of the outputs it has), each
// with the map hook (or the tombstone hook for a key whose input is gone)
// and the diff against that key's outputs.
//
// The observed state comes from the objects given (Input.Children,
// Inputs, Related) or from the cluster (Input.List, --from-cluster), read
// the way the watcher's caches hold it. What it does not do: render older
// revisions of a rolling update (only the parent as it is).
package render

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/hooks"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/kindtable"
	"github.com/metabus/metabus/pkg/related"
	"github.com/metabus/metabus/pkg/snapshot"
)

// Input is one render.
type Input struct {
	Controller *unstructured.Unstructured
	Parent     *unstructured.Unstructured
	// Children are the observed children to show the hook (ignored with
	// List): each goes into the owned group of its apiVersion and kind. A
	// MapController's outputs are its children.
	Children []*unstructured.Unstructured
	// Inputs are a MapController's input objects to select from (ignored
	// with List).
	Inputs []*unstructured.Unstructured
	// Related are the objects a customize hook's related rules select
	// from (ignored with List), Namespaces among them giving the labels
	// namespaceSelectors match.
	Related []*unstructured.Unstructured
	// List, if set, reads the observed state from the cluster instead
	// (--from-cluster): owned objects, inputs and related objects.
	List Lister
	// Resolve resolves the controller's resources (API discovery, or
	// Offline).
	Resolve kinds.WatchResolver
	// HookURL, if set, replaces the URL of the hook the kind chooses
	// (sync or finalize; a MapController's map or tombstone hook): a new
	// hook version, a local copy. The customize hook keeps its own.
	HookURL string
	// CustomizeURL, if set, replaces the customize hook's URL.
	CustomizeURL string
	// RelatedPolicy is what customize hooks' related rules may name, as
	// the dispatcher's --related-resources (nil: related.DefaultPolicy).
	RelatedPolicy []string
	// Hooks makes the calls.
	Hooks hooks.Caller
}

// Result is what a render found: the parent's unit of work (for a
// MapController, its per-parent item: the aggregated status) and, for a
// keyed controller, one per map key.
type Result struct {
	Controller string `json:"controller"`
	Parent     string `json:"parent"`
	Unit
	// Keys are a keyed controller's map keys, sorted.
	Keys  []Key    `json:"keys,omitempty"`
	Notes []string `json:"notes,omitempty"`
}

// Unit is the render of one unit of work: what the dispatcher would call
// and answer, and what the applier would do with it.
type Unit struct {
	// Hook is the hook kind (sync, finalize, map, tombstone; status for
	// an answer the kind makes without a hook), "" when nothing was done.
	Hook string `json:"hook,omitempty"`
	// Skipped says why no hook was called.
	Skipped string `json:"skipped,omitempty"`
	// Requests are the hook calls made, in order (the customize hook's
	// first).
	Requests []Call `json:"requests,omitempty"`
	// Desired is the answer as the dispatcher would publish it.
	Desired *bus.DesiredState `json:"desired,omitempty"`
	// Changes are what the applier would do with it.
	Changes Changes `json:"changes"`
}

// Call is one hook call: the hook kind, the body sent, and the answer
// (absent when the call failed).
type Call struct {
	Hook     string          `json:"hook"`
	Request  json.RawMessage `json:"request"`
	Response json.RawMessage `json:"response,omitempty"`
}

// Key is one map key of a keyed controller's parent.
type Key struct {
	Key string `json:"key"`
	// Input is the key's input (namespace/name), "" when the parent no
	// longer selects one (the key's outputs are detached).
	Input string `json:"input,omitempty"`
	Unit
	// Error is why the key could not be rendered.
	Error string `json:"error,omitempty"`
}

// Units are the parent's unit and its keys' units.
func (r *Result) Units() []*Unit {
	out := []*Unit{&r.Unit}
	for i := range r.Keys {
		out = append(out, &r.Keys[i].Unit)
	}
	return out
}

// Changed reports whether a desired state differs from the observed one.
func (r *Result) Changed() bool {
	for _, u := range r.Units() {
		if u.Changes.Any() {
			return true
		}
	}
	return false
}

// renderer holds what every unit of one render shares.
type renderer struct {
	in        Input
	c         kinds.Controller
	plan      *kinds.WatchPlan
	parentRes *apiresource.Resource
	// planParent is the parent with a UID (a placeholder for a parent
	// that does not exist yet: the applier's plan needs an owner).
	planParent *unstructured.Unstructured
	policy     related.Policy
	res        *Result
}

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
	parentRes, err := parentResource(plan, in.Parent)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", res.Controller, err)
	}
	policy := in.RelatedPolicy
	if policy == nil {
		policy = related.DefaultPolicy
	}
	r := &renderer{in: in, c: c, plan: plan, parentRes: parentRes, planParent: in.Parent, res: res}
	if r.policy, err = related.ParsePolicy(policy); err != nil {
		return nil, fmt.Errorf("related resources policy: %w", err)
	}
	if in.Parent.GetUID() == "" {
		r.planParent = in.Parent.DeepCopy()
		r.planParent.SetUID(placeholderUID)
	}
	if !plan.Rules.Selects(in.Parent) {
		res.Notes = append(res.Notes, "the controller's selector does not select this parent: metabus would not sync it")
	}
	owned, selErr, err := r.owned(ctx)
	if err != nil {
		return nil, err
	}
	if plan.Keyed != nil {
		return res, r.keyed(ctx, owned, selErr)
	}
	snap := r.snapshot()
	snap.Children, snap.SelectorError = owned, selErr
	if revs, err := c.SyncRevisions(in.Parent); err == nil && revs != nil {
		res.Notes = append(res.Notes, "rolling update: only the latest revision (the parent as it is) is rendered")
	}
	return res, r.unit(ctx, snap, &res.Unit)
}

// snapshot is the parent's snapshot without its observed objects.
func (r *renderer) snapshot() *snapshot.Response {
	return &snapshot.Response{
		Result: snapshot.OK, Controller: r.in.Controller, Parent: r.in.Parent,
		ParentResource: r.parentRes.GVR.Resource, ParentHasStatus: r.parentRes.HasStatus,
	}
}

// owned are the parent's owned groups (children, a MapController's
// outputs), as the watcher's caches give them: from the cluster, or the
// objects given, taken as the parent's own.
func (r *renderer) owned(ctx context.Context) ([]snapshot.Group, string, error) {
	if r.in.List != nil {
		caches := make([]kinds.WatchCache, len(r.plan.Owned))
		for i, res := range r.plan.Owned {
			ns := ""
			if res.Namespaced && r.in.Parent.GetNamespace() != "" {
				ns = r.in.Parent.GetNamespace()
			}
			objs, err := r.in.List(ctx, res, ns)
			if err != nil {
				return nil, "", err
			}
			caches[i] = ListCache(objs)
		}
		groups, selErr := r.plan.Rules.Observe(r.parentRes, r.in.Parent, caches)
		return groups, selErr, nil
	}
	groups, extra := groupChildren(r.plan.Owned, r.in.Children)
	for _, e := range extra {
		r.res.Notes = append(r.res.Notes, "ignored "+e+": not a child resource of the controller")
	}
	return groups, "", nil
}

// unit renders one unit of work from its snapshot as the dispatcher syncs
// it (services/dispatcher's syncParent, in its order) and plans the
// answer as the applier would.
func (r *renderer) unit(ctx context.Context, snap *snapshot.Response, u *Unit) error {
	c := r.c
	gate, err := c.SyncGate(snap)
	if err != nil {
		return fmt.Errorf("the sync would fail before any hook call: %w", err)
	}
	if gate.Release != "" {
		u.Skipped = "metabus would remove the finalizer " + gate.Release + " (the controller has no finalize hook any more)"
		return nil
	}
	if gate.Skip {
		u.Skipped = "metabus would not sync the parent now (it waits for the garbage collector)"
		return nil
	}
	if hook := c.SyncCustomizeHook(); hook != nil {
		if err := r.customize(ctx, hook, snap, u); err != nil {
			return err
		}
	}
	choice, err := c.SyncHook(snap, r.parentRes.GVR.Resource)
	if err != nil {
		return fmt.Errorf("the sync would fail: %w", err)
	}
	if choice.Hook == nil && !choice.Local {
		u.Skipped = "no hook to call (deleting without a finalize hook, not selected, or nothing left to decide)"
		return nil
	}
	u.Hook = choice.Kind
	if choice.Hook != nil && r.in.HookURL != "" {
		choice.Hook = withURL(choice.Hook, r.in.HookURL)
	}
	calls, err := c.SyncCalls(kinds.SyncInput{Snapshot: snap, Hook: choice})
	if err != nil {
		return fmt.Errorf("build the hook request: %w", err)
	}
	pref := parentRef(r.in.Parent, r.parentRes)
	if !choice.Local {
		it := hooks.Item{Controller: c.Ref(), ControllerName: c.Object().GetName(), Parent: pref, MapKey: snap.MapKey, Endpoints: c.SyncEndpoints()}
		for _, call := range calls {
			err := r.call(ctx, u, choice.Kind, it.SyncCall(choice.Hook, choice.Kind, "", call.Request), call.Response)
			if err != nil {
				return fmt.Errorf("%s hook: %w", choice.Kind, err)
			}
		}
	}
	ds, err := c.SyncDesired(calls)
	if err != nil {
		return fmt.Errorf("the hook's answer would be refused: %w", err)
	}
	ds.Controller, ds.Parent, ds.MapKey, ds.Hook = c.Ref(), pref, snap.MapKey, choice.Kind
	if ds.Children == nil {
		ds.Children = []*unstructured.Unstructured{}
	}
	u.Desired = &ds
	observed := snap.Children
	if r.in.List == nil {
		observed = ownedBy(r.planParent, r.plan.Owned, observed)
	}
	if u.Changes.Children, err = Compare(c, r.in.Resolve, r.planParent, observed, &ds); err != nil {
		return err
	}
	if u.Changes.Parent, err = ParentChanges(c, r.in.Parent, r.parentRes, &ds); err != nil {
		return err
	}
	return nil
}

// call makes one hook call and records it in u.
func (r *renderer) call(ctx context.Context, u *Unit, kind string, call hooks.Call, answer any) error {
	body, err := json.Marshal(call.Request)
	if err != nil {
		return fmt.Errorf("encode the request: %w", err)
	}
	rec := Call{Hook: kind, Request: body}
	err = r.in.Hooks.Do(ctx, call, answer)
	if err == nil {
		rec.Response, _ = json.Marshal(answer)
	}
	u.Requests = append(u.Requests, rec)
	return err
}

// customize calls the controller's customize hook as the dispatcher does
// (same request, same call, same checks of the answer: related.Accept),
// and puts the related objects its rules select into snap, selected as
// the watcher's snapshot selects them (related.Groups).
func (r *renderer) customize(ctx context.Context, hook *v1alpha1.Hook, snap *snapshot.Response, u *Unit) error {
	version := kinds.HookVersion(hook)
	if r.in.CustomizeURL != "" {
		hook = withURL(hook, r.in.CustomizeURL)
	}
	c := r.c
	it := hooks.Item{Controller: c.Ref(), ControllerName: c.Object().GetName(), Parent: parentRef(snap.Parent, r.parentRes), MapKey: snap.MapKey, Endpoints: c.SyncEndpoints()}
	var resp hookapi.CustomizeResponse
	if err := r.call(ctx, u, bus.HookCustomize, it.CustomizeCall(hook, hookapi.CustomizeRequest{Controller: snap.Controller, Parent: snap.Parent}), &resp); err != nil {
		return fmt.Errorf("customize hook failed: %w", err)
	}
	rules, err := related.Accept(c.Ref(), snap.Parent, version, resp.RelatedResources, r.policy)
	if err != nil {
		return err
	}
	resolved, err := related.Resolve(rules, r.in.Resolve)
	if err != nil {
		return fmt.Errorf("related resources cannot be observed: %w", err)
	}
	var listErr error
	list := func(res *apiresource.Resource, namespace string) []*unstructured.Unstructured {
		if !res.Namespaced && namespace != "" {
			return nil // as the watcher's namespace index: none there
		}
		objs, err := r.list(ctx, res, namespace, r.in.Related)
		if err != nil && listErr == nil {
			listErr = err
		}
		return objs
	}
	var nsLabels func(string) (map[string]string, bool)
	if slices.ContainsFunc(resolved, func(x related.Resolved) bool { return x.Rule.NeedsNamespaceLabels() }) {
		nsRes, err := r.in.Resolve("v1", "namespaces")
		if err != nil {
			return fmt.Errorf("related resources cannot be observed: namespaces: %w", err)
		}
		labels := map[string]map[string]string{}
		for _, n := range list(nsRes, "") {
			labels[n.GetName()] = n.GetLabels()
		}
		nsLabels = func(ns string) (map[string]string, bool) { l, ok := labels[ns]; return l, ok }
	}
	groups := related.Groups(resolved, list, nsLabels)
	if listErr != nil {
		return fmt.Errorf("related objects: %w", listErr)
	}
	if len(groups) > 0 {
		snap.Related = groups
	}
	return nil
}

// list lists the objects of res in namespace ("": all) from the cluster,
// or else from given.
func (r *renderer) list(ctx context.Context, res *apiresource.Resource, namespace string, given []*unstructured.Unstructured) ([]*unstructured.Unstructured, error) {
	if r.in.List != nil {
		return r.in.List(ctx, res, namespace)
	}
	var out []*unstructured.Unstructured
	for _, o := range given {
		gvk := o.GroupVersionKind()
		if gvk.Kind == res.Kind && gvk.Group == res.GVR.Group && (namespace == "" || o.GetNamespace() == namespace) {
			out = append(out, o)
		}
	}
	return out, nil
}

// keyed renders a keyed controller's parent as the dispatcher syncs its
// work items (the watcher's keyed snapshots, read from lists): the
// per-parent item, then one item per map key.
func (r *renderer) keyed(ctx context.Context, outputs []snapshot.Group, selErr string) error {
	rules := r.plan.Keyed.Rules
	parent := r.in.Parent
	sel, err := rules.InputSelector(parent)
	if err == nil && sel == nil {
		err = errors.New("the controller's kind gave the parent no input selector")
	}
	if err != nil {
		selErr, sel = err.Error(), nil
	}
	inputs := make([]snapshot.Group, len(r.plan.Keyed.Inputs))
	keyed := map[string]*unstructured.Unstructured{}
	var keys []string
	for i, res := range r.plan.Keyed.Inputs {
		inputs[i] = snapshot.GroupOf(res)
		if sel == nil {
			continue
		}
		ns := sel.Namespace()
		if !res.Namespaced {
			ns = ""
		}
		objs, err := r.list(ctx, res, ns, r.in.Inputs)
		if err != nil {
			return err
		}
		for _, o := range objs {
			if !kinds.SelectsInput(sel, o) {
				continue
			}
			if o.GetUID() == "" {
				// An input from a file that does not exist yet: a map key
				// needs a UID, so it gets a placeholder (its key will not
				// be the one metabus gives it).
				o = o.DeepCopy()
				o.SetUID(types.UID(fmt.Sprintf("%s-%d-%d", placeholderUID, i, len(inputs[i].Objects))))
				r.res.Notes = append(r.res.Notes, "input "+objectName(o)+" has no UID: rendered with a placeholder one (its map key is not the one it will have)")
			}
			inputs[i].Objects = append(inputs[i].Objects, o)
			if k, ok := rules.InputKey(res, o); ok {
				keyed[k] = o
				keys = append(keys, k)
			}
		}
	}
	observed := outputs
	if r.in.List == nil {
		observed = ownedBy(r.planParent, r.plan.Owned, outputs)
	}
	// Each key is shown its outputs as observed (given), and planned
	// against them as the parent's own (unit).
	byKey := map[string][]snapshot.Group{}
	for i, g := range outputs {
		for _, o := range g.Objects {
			k, ok := rules.OutputKey(o)
			if !ok {
				continue
			}
			if byKey[k] == nil {
				byKey[k] = make([]snapshot.Group, len(r.plan.Owned))
				for j, res := range r.plan.Owned {
					byKey[k][j] = snapshot.GroupOf(res)
				}
				keys = append(keys, k)
			}
			byKey[k][i].Objects = append(byKey[k][i].Objects, o)
		}
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)

	snap := r.snapshot()
	snap.SelectorError = selErr
	snap.Summary = rules.Summarize(parent, inputs, observed)
	if err := r.unit(ctx, snap, &r.res.Unit); err != nil {
		return err
	}
	var failed []string
	for _, k := range keys {
		key := Key{Key: k}
		ks := r.snapshot()
		ks.MapKey, ks.SelectorError = k, selErr
		if in := keyed[k]; in != nil {
			ks.Input = in
			key.Input = objectName(in)
		}
		ks.Children = byKey[k]
		if ks.Children == nil {
			ks.Children = make([]snapshot.Group, len(r.plan.Owned))
			for j, res := range r.plan.Owned {
				ks.Children[j] = snapshot.GroupOf(res)
			}
		}
		if err := r.unit(ctx, ks, &key.Unit); err != nil {
			key.Error = err.Error()
			failed = append(failed, k)
		}
		r.res.Keys = append(r.res.Keys, key)
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d of %d map keys could not be rendered (%s): see each key's error", len(failed), len(keys), strings.Join(failed, ", "))
	}
	return nil
}

// withURL is hook with its webhook sent to url instead (a copy); a hook
// served over NATS becomes a webhook at url.
func withURL(h *v1alpha1.Hook, url string) *v1alpha1.Hook {
	out := *h
	var wh v1alpha1.Webhook
	if h.Webhook != nil {
		wh = *h.Webhook
	}
	wh.URL, wh.Service, wh.Path = &url, nil, nil
	out.Webhook, out.NATS = &wh, nil
	return &out
}

// parentResource is the plan's parent resource of parent's apiVersion and
// kind.
func parentResource(plan *kinds.WatchPlan, parent *unstructured.Unstructured) (*apiresource.Resource, error) {
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
func groupChildren(owned []*apiresource.Resource, children []*unstructured.Unstructured) ([]snapshot.Group, []string) {
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

func parentRef(p *unstructured.Unstructured, res *apiresource.Resource) bus.ObjectRef {
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
	known := map[key]*apiresource.Resource{}
	add := func(gv schema.GroupVersion, kind, resource string, namespaced, status bool) {
		known[key{gv.Group, resource}] = &apiresource.Resource{
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
	return func(apiVersion, resource string) (*apiresource.Resource, error) {
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
func ownedBy(parent *unstructured.Unstructured, owned []*apiresource.Resource, groups []snapshot.Group) []snapshot.Group {
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
