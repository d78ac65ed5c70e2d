package applier

import (
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/resourceversion"

	"github.com/metabus/metabus/pkg/bus"
)

// maxWritten bounds the read-your-writes memory; past it, it starts over
// (losing it only costs a possible conflict and requeue).
const maxWritten = 100000

// wrote remembers the resourceVersion a write of the parent produced. The
// next desired state of that parent may have been computed from a snapshot
// taken before the write; without this the applier would compare against
// the stale cached parent and write with its stale resourceVersion: a 409,
// a requeue and one more hook call (measured on 11-25% of idle changes).
func (a *Applier) wrote(ds *bus.DesiredState, out *unstructured.Unstructured) {
	if out == nil || out.GetResourceVersion() == "" {
		return
	}
	gv, err := schema.ParseGroupVersion(ds.Parent.APIVersion)
	if err != nil {
		return
	}
	key := ds.Controller.ID() + "/" + ds.Parent.UID
	a.wmu.Lock()
	defer a.wmu.Unlock()
	if len(a.written) >= maxWritten {
		a.written = map[string]string{}
	}
	a.written[key] = gv.Group + "/" + ds.Parent.Resource + "=" + out.GetResourceVersion()
}

// freshness is the snapshot floor for applying ds: what the hook saw, and
// this replica's own last write of the parent.
func (a *Applier) freshness(ds *bus.DesiredState) map[string]string {
	a.wmu.Lock()
	w, ok := a.written[ds.Controller.ID()+"/"+ds.Parent.UID]
	a.wmu.Unlock()
	if !ok {
		return ds.MinResourceVersions
	}
	gr, rv, _ := strings.Cut(w, "=")
	out := make(map[string]string, len(ds.MinResourceVersions)+1)
	for k, v := range ds.MinResourceVersions {
		out[k] = v
	}
	if cur, ok := out[gr]; !ok {
		out[gr] = rv
	} else if c, err := resourceversion.CompareResourceVersion(rv, cur); err == nil && c > 0 {
		out[gr] = rv
	}
	return out
}
