package applier

import (
	"context"

	"go.uber.org/zap"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/resourceversion"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/echo"
	ctlid "github.com/metabus/metabus/pkg/identity"
)

// maxWritten bounds the read-your-writes memory; past it, it starts over
// (losing it only costs a possible conflict and requeue).
const maxWritten = 100000

// wrote remembers the resourceVersion a write of the parent produced. The
// next desired state of that parent may have been computed from a snapshot
// taken before the write; without this the applier would compare against
// the stale cached parent and write with its stale resourceVersion: a 409,
// a requeue and one more hook call (measured on 11-25% of idle changes).
//
// It is kept per parent, not per item: the write is of the parent, and
// every item of it (each map key, the per-parent one) observes the parent.
// Keys apply in parallel, so the newest write wins, not the last to report.
func (a *Applier) wrote(ds *bus.DesiredState, out *unstructured.Unstructured) {
	if out == nil || out.GetResourceVersion() == "" {
		return
	}
	gv, err := schema.ParseGroupVersion(ds.Parent.APIVersion)
	if err != nil {
		return
	}
	key := parentKey(ds)
	gr, rv := bus.FreshnessKey(gv.Group, ds.Parent.Resource), out.GetResourceVersion()
	a.wmu.Lock()
	defer a.wmu.Unlock()
	if len(a.written) >= maxWritten {
		a.written = map[string]ownWrite{}
	}
	if prev, ok := a.written[key]; ok && prev.gr == gr {
		if c, err := resourceversion.CompareResourceVersion(prev.rv, rv); err == nil && c > 0 {
			return
		}
	}
	a.written[key] = ownWrite{gr: gr, rv: rv}
}

// ownWrite is this replica's write of a parent: its freshness key
// (bus.FreshnessKey) and the resourceVersion the write produced.
type ownWrite struct{ gr, rv string }

// parentKey keys this replica's own writes of ds's parent.
func parentKey(ds *bus.DesiredState) string { return bus.ParentKey(ds.Controller.ID(), ds.Parent.UID) }

// freshness is the snapshot floor for applying ds: what the hook saw, and
// this replica's own last write of the parent.
func (a *Applier) freshness(ds *bus.DesiredState) map[string]string {
	a.wmu.Lock()
	w, ok := a.written[parentKey(ds)]
	a.wmu.Unlock()
	if !ok {
		return ds.MinResourceVersions
	}
	return bus.RaisedFloor(ds.MinResourceVersions, map[string]string{w.gr: w.rv})
}

// writeLog collects what one apply wrote: the updates, as "object U from
// resourceVersion A (the write's precondition) to B", for the Applied notes
// that let watchers and dispatchers drop the echoes of a controller that
// opted into echo suppression (creates are logged as writes from "", which
// only a keyed item takes for an echo; deletes are not logged), and the
// highest resourceVersion written per resource, for the Done note.
type writeLog struct {
	writes []bus.Write
	// fresh is the highest resourceVersion a write of this apply produced
	// per resource (bus.FreshnessKey), for the Done note: the next sync of
	// the item waits for a snapshot that reflects all of them.
	fresh map[string]string
	// onWrite tells watchers and dispatchers at once: the event of a
	// write can reach them before the apply has finished.
	onWrite func(bus.Write)
	// begin announces a write in flight to this process's Book (whose
	// dispatchers then wait for it rather than call the hook on its echo).
	begin func(uid, from string) func(to string)
	// changes, set when events are published (--bus-events), lists the
	// children created, updated and deleted (noteChange).
	changes *bus.AppliedEvent
	// identity is the one the apply's writes impersonated (noteIdentity;
	// none: the applier's own), which a refusal's Event names.
	identity ctlid.Identity
}

type writeLogKey struct{}

func withWriteLog(ctx context.Context, wl *writeLog) context.Context {
	return context.WithValue(ctx, writeLogKey{}, wl)
}

// startWrite announces an update of base (the object as written against)
// to this process's Book; call the returned function with the written
// object, or nil if the write failed. A successful update is logged.
//
// gr is the object's resource (bus.FreshnessKey).
func startWrite(ctx context.Context, gr string, base *unstructured.Unstructured) func(out *unstructured.Unstructured) {
	wl, _ := ctx.Value(writeLogKey{}).(*writeLog)
	if wl == nil || base == nil || base.GetResourceVersion() == "" {
		return func(out *unstructured.Unstructured) {
			if wl != nil && out != nil {
				wl.saw(gr, out.GetResourceVersion())
			}
		}
	}
	uid, from := string(base.GetUID()), base.GetResourceVersion()
	done := func(string) {}
	if wl.begin != nil {
		done = wl.begin(uid, from)
	}
	return func(out *unstructured.Unstructured) {
		if out == nil || string(out.GetUID()) != uid || out.GetResourceVersion() == "" {
			done("")
			return
		}
		w := bus.Write{UID: uid, From: from, To: out.GetResourceVersion()}
		wl.writes = append(wl.writes, w)
		wl.saw(gr, w.To)
		done(w.To)
		if wl.onWrite != nil {
			wl.onWrite(w)
		}
	}
}

