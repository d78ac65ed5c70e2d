package watcher

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"
	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/events"
	ctlid "github.com/metabus/metabus/pkg/identity"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/kubeapi"
	"github.com/metabus/metabus/pkg/readaccess"
	"github.com/metabus/metabus/pkg/snapshot"
)

// This file is the controller's identity in the watcher (issue 35): a
// controller that acts as a ServiceAccount (its annotation, else
// --default-service-account, resolved by pkg/identity as the applier does)
// is sent only the objects that account may list and watch. The check
// happens where snapshots are assembled, so nothing withheld reaches the
// bus, the dispatcher or a hook; a controller with no identity (upstream's
// behaviour) costs nothing. Answers come from SubjectAccessReviews, cached
// per (identity, resource, namespace) by pkg/readaccess: a snapshot pays
// map lookups, a review only for a scope never asked before.

// sarGVR is SubjectAccessReview's resource.
var sarGVR = schema.GroupVersionResource{Group: authorizationv1.GroupName, Version: "v1", Resource: "subjectaccessreviews"}

// reviewWait bounds the reviews a new wiring asks before it starts, and
// those a snapshot waits for (then it answers Retry).
const reviewWait = 5 * time.Second

// registerReadFlags adds --default-service-account (shared with the
// applier through pkg/identity) and --read-recheck-interval.
func (c *Config) registerReadFlags(fs *flag.FlagSet) {
	ctlid.RegisterDefaultFlag(fs, &c.DefaultServiceAccount)
	fs.DurationVar(&c.ReadRecheck, "read-recheck-interval", time.Minute, "how often the watcher asks again whether a controller's "+
		"ServiceAccount may read what it is sent (SubjectAccessReview): the bound on how long an RBAC change takes to show in its hooks' requests")
}

// reviewRead asks the API server whether s's identity may do verb on s.
func (w *Watcher) reviewRead(ctx context.Context, s readaccess.Scope, verb string) (bool, error) {
	in := &authorizationv1.SubjectAccessReview{
		TypeMeta: metav1.TypeMeta{APIVersion: authorizationv1.SchemeGroupVersion.String(), Kind: "SubjectAccessReview"},
		Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   s.Identity.Username(),
			Groups: s.Identity.Groups(),
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: s.Namespace, Verb: verb, Group: s.Group, Resource: s.Resource,
			},
		},
	}
	var out authorizationv1.SubjectAccessReview
	if err := w.kube.Create(ctx, kubeapi.Path(sarGVR, "", "", ""), in, &out); err != nil {
		return false, err
	}
	return out.Status.Allowed, nil
}

// planScopes are the cluster-wide scopes of every resource a plan
// watches for its hooks: asked before the wiring starts, so that its
// first snapshots find their answers (or, for a namespaced resource the
// identity may read only in some namespaces, the denial that sends them
// to the namespace's own review).
func planScopes(id ctlid.Identity, plan *kinds.WatchPlan) []readaccess.Scope {
	var out []readaccess.Scope
	add := func(gvr schema.GroupVersionResource) {
		out = append(out, readaccess.Scope{Identity: id, Group: gvr.Group, Resource: gvr.Resource})
	}
	for _, p := range plan.Parents {
		add(p.Res.GVR)
	}
	for _, o := range plan.Owned {
		add(o.GVR)
	}
	if plan.Keyed != nil {
		for _, in := range plan.Keyed.Inputs {
			add(in.GVR)
		}
	}
	return out
}

// precheckReads asks the reviews of a new wiring's resources. A failure
// is logged only: its snapshots ask again, and answer Retry meanwhile.
func (w *Watcher) precheckReads(ctx context.Context, id ctlid.Identity, plan *kinds.WatchPlan) {
	if id.None() {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, reviewWait)
	defer cancel()
	if err := w.reads.Refresh(ctx, id, planScopes(id, plan)); err != nil {
		w.log.Warn("read access reviews failed; snapshots retry until they are answered", zap.String("serviceAccount", id.String()), zap.Error(err))
	}
}

