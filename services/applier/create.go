package applier

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/csaupgrade"

	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/events"
)

// This file holds what "create" means under both apply strategies: a
// create never writes an object that exists. A child the plan creates is
// one the parent does not control (the snapshot shows every child it
// controls, and the orphans its selector adopts), so an object already
// holding that name belongs to someone else: a create that meets it is a
// conflict, reported on the parent and retried with backoff until the
// name is free, and the object is left exactly as it was. Under
// server-side apply too: a forced apply would merge into it and add the
// parent's controller reference (take over, say, kube-system/aws-auth), so
// a child is created with a POST of its applied configuration and only
// applied once it exists.

// createConflictError is a create that found its name held by an object
// the parent does not control.
type createConflictError struct {
	// what names the child ("ConfigMap ns/name"), holder who holds the
	// name (holderOf).
	what, holder string
}

func (e *createConflictError) Error() string {
	return fmt.Sprintf("create %s: the name is taken by an object this parent does not control (%s): it is never taken over; the create is retried until the name is free", e.what, e.holder)
}

// holderOf decides a create of a child, controlled by ref, that found
// existing under its name. ours says existing is controlled by the same
// parent (ref's group, kind and UID): created by an earlier sync whose
// result the snapshot did not show yet, nothing is wrong. Otherwise holder
// says who holds the name, for the conflict's message. A parent adopts an
// orphan only through its selector, before planning (children.Claim), never
// by a create.
func holderOf(existing *unstructured.Unstructured, ref *metav1.OwnerReference) (ours bool, holder string) {
	if ref != nil && children.IsOwnedBy(existing, children.Owner{APIVersion: ref.APIVersion, Kind: ref.Kind, UID: string(ref.UID)}) {
		return true, ""
	}
	controller := metav1.GetControllerOfNoCopy(existing)
	switch {
	case controller != nil:
		holder = fmt.Sprintf("controlled by %s %s %s, UID %s", controller.APIVersion, controller.Kind, controller.Name, controller.UID)
	case len(existing.GetOwnerReferences()) > 0:
		holder = "no controller; owner references " + ownerNames(existing.GetOwnerReferences())
	default:
		holder = "no owner: created outside this parent, and not an orphan its selector adopts"
	}
	if existing.GetDeletionTimestamp() != nil {
		holder += "; being deleted"
	}
	return false, holder
}

func ownerNames(refs []metav1.OwnerReference) string {
	out := ""
	for i, r := range refs {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprintf("%s %s %s", r.APIVersion, r.Kind, r.Name)
	}
	return out
}

// createFailed is the end of a create of obj that failed with err, under
// either strategy: a name taken is settled by alreadyExists, anything else
// is an error.
func (a *Applier) createFailed(ctx context.Context, c dynamic.ResourceInterface, obj *unstructured.Unstructured, what string, err error) error {
	if apierrors.IsAlreadyExists(err) {
		return a.alreadyExists(ctx, c, obj, what)
	}
	return fmt.Errorf("create %s: %w", what, err)
}

// failureReason is the Event reason of an apply whose child or status
// writes failed with errs: CreateConflict when every failure is a create
// that met an object the parent does not control, else ApplyError.
func failureReason(errs []error) string {
	for _, err := range errs {
		var taken *createConflictError
		if !errors.As(err, &taken) {
			return events.ReasonApplyError
		}
	}
	return events.ReasonCreateConflict
}

// ownershipPatch is the JSON patch that hands the fields a create by
// manager recorded (an Update entry of manager in managedFields) to
// manager's Apply entry, as kubectl does when it moves an object from
// client-side to server-side apply (csaupgrade): later applies then own
// and prune those fields as if the create had been an apply, so a field
// the hook stops returning is removed. The patch carries resourceVersion:
// an object changed since is a conflict, never a blind write of its
// managedFields. nil when there is nothing to hand over.
func ownershipPatch(uid, resourceVersion string, managed []metav1.ManagedFieldsEntry, manager string) ([]byte, error) {
	obj := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{
		UID: types.UID(uid), ResourceVersion: resourceVersion, ManagedFields: managed,
	}}
	patch, err := csaupgrade.UpgradeManagedFieldsPatch(obj, sets.New(manager), manager)
	if err != nil {
		return nil, fmt.Errorf("hand the created fields to %s's applies: %w", manager, err)
	}
	return patch, nil
}

// createdAnswer is what createApplied reads of the API server's answer to
// a create.
type createdAnswer struct {
	Metadata struct {
		UID             string                      `json:"uid"`
		ResourceVersion string                      `json:"resourceVersion"`
		Generation      int64                       `json:"generation"`
		ManagedFields   []metav1.ManagedFieldsEntry `json:"managedFields"`
	} `json:"metadata"`
}

