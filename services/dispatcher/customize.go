package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/hooks"
	"github.com/metabus/metabus/pkg/inspect"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/related"
	"github.com/metabus/metabus/pkg/snapshot"
)

// maxCustomizeCache bounds the customize cache; past it the cache starts
// over (entries are cheap to rebuild: one hook call per parent).
const maxCustomizeCache = 100000

type customizeEntry struct {
	generation int64
	rules      *bus.RelatedRules
}

// relatedKey keys the customize cache: per parent, not per item, since the
// customize hook answers for the parent (and its generation) as a whole.
func relatedKey(item bus.WorkItem) string {
	return bus.ParentKey(item.Controller.ID(), item.Parent.UID)
}

// cachedRelated returns the rules last computed for the parent, to send
// with the snapshot request (nil if none).
func (d *Dispatcher) cachedRelated(item bus.WorkItem) *bus.RelatedRules {
	d.cmu.Lock()
	defer d.cmu.Unlock()
	if e, ok := d.customize[relatedKey(item)]; ok {
		return e.rules
	}
	return nil
}

// forgetRelated drops the parent's cached rules: the next sync calls the
// customize hook again.
func (d *Dispatcher) forgetRelated(item bus.WorkItem) {
	d.cmu.Lock()
	delete(d.customize, relatedKey(item))
	d.cmu.Unlock()
}

// customizeRules returns the parent's related-resource rules from the
// controller's customize hook, calling it only when the parent's
// generation changed since the last call (as upstream caches by UID and
// generation).
func (d *Dispatcher) customizeRules(ctx context.Context, item bus.WorkItem, c kinds.Controller, hook *v1alpha1.Hook, ctrlObj any, parent *unstructured.Unstructured) (*bus.RelatedRules, error) {
	key := relatedKey(item)
	d.cmu.Lock()
	e, ok := d.customize[key]
	d.cmu.Unlock()
	if ok && e.generation == parent.GetGeneration() {
		return e.rules, nil
	}
	version := kinds.HookVersion(hook)
	var resp hookapi.CustomizeResponse
	start := time.Now()
	it := hooks.Item{Controller: item.Controller, ControllerName: c.Object().GetName(), Parent: item.Parent, Endpoints: c.SyncEndpoints()}
	err := d.hooks.Do(ctx, it.CustomizeCall(hook, hookapi.CustomizeRequest{Controller: ctrlObj, Parent: parent}), &resp)
	inspect.SyncOf(ctx).Hook(bus.HookCustomize, time.Since(start), err)
	if err != nil {
		return nil, fmt.Errorf("customize hook failed: %w", err)
	}
	rules, err := related.Accept(item.Controller, parent, version, resp.RelatedResources, d.relatedPolicy)
	if err != nil {
		return nil, err
	}
	d.cmu.Lock()
	if len(d.customize) >= maxCustomizeCache {
		d.customize = map[string]customizeEntry{}
	}
	d.customize[key] = customizeEntry{generation: parent.GetGeneration(), rules: rules}
	d.cmu.Unlock()
	return rules, nil
}

// withRelated broadcasts the parent's rules and, if the snapshot was taken
// with other (or no) rules, takes it again with these.
func (d *Dispatcher) withRelated(ctx context.Context, item bus.WorkItem, sreq snapshot.Request, snap *snapshot.Response, rules *bus.RelatedRules) (*snapshot.Response, error) {
	d.broadcastRelated(rules)
	if sameRules(rules, sreq.Related) {
		return snap, nil
	}
	sreq.Related = rules
	snap, err := snapshot.Fetch(ctx, d.snaps, sreq, d.cfg.SnapshotWait)
	if err == nil && snap.Result == snapshot.Invalid {
		// The customize hook asked for related objects that cannot be
		// watched: the user's to fix, so say so on the parent, and ask
		// the hook again on the retry.
		d.forgetRelated(item)
		return nil, failure(fmt.Errorf("related resources cannot be observed: %s", snap.Message))
	}
	if err == nil && snap.Result != snapshot.OK {
		err = fmt.Errorf("%s: %s", snap.Result, snap.Message)
	}
	if err != nil {
		return nil, quietFailure(fmt.Errorf("observed state with related objects: %w", err))
	}
	return snap, nil
}

// sameRules reports whether two rule sets are equal.
func sameRules(a, b *bus.RelatedRules) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.HookVersion == b.HookVersion && a.ParentNamespace == b.ParentNamespace && reflect.DeepEqual(a.Rules, b.Rules)
}

// broadcastRelated tells every watcher replica the parent's rules, so the
// one that publishes work items maps related-object changes to it.
func (d *Dispatcher) broadcastRelated(rules *bus.RelatedRules) {
	if d.nc == nil || rules == nil {
		return
	}
	data, err := json.Marshal(rules)
	if err != nil {
		return
	}
	if err := d.nc.Publish(bus.RelatedSubject, data); err != nil {
		d.log.Debug("broadcast related rules", zap.Error(err))
	}
}
