package revisions

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/client-go/dynamic"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/revision"
	"github.com/metabus/metabus/pkg/revstore"
)

// listPageSize bounds one LIST page. The label selector matches the
// revisions of every parent of the resource in the namespace, not only this
// parent's.
const listPageSize = 500

func invalid(format string, args ...any) *revstore.Response {
	return &revstore.Response{Result: revstore.Invalid, Message: fmt.Sprintf(format, args...)}
}

func failed(format string, args ...any) *revstore.Response {
	return &revstore.Response{Result: revstore.Error, Message: fmt.Sprintf(format, args...)}
}

func conflict(format string, args ...any) *revstore.Response {
	return &revstore.Response{Result: revstore.Conflict, Message: fmt.Sprintf(format, args...)}
}

func parentKey(p revstore.Parent) string {
	return fmt.Sprintf("%s %s/%s (%s)", p.Resource, p.Namespace, p.Name, p.UID)
}

// parentGroup validates the parent fields both operations need and returns
// its API group.
func parentGroup(p revstore.Parent) (string, *revstore.Response) {
	switch {
	case p.UID == "":
		return "", invalid("parent UID is required")
	case p.Resource == "":
		return "", invalid("parent resource is required")
	case p.Namespace == "":
		return "", invalid("ControllerRevisions are namespaced: parent %s/%s is cluster-scoped or lacks a namespace", p.Resource, p.Name)
	}
	gv, err := schema.ParseGroupVersion(p.APIVersion)
	if err != nil {
		return "", invalid("parent apiVersion %q: %v", p.APIVersion, err)
	}
	return gv.Group, nil
}

func (s *Service) client(ns string) dynamic.ResourceInterface {
	return s.dyn.Resource(v1alpha1.ControllerRevisionGVR).Namespace(ns)
}

// load lists the parent's revisions with a consistent read (ResourceVersion
// ""), so that they reflect every earlier commit, or from the API server's
// watch cache when the caller allows a stale answer; it adopts matching
// orphans when asked to.
func (s *Service) load(ctx context.Context, req revstore.Request) *revstore.Response {
	p := req.Parent
	group, bad := parentGroup(p)
	if bad != nil {
		return bad
	}
	var adoptSel labels.Selector
	if req.Adopt && p.Selector != "" {
		sel, err := labels.Parse(p.Selector)
		if err != nil {
			return invalid("parent selector %q: %v", p.Selector, err)
		}
		adoptSel = sel
	}
	if bad := s.checkServes(ctx, req); bad != nil {
		return bad
	}
	opts := metav1.ListOptions{
		LabelSelector: labels.Set{revision.LabelAPIGroup: group, revision.LabelResource: p.Resource}.String(),
		Limit:         listPageSize,
	}
	if req.AllowStale {
		opts.ResourceVersion = "0"
	}
	c := s.client(p.Namespace)
	var out []v1alpha1.ControllerRevision
	for {
		list, err := c.List(ctx, opts)
		if err != nil {
			return failed("list ControllerRevisions of %s: %v", parentKey(p), err)
		}
		for i := range list.Items {
			u := &list.Items[i]
			ref := metav1.GetControllerOfNoCopy(u)
			switch {
			case ref != nil && string(ref.UID) == p.UID:
			case ref == nil && adoptSel != nil && adoptSel.Matches(labels.Set(u.GetLabels())):
				adopted, err := s.adopt(ctx, p, u)
				if err != nil {
					if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
						// Changed or gone since the LIST: claimed by
						// someone else or deleted; the next load sees.
						s.log.Debug("skip adopting ControllerRevision", zap.String("revision", u.GetName()),
							zap.String("parent", parentKey(p)), zap.Error(err))
						continue
					}
					return failed("adopt ControllerRevision %s/%s for %s: %v", u.GetNamespace(), u.GetName(), parentKey(p), err)
				}
				u = adopted
			default:
				continue // another parent's, or an orphan not to adopt
			}
			r, err := decode(u)
			if err != nil {
				return failed("%v", err)
			}
			out = append(out, r)
		}
		if list.GetContinue() == "" {
			break
		}
		// A continue token carries its own snapshot; it must not be
		// combined with a resourceVersion.
		opts.Continue, opts.ResourceVersion = list.GetContinue(), ""
	}
	slices.SortFunc(out, func(a, b v1alpha1.ControllerRevision) int { return strings.Compare(a.Name, b.Name) })
	return &revstore.Response{Result: revstore.OK, Revisions: out}
}