// readsChanged resyncs the controllers acting as id: a re-checked review
// changed (an RBAC change), so what they are sent changes too.
func (w *Watcher) readsChanged(id ctlid.Identity) {
	w.mu.RLock()
	var mine []*wiring
	for _, wr := range w.wirings {
		if wr.identity == id {
			mine = append(mine, wr)
		}
	}
	w.mu.RUnlock()
	for _, wr := range mine {
		wr.withheldSeen.Clear()
		wr.resync(bus.ReasonResync)
	}
}

// readView filters one snapshot to what the wiring's identity may read.
// A nil view (no identity) keeps everything.
type readView struct {
	ctx      context.Context
	reads    *readaccess.Cache
	id       ctlid.Identity
	unknown  *readaccess.Scope
	err      error
	withheld map[readaccess.Scope]int
}

// readView is the view of a snapshot of wr, nil for a controller with no
// identity.
func (wr *wiring) readView(ctx context.Context) *readView {
	if wr.identity.None() {
		return nil
	}
	return &readView{ctx: ctx, reads: wr.w.reads, id: wr.identity}
}

// may reports whether the identity may read objects of resource (of
// group) in namespace ns: a map lookup once answered; a review (bounded
// by reviewWait) the first time. A scope left unknown is recorded, and
// the snapshot must not be sent.
func (v *readView) may(group, resource, ns string) bool {
	if v == nil {
		return true
	}
	s := readaccess.Scope{Identity: v.id, Group: group, Resource: resource, Namespace: ns}
	verdict := v.reads.Verdict(s)
	if verdict == readaccess.Unknown && v.unknown == nil {
		ctx, cancel := context.WithTimeout(v.ctx, reviewWait)
		verdict, v.err = v.reads.Ensure(ctx, s)
		cancel()
	}
	switch verdict {
	case readaccess.Allowed:
		return true
	case readaccess.Denied:
		if v.withheld == nil {
			v.withheld = map[readaccess.Scope]int{}
		}
		v.withheld[s]++
	default:
		if v.unknown == nil {
			// A copy: taking s's own address would move it to the heap
			// at every call, an allocation per object.
			u := s
			v.unknown = &u
		}
	}
	return false
}

// objects is objs without those the identity may not read (objs itself
// when it keeps them all; never modified, as it may be a cache's).
func (v *readView) objects(group, resource string, objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	if v == nil {
		return objs
	}
	var out []*unstructured.Unstructured
	for i, o := range objs {
		if v.may(group, resource, o.GetNamespace()) {
			if out != nil {
				out = append(out, o)
			}
			continue
		}
		if out == nil {
			out = make([]*unstructured.Unstructured, i, len(objs))
			copy(out, objs[:i])
		}
	}
	if out == nil {
		return objs
	}
	return out
}

// groups filters every group's objects (children, related objects).
func (v *readView) groups(gs []snapshot.Group) {
	if v == nil {
		return
	}
	for i := range gs {
		g := &gs[i]
		gv, err := schema.ParseGroupVersion(g.APIVersion)
		if err != nil {
			// Not a group the watcher built: send none of it.
			g.Objects, g.Adopt, g.Release = []*unstructured.Unstructured{}, nil, nil
			continue
		}
		g.Objects = v.objects(gv.Group, g.Resource, g.Objects)
		g.Adopt = v.objects(gv.Group, g.Resource, g.Adopt)
		g.Release = v.objects(gv.Group, g.Resource, g.Release)
	}
}

// retry is the snapshot's answer when a review is still out: Retry, so
// nothing of an unknown scope is sent and nothing is decided on a partial
// view; nil when every scope was answered.
func (v *readView) retry() *snapshot.Response {
	if v == nil || v.unknown == nil {
		return nil
	}
	msg := "read access of ServiceAccount " + v.id.String() + " to " + v.unknown.String() + " not reviewed yet"
	if v.err != nil {
		msg += ": " + v.err.Error()
	}
	return &snapshot.Response{Result: snapshot.Retry, Message: msg}
}