// noteCreated logs the create of an object as a write from "" (what the
// echo book reads as "this controller created it": an echo to a keyed
// item's hook, news to a per-parent one).
func noteCreated(ctx context.Context, gr string, out written) {
	wl, _ := ctx.Value(writeLogKey{}).(*writeLog)
	if wl == nil || out.UID == "" || out.ResourceVersion == "" {
		return
	}
	wl.saw(gr, out.ResourceVersion)
	w := bus.Write{UID: out.UID, To: out.ResourceVersion}
	wl.writes = append(wl.writes, w)
	if wl.onWrite != nil {
		wl.onWrite(w)
	}
}

// saw records that a write produced resourceVersion rv of resource gr.
func (wl *writeLog) saw(gr, rv string) {
	if gr == "" || rv == "" {
		return
	}
	if wl.fresh == nil {
		wl.fresh = map[string]string{}
	}
	bus.RaiseResourceVersion(wl.fresh, gr, rv)
}

// ruleKey is the freshness key (bus.FreshnessKey) of a child rule's
// resource ("" if its apiVersion does not parse).
func ruleKey(rule *children.Rule) string {
	if rule == nil {
		return ""
	}
	gv, err := schema.ParseGroupVersion(rule.APIVersion)
	if err != nil {
		return ""
	}
	return bus.FreshnessKey(gv.Group, rule.Resource)
}

// parentFreshKey is the freshness key of ds's parent's resource.
func parentFreshKey(ds *bus.DesiredState) string {
	gv, err := schema.ParseGroupVersion(ds.Parent.APIVersion)
	if err != nil {
		return ""
	}
	return bus.FreshnessKey(gv.Group, ds.Parent.Resource)
}

// newWriteLog starts the write log of applying ds.
func (a *Applier) newWriteLog(ds *bus.DesiredState) *writeLog {
	wl := &writeLog{}
	if a.cfg.BusEvents {
		wl.changes = &bus.AppliedEvent{}
	}
	if len(ds.Inputs) > 0 {
		ctrl := ds.Controller.ID()
		if a.echoes != nil {
			wl.begin = func(uid, from string) func(string) { return a.echoes.Begin(ctrl, uid, from) }
		}
		wl.onWrite = func(w bus.Write) {
			a.publishNote(&bus.Applied{Controller: ds.Controller, ParentUID: ds.Parent.UID, MapKey: ds.MapKey, WorkSeq: ds.WorkSeq, Writes: []bus.Write{w}})
		}
	}
	return wl
}

// noteDone broadcasts that ds was settled (bus.Applied.Done), with the
// highest resourceVersion its writes produced per resource: the dispatcher
// that published ds waits for it before syncing ds's item again, so that
// the hook sees every write of the answer in one call. complete says ds
// was applied completely (ok, or nothing to do): only then does a desired
// state that lists its inputs (echo suppression) also carry them, and its
// writes, as ds's item's echo reference (never another key's). A rolling
// update's sync also depends on ControllerRevisions, so its desired states
// list no inputs and its writes are never treated as echoes.
func (a *Applier) noteDone(ds *bus.DesiredState, wl *writeLog, complete bool) {
	note := &bus.Applied{Controller: ds.Controller, ParentUID: ds.Parent.UID, MapKey: ds.MapKey, WorkSeq: ds.WorkSeq, Done: true,
		Strategy: string(a.cfg.Strategy)}
	if wl != nil {
		note.Fresh = wl.fresh
	}
	if complete && len(ds.Inputs) > 0 {
		note.Inputs = ds.Inputs
		if wl != nil {
			note.Writes = wl.writes
		}
	}
	a.publishNote(note)
}

// publishNote records a note in this process's Book, if it shares one, and
// broadcasts it to the others.
func (a *Applier) publishNote(note *bus.Applied) {
	a.echoes.Record(note) // nil-safe: only in a composed process
	if a.nc == nil {
		return
	}
	if err := echo.Publish(a.nc, note, a.echoes.Origin()); err != nil {
		a.log.Debug("publish applied note", zap.Error(err))
	}
}