// adopt sets a controller reference to the parent on an orphaned revision.
// The merge patch carries the listed resourceVersion, so a revision that
// changed since (adopted by another parent, say) fails with a conflict
// instead of ending up with two controllers.
func (s *Service) adopt(ctx context.Context, p revstore.Parent, u *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	refs := []any{}
	for _, r := range u.GetOwnerReferences() {
		if string(r.UID) != p.UID {
			refs = append(refs, r)
		}
	}
	refs = append(refs, children.ControllerRef(children.Owner{APIVersion: p.APIVersion, Kind: p.Kind, Name: p.Name, UID: p.UID}))
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"ownerReferences": refs,
		"resourceVersion": u.GetResourceVersion(),
	}})
	if err != nil {
		return nil, fmt.Errorf("encode adoption patch: %w", err)
	}
	out, err := s.client(u.GetNamespace()).Patch(ctx, u.GetName(), types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return nil, err
	}
	s.log.Debug("adopted ControllerRevision", zap.String("revision", u.GetName()), zap.String("parent", parentKey(p)))
	return out, nil
}

// commit validates the whole request, then writes creates, updates and
// deletes in order, stopping at the first failure.
func (s *Service) commit(ctx context.Context, req revstore.Request) *revstore.Response {
	p := req.Parent
	if _, bad := parentGroup(p); bad != nil {
		return bad
	}
	if bad := validateCommit(req); bad != nil {
		return bad
	}
	if bad := s.checkServes(ctx, req); bad != nil {
		return bad
	}
	c := s.client(p.Namespace)
	var highest string
	wrote := func(rv string) {
		if highest == "" {
			highest = rv
			return
		}
		if cmp, err := resourceversion.CompareResourceVersion(rv, highest); err != nil || cmp > 0 {
			highest = rv // not comparable: keep the latest
		}
	}
	for _, r := range req.Creates {
		u, err := encode(r)
		if err != nil {
			return invalid("create ControllerRevision %s: %v", r.Name, err)
		}
		// Server-set fields of a copied object would fail the create.
		u.SetResourceVersion("")
		u.SetUID("")
		u.SetManagedFields(nil)
		u.SetCreationTimestamp(metav1.Time{})
		out, err := c.Create(ctx, u, metav1.CreateOptions{})
		switch {
		case apierrors.IsAlreadyExists(err):
			return conflict("create ControllerRevision %s/%s: it already exists; load again", p.Namespace, r.Name)
		case err != nil:
			return failed("create ControllerRevision %s/%s: %v", p.Namespace, r.Name, err)
		}
		wrote(out.GetResourceVersion())
	}
	for _, r := range req.Updates {
		u, err := encode(r)
		if err != nil {
			return invalid("update ControllerRevision %s: %v", r.Name, err)
		}
		out, err := c.Update(ctx, u, metav1.UpdateOptions{})
		switch {
		case apierrors.IsConflict(err):
			return conflict("update ControllerRevision %s/%s at resourceVersion %s: it changed since it was loaded", p.Namespace, r.Name, r.ResourceVersion)
		case apierrors.IsNotFound(err):
			return conflict("update ControllerRevision %s/%s: it was deleted since it was loaded", p.Namespace, r.Name)
		case err != nil:
			return failed("update ControllerRevision %s/%s: %v", p.Namespace, r.Name, err)
		}
		wrote(out.GetResourceVersion())
	}
	for _, r := range req.Deletes {
		pre := &metav1.Preconditions{ResourceVersion: &r.ResourceVersion}
		if r.UID != "" {
			uid := r.UID
			pre.UID = &uid
		}
		err := c.Delete(ctx, r.Name, metav1.DeleteOptions{Preconditions: pre})
		switch {
		case err == nil, apierrors.IsNotFound(err):
		case apierrors.IsConflict(err):
			return conflict("delete ControllerRevision %s/%s at resourceVersion %s: it changed since it was loaded", p.Namespace, r.Name, r.ResourceVersion)
		default:
			return failed("delete ControllerRevision %s/%s: %v", p.Namespace, r.Name, err)
		}
	}
	s.log.Debug("revisions committed", zap.String("controller", req.Controller.ID()), zap.String("parent", parentKey(p)),
		zap.Int("creates", len(req.Creates)), zap.Int("updates", len(req.Updates)), zap.Int("deletes", len(req.Deletes)),
		zap.String("resourceVersion", highest))
	return &revstore.Response{Result: revstore.OK, ResourceVersion: highest}
}