// reportWithheld counts what v withheld and says so on the controller, once
// per scope for the wiring (again after an RBAC change), not per object or
// per snapshot.
func (wr *wiring) reportWithheld(v *readView, ctrl *unstructured.Unstructured) {
	if v == nil {
		return
	}
	for s, n := range v.withheld {
		wr.withheldScope(s, n, ctrl)
	}
}

// withheldScope counts n objects of s withheld, and reports s on ctrl the
// first time (ctrl nil: the wiring's object).
func (wr *wiring) withheldScope(s readaccess.Scope, n int, ctrl *unstructured.Unstructured) {
	wr.w.metrics.withheld.Add(float64(n))
	if _, seen := wr.withheldSeen.LoadOrStore(s, struct{}{}); seen {
		return
	}
	if ctrl == nil {
		wr.w.mu.RLock()
		ctrl = wr.obj
		wr.w.mu.RUnlock()
	}
	msg := fmt.Sprintf("ServiceAccount %s may not list and watch %s: its objects are withheld from the hooks "+
		"(granting list and watch brings them in within --read-recheck-interval)", s.Identity, s)
	wr.w.log.Info("objects withheld from a controller's hooks", zap.String("controller", wr.ref.ID()),
		zap.String("serviceAccount", s.Identity.String()), zap.String("scope", s.String()), zap.Int("objects", n))
	if ctrl != nil {
		wr.w.rec.Warning(ctrl, events.ReasonReadWithheld, msg)
	}
}

// parentWithheld reports a parent the controller's identity is known not
// to be allowed to read (a cached denial: a map lookup): no work item is
// made for it, since its snapshot would only answer NotFound, so a
// Namespace decorator acting as an account that may not read Namespaces
// costs no bus round trip per Namespace event. A scope not answered yet
// is not withheld here: the snapshot asks.
func (wr *wiring) parentWithheld(parent *unstructured.Unstructured) bool {
	if wr.identity.None() {
		return false
	}
	gv, err := schema.ParseGroupVersion(parent.GetAPIVersion())
	if err != nil {
		return false
	}
	for _, p := range wr.plan.Parents {
		if p.Res.GVR.Group != gv.Group || p.Res.Kind != parent.GetKind() {
			continue
		}
		s := readaccess.Scope{Identity: wr.identity, Group: p.Res.GVR.Group, Resource: p.Res.GVR.Resource, Namespace: parent.GetNamespace()}
		if wr.w.reads.Verdict(s) != readaccess.Denied {
			return false
		}
		wr.withheldScope(s, 1, nil)
		return true
	}
	return false
}

// withheldParent is the answer for a parent the identity may not read: the
// hooks never hear of it, as if it did not exist.
func withheldParent(v *readView) *snapshot.Response {
	if r := v.retry(); r != nil {
		return r
	}
	return &snapshot.Response{Result: snapshot.NotFound, Message: "parent withheld: ServiceAccount " + v.id.String() + " may not read it"}
}

// identityOf is the identity a controller object acts as, resolved as the
// applier resolves it.
func (w *Watcher) identityOf(obj *unstructured.Unstructured) (ctlid.Identity, error) {
	return ctlid.Of(obj.GetAnnotations(), w.cfg.DefaultServiceAccount)
}

// invalidIdentity reports a controller whose identity annotation does not
// parse and unwires it: nothing of it is watched or sent until it is fixed
// (neither as the default account nor as the watcher).
func (w *Watcher) invalidIdentity(id string, obj *unstructured.Unstructured, err error) {
	w.rec.Warning(obj, events.ReasonInvalidIdentity, err.Error()+"; not started: nothing is watched or sent to its hooks, and nothing is written, until the controller names a valid ServiceAccount")
	w.unwire(id, "invalid identity: "+err.Error(), false)
}

// sameIdentity reports whether two versions of a controller object name
// the same identity (a change rewires it, with reviews asked afresh).
func sameIdentity(a, b *unstructured.Unstructured) bool {
	return strings.TrimSpace(a.GetAnnotations()[ctlid.ServiceAccountAnnotation]) == strings.TrimSpace(b.GetAnnotations()[ctlid.ServiceAccountAnnotation])
}