// postConfiguration creates cfg as the field manager and returns the
// answer's identity and managedFields.
func (a *Applier) postConfiguration(ctx context.Context, c dynamic.ResourceInterface, rule *children.Rule, cfg *unstructured.Unstructured) (createdAnswer, error) {
	var ans createdAnswer
	if a.raw == nil {
		out, err := c.Create(ctx, cfg, metav1.CreateOptions{FieldManager: a.cfg.FieldManager})
		if err != nil {
			return ans, err
		}
		ans.Metadata.UID, ans.Metadata.ResourceVersion = string(out.GetUID()), out.GetResourceVersion()
		ans.Metadata.Generation, ans.Metadata.ManagedFields = out.GetGeneration(), out.GetManagedFields()
		return ans, nil
	}
	gvr, err := ruleGVR(rule)
	if err != nil {
		return ans, err
	}
	ns := ""
	if rule.Namespaced {
		ns = cfg.GetNamespace()
	}
	raw, err := a.raw.post(ctx, gvr, ns, cfg, a.cfg.FieldManager)
	if err != nil {
		return ans, err
	}
	if err := json.Unmarshal(raw, &ans); err != nil {
		return ans, fmt.Errorf("read the answer to the create of %s: %w", cfg.GetName(), err)
	}
	return ans, nil
}

// createApplied creates a child under server-side apply (an OpApply
// without an observed child): a POST of its applied configuration, which
// fails on an existing object instead of merging into it (alreadyExists
// settles that), then the hand-over of the created fields to the field
// manager's applies (ownershipPatch). The hand-over is retried on a fresh
// read when the child changed meanwhile; if it still fails, the child
// exists with its values and the failure is an error, retried: only a
// field the hook later stops returning would stay.
func (a *Applier) createApplied(ctx context.Context, c dynamic.ResourceInterface, act children.Action, what string) error {
	cfg := act.Object
	_, hash, err := apply.Encode(cfg, "", "")
	if err != nil {
		return err
	}
	a.metrics.writes.WithLabelValues("create", act.Rule.Resource).Inc()
	ans, err := a.postConfiguration(ctx, c, act.Rule, cfg)
	if err != nil {
		return a.createFailed(ctx, c, cfg, what, err)
	}
	w := written{UID: ans.Metadata.UID, ResourceVersion: ans.Metadata.ResourceVersion, Generation: ans.Metadata.Generation}
	noteCreated(ctx, ruleKey(act.Rule), w)
	managed := ans.Metadata.ManagedFields
	for attempt := 0; ; attempt++ {
		patch, err := ownershipPatch(w.UID, w.ResourceVersion, managed, a.cfg.FieldManager)
		if err != nil || patch == nil {
			if err != nil {
				return fmt.Errorf("created %s, but: %w", what, err)
			}
			break
		}
		a.metrics.writes.WithLabelValues("own_created_fields", act.Rule.Resource).Inc()
		finish := startWrite(ctx, ruleKey(act.Rule), identity(w))
		out, err := c.Patch(ctx, cfg.GetName(), types.JSONPatchType, patch, metav1.PatchOptions{})
		finish(out)
		if err == nil {
			w = written{UID: string(out.GetUID()), ResourceVersion: out.GetResourceVersion(), Generation: out.GetGeneration()}
			break
		}
		if apierrors.IsNotFound(err) {
			return nil // deleted meanwhile; the next sync creates it again
		}
		if !apierrors.IsConflict(err) || attempt == 2 {
			return fmt.Errorf("created %s, but handing its fields to the field manager %s's applies failed (a field the hook stops returning may stay): %w", what, a.cfg.FieldManager, err)
		}
		live, err := c.Get(ctx, cfg.GetName(), metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("created %s, but reading it to hand its fields to the field manager %s failed: %w", what, a.cfg.FieldManager, err)
		}
		if string(live.GetUID()) != w.UID {
			return nil // replaced meanwhile: not the child this create made
		}
		w = written{UID: w.UID, ResourceVersion: live.GetResourceVersion(), Generation: live.GetGeneration()}
		managed = live.GetManagedFields()
	}
	a.log.Debug("child created for server-side apply", zap.String("child", what))
	noteChange(ctx, changeCreated, cfg, w.UID, w.ResourceVersion)
	a.applied.remember(apply.Applied{UID: w.UID, Hash: hash, Generation: w.Generation, ResourceVersion: w.ResourceVersion})
	return nil
}
