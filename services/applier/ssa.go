package applier

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/kinds"
)

// This file holds the server-side apply writes of children
// (--apply-strategy=server-side-apply). Deletes, adoption and the
// parent's own writes are the same for both strategies, as upstream's are.

// maxApplied bounds the memory of server-side applies; past it, it
// starts over (losing it costs one apply per settled child, which the API
// server finds to be a no-op).
const maxApplied = 100000

// appliedMemory is what this replica applied last to each child, by UID:
// the only way to know that a settled child's field ownership is already
// the configuration's, as the snapshot's objects carry no managedFields.
type appliedMemory struct {
	mu sync.Mutex
	m  map[string]apply.Applied
}

// skips reports whether the server-side write of cfg to observed is one
// this replica knows to change nothing: a settled child whose ownership is
// already cfg's (Covers), or any child untouched since this replica
// applied (or dry-ran) cfg to it (Repeats).
func (m *appliedMemory) skips(observed *unstructured.Unstructured, cfg *unstructured.Unstructured, settled bool) bool {
	_, hash, err := apply.Encode(cfg, "", "")
	if err != nil {
		return false
	}
	m.mu.Lock()
	last := m.m[string(observed.GetUID())]
	m.mu.Unlock()
	return (settled && last.Covers(observed, hash)) || last.Repeats(observed, hash)
}

func (m *appliedMemory) remember(a apply.Applied) {
	if a.UID == "" {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil || len(m.m) >= maxApplied {
		m.m = map[string]apply.Applied{}
	}
	m.m[a.UID] = a
}

// planOptions is how the children of a kind are written.
func (a *Applier) planOptions(decl kinds.ApplyChildRules) children.Options {
	if decl.DynamicApplyOnly {
		return children.Options{Strategy: apply.DynamicApply}
	}
	return children.Options{Strategy: a.cfg.Strategy}
}

// covered reports a server-side write this replica knows to change
// nothing (appliedMemory.skips): the plan leaves it out, so that a sync
// that needs nothing else makes no API call.
func (a *Applier) covered(act children.Action) bool {
	switch {
	case act.Op == children.OpApply && act.Observed != nil && !act.DropLastApplied:
		return a.applied.skips(act.Observed, act.Object, act.Settled)
	case act.Op == children.OpDelete && act.Verify != nil:
		return a.applied.skips(act.Object, act.Verify, act.Settled)
	}
	return false
}

// ssaPatch sends a server-side apply of body (through the raw client when
// there is one) and returns the answer's identity and, for a dry run, the
// object the API server would store.
func (a *Applier) ssaPatch(ctx context.Context, c dynamic.ResourceInterface, rule *children.Rule, namespace, name string, body []byte, dryRun bool) (written, map[string]any, error) {
	rc := a.writersOf(ctx).raw
	if rc == nil {
		opts := metav1.PatchOptions{FieldManager: a.cfg.FieldManager, Force: ptrTo(true)}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		out, err := c.Patch(ctx, name, types.ApplyPatchType, body, opts)
		if err != nil {
			return written{}, nil, err
		}
		return written{UID: string(out.GetUID()), ResourceVersion: out.GetResourceVersion(), Generation: out.GetGeneration()}, out.Object, nil
	}
	gvr, err := ruleGVR(rule)
	if err != nil {
		return written{}, nil, err
	}
	if !rule.Namespaced {
		namespace = ""
	}
	raw, err := rc.apply(ctx, gvr, namespace, name, body, a.cfg.FieldManager, dryRun)
	if err != nil {
		return written{}, nil, err
	}
	if dryRun {
		var obj map[string]any
		if err := json.Unmarshal(raw, &obj); err != nil {
			return written{}, nil, fmt.Errorf("read the dry run of %s: %w", name, err)
		}
		return written{}, obj, nil
	}
	w, err := readWritten(raw, name, "apply")
	return w, nil, err
}

func ptrTo[T any](v T) *T { return &v }

// applyChild performs an OpApply: the create of a child (createApplied:
// never an apply, which would merge into an object of that name that
// exists), or the server-side apply that updates act.Observed with its UID
// and resourceVersion as preconditions (a child changed or deleted since
// the hook saw it is a conflict and a new sync, as with dynamic apply, and
// never an apply on top of a change the hook has not seen). A child
// carrying dynamic apply's annotation loses it first (upstream does the
// same): it belongs to another field manager, so the apply would keep it,
// stale.
func (a *Applier) applyChild(ctx context.Context, c dynamic.ResourceInterface, act children.Action, what string) error {
	cfg, base := act.Object, act.Observed
	if base == nil {
		return a.createApplied(ctx, c, act, what)
	}
	if act.DropLastApplied {
		out, err := a.dropLastApplied(ctx, c, act.Rule, base)
		if err != nil {
			if apierrors.IsNotFound(err) {
				return nil // deleted meanwhile; the next sync creates it again
			}
			if apierrors.IsConflict(err) {
				return err
			}
			return fmt.Errorf("remove %s from %s: %w", apply.LastAppliedAnnotation, what, err)
		}
		base = out
	}
	body, hash, err := apply.Encode(cfg, string(base.GetUID()), base.GetResourceVersion())
	if err != nil {
		return err
	}
	a.metrics.writes.WithLabelValues("apply", act.Rule.Resource).Inc()
	finish := startWrite(ctx, ruleKey(act.Rule), base)
	w, _, err := a.ssaPatch(ctx, c, act.Rule, cfg.GetNamespace(), cfg.GetName(), body, false)
	finish(identity(w))
	if err != nil {
		switch {
		case apierrors.IsNotFound(err):
			return nil // deleted meanwhile; the next sync creates it again
		case apierrors.IsConflict(err):
			// Changed since observed, or deleted (the UID precondition
			// fails rather than an apply creating it again).
			return err
		}
		return fmt.Errorf("apply %s: %w", what, err)
	}
	noteChange(ctx, changeUpdated, cfg, w.UID, w.ResourceVersion)
	a.applied.remember(apply.Applied{UID: w.UID, Hash: hash, Generation: w.Generation, ResourceVersion: w.ResourceVersion})
	return nil
}

// identity is an object that stands for a write's answer in the write
// log (its UID and resourceVersion), nil if the write made none.
func identity(w written) *unstructured.Unstructured {
	if w.UID == "" {
		return nil
	}
	out := &unstructured.Unstructured{Object: map[string]any{}}
	out.SetUID(types.UID(w.UID))
	out.SetResourceVersion(w.ResourceVersion)
	return out
}

// dropLastApplied removes LastAppliedAnnotation from observed with a merge
// patch carrying its resourceVersion, and returns the object as written.
func (a *Applier) dropLastApplied(ctx context.Context, c dynamic.ResourceInterface, rule *children.Rule, observed *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"resourceVersion": observed.GetResourceVersion(),
		"annotations":     map[string]any{apply.LastAppliedAnnotation: nil},
	}})
	if err != nil {
		return nil, err
	}
	a.metrics.writes.WithLabelValues("drop_last_applied", rule.Resource).Inc()
	finish := startWrite(ctx, ruleKey(rule), observed)
	out, err := c.Patch(ctx, observed.GetName(), types.MergePatchType, patch, metav1.PatchOptions{})
	finish(out)
	return out, err
}

