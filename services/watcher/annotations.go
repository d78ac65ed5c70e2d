package watcher

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/events"
)

// checkAnnotations reports, on the controller object, a metabus annotation
// whose value is ignored. An invalid bus.SuppressEchoesAnnotation leaves
// the controller under upstream's contract (every change reaches its hook),
// which is safe, but its author asked for something else and must hear why
// they do not get it. The Event recorder's per-object spam filter keeps a
// controller changed often from flooding its Events.
func (w *Watcher) checkAnnotations(obj *unstructured.Unstructured) {
	if _, err := bus.ParseSuppressEchoes(obj.GetAnnotations()[bus.SuppressEchoesAnnotation]); err != nil {
		w.rec.Warning(obj, events.ReasonInvalidAnnotation, err.Error()+"; echoes are not suppressed: every change reaches the hook")
	}
}
