package hooks

import (
	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
)

// Item is what a hook call of one work item says about where it comes
// from: the controller, the parent as observed, the item (its map key) and
// the work item's stream sequence. The dispatcher makes its calls from it,
// and so does `metabus render`, so that both send the same request.
type Item struct {
	Controller bus.ControllerRef
	// ControllerName is the controller object's name (metrics label).
	ControllerName string
	Parent         bus.ObjectRef
	MapKey         string
	// WorkSeq is the work item's MC_WORK sequence (0 outside the bus).
	WorkSeq   uint64
	Endpoints []v1alpha1.EndpointConfig
}

// SyncCall is the call of a sync-like hook (sync, finalize, map,
// tombstone) for the item: CloudEvent id <parentUID>:<workseq>, the parent
// UID, work sequence and item key as extensions, and the ETag cache keyed
// by cacheKey.
func (it Item) SyncCall(hook *v1alpha1.Hook, kind, cacheKey string, request any) Call {
	return Call{
		Hook:            hook,
		EndpointConfigs: it.Endpoints,
		Kind:            kind,
		ControllerType:  it.Controller.Kind,
		ControllerName:  it.ControllerName,
		Source:          bus.ControllerSource(it.Controller),
		Subject:         bus.ObjectPath(it.Parent),
		ID:              bus.DesiredMsgID(it.Parent.UID, it.WorkSeq),
		Extensions: map[string]string{
			bus.ExtParentUID:    it.Parent.UID,
			bus.ExtWorkSeq:      bus.WorkSeqString(it.WorkSeq),
			bus.ExtPartitionKey: bus.ItemKey(it.Controller.ID(), it.Parent.UID, it.MapKey),
		},
		CacheKey: cacheKey,
		Request:  request,
	}
}

// CustomizeCall is the customize hook's call for the item's parent.
func (it Item) CustomizeCall(hook *v1alpha1.Hook, request any) Call {
	return Call{
		Hook:            hook,
		EndpointConfigs: it.Endpoints,
		Kind:            bus.HookCustomize,
		ControllerType:  it.Controller.Kind,
		ControllerName:  it.ControllerName,
		Source:          bus.ControllerSource(it.Controller),
		Subject:         bus.ObjectPath(it.Parent),
		Extensions:      map[string]string{bus.ExtParentUID: it.Parent.UID},
		Request:         request,
	}
}