// recreateNeeded is the dry run before the delete of a Recreate child
// under server-side apply: would applying act.Verify change the child
// (apply.Changes)? Ownership alone never recreates a child, and an apply
// the API server refuses (an invalid object, admission) deletes nothing:
// it is an error, with an Event, until the hook's answer is fixed.
func (a *Applier) recreateNeeded(ctx context.Context, c dynamic.ResourceInterface, act children.Action, what string) (bool, error) {
	observed := act.Object
	body, hash, err := apply.Encode(act.Verify, string(observed.GetUID()), observed.GetResourceVersion())
	if err != nil {
		return false, err
	}
	a.metrics.writes.WithLabelValues("apply_dry_run", act.Rule.Resource).Inc()
	_, dry, err := a.ssaPatch(ctx, c, act.Rule, observed.GetNamespace(), observed.GetName(), body, true)
	if err != nil {
		switch {
		case apierrors.IsNotFound(err):
			return false, nil // gone: the next sync creates it
		case apierrors.IsConflict(err):
			return false, err
		}
		return false, fmt.Errorf("dry run of the apply that decides whether to recreate %s (nothing deleted): %w", what, err)
	}
	if apply.Changes(observed.Object, dry) {
		return true, nil
	}
	a.log.Debug("Recreate child unchanged by its apply: kept", zap.String("child", what))
	a.applied.remember(apply.Applied{UID: string(observed.GetUID()), Hash: hash, Generation: observed.GetGeneration(), ResourceVersion: observed.GetResourceVersion()})
	return false, nil
}