// validateCommit rejects a commit that would write revisions the parent
// does not own, or that could not be found by a later load, before anything
// is written.
func validateCommit(req revstore.Request) *revstore.Response {
	p := req.Parent
	group, _ := parentGroup(p)
	check := func(what string, r v1alpha1.ControllerRevision, owned, labelled, versioned bool) *revstore.Response {
		if r.Name == "" {
			return invalid("%s: a ControllerRevision without a name", what)
		}
		if r.Namespace != p.Namespace {
			return invalid("%s ControllerRevision %s: namespace %q is not the parent's %q", what, r.Name, r.Namespace, p.Namespace)
		}
		if versioned && r.ResourceVersion == "" {
			return invalid("%s ControllerRevision %s: no resourceVersion (writes are conditional on the loaded version)", what, r.Name)
		}
		ref := metav1.GetControllerOfNoCopy(&r)
		if owned && (ref == nil || string(ref.UID) != p.UID) {
			return invalid("%s ControllerRevision %s: no controller reference to parent %s", what, r.Name, parentKey(p))
		}
		if ref != nil && string(ref.UID) != p.UID {
			return invalid("%s ControllerRevision %s: controlled by %s %s, not by parent %s", what, r.Name, ref.Kind, ref.Name, parentKey(p))
		}
		if labelled && (r.Labels[revision.LabelAPIGroup] != group || r.Labels[revision.LabelResource] != p.Resource) {
			return invalid("%s ControllerRevision %s: labels %s=%q, %s=%q do not name the parent's group and resource (a load would not find it)",
				what, r.Name, revision.LabelAPIGroup, r.Labels[revision.LabelAPIGroup], revision.LabelResource, r.Labels[revision.LabelResource])
		}
		return nil
	}
	for _, r := range req.Creates {
		if bad := check("create", r, true, true, false); bad != nil {
			return bad
		}
	}
	for _, r := range req.Updates {
		if bad := check("update", r, true, true, true); bad != nil {
			return bad
		}
	}
	for _, r := range req.Deletes {
		if bad := check("delete", r, false, false, true); bad != nil {
			return bad
		}
	}
	return nil
}

// encode turns a revision into the object to write.
func encode(r v1alpha1.ControllerRevision) (*unstructured.Unstructured, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	obj := map[string]any{}
	if err := json.Unmarshal(data, &obj); err != nil {
		return nil, fmt.Errorf("encode: %w", err)
	}
	// A revision without a parentPatch has the empty patch (revision.Name);
	// a null would only be pruned by the API server.
	if obj["parentPatch"] == nil {
		delete(obj, "parentPatch")
	}
	u := &unstructured.Unstructured{Object: obj}
	u.SetAPIVersion(v1alpha1.GroupVersion.String())
	u.SetKind(v1alpha1.ControllerRevisionKind)
	return u, nil
}

// decode turns a listed or written object into a revision.
func decode(u *unstructured.Unstructured) (v1alpha1.ControllerRevision, error) {
	var r v1alpha1.ControllerRevision
	data, err := json.Marshal(u.Object)
	if err != nil {
		return r, fmt.Errorf("encode ControllerRevision %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("decode ControllerRevision %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	return r, nil
}
