// Package recorder records Kubernetes Events on parents and controllers,
// rate limited per object so a failing hook cannot flood the API server.
// The reasons it is given are package events' constants.
package recorder

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/metabus/metabus/pkg/kubeapi"
)

// Options tune the per-object spam filter (upstream flags --events-qps and
// --events-burst).
type Options struct {
	QPS   float32
	Burst int
	// Component is the reporting component ("metabus-dispatcher"...).
	Component string
}

// Recorder records events.
type Recorder struct {
	record.EventRecorder
	broadcaster record.EventBroadcaster
}

// New starts a broadcaster writing through client.
func New(client *kubeapi.Client, o Options) *Recorder {
	opts := record.CorrelatorOptions{}
	if o.QPS > 0 {
		opts.QPS = o.QPS
	}
	if o.Burst > 0 {
		opts.BurstSize = o.Burst
	}
	b := record.NewBroadcasterWithCorrelatorOptions(opts)
	b.StartRecordingToSink(Sink{API: client})
	return &Recorder{
		EventRecorder: b.NewRecorder(objectKinds, corev1.EventSource{Component: o.Component}),
		broadcaster:   b,
	}
}

// Shutdown flushes and stops the broadcaster.
func (r *Recorder) Shutdown(context.Context) { r.broadcaster.Shutdown() }

// Warning records a Warning event.
func (r *Recorder) Warning(obj runtime.Object, reason, msg string) {
	if r == nil || obj == nil {
		return
	}
	r.Event(obj, corev1.EventTypeWarning, reason, msg)
}

// Normal records a Normal event.
func (r *Recorder) Normal(obj runtime.Object, reason, msg string) {
	if r == nil || obj == nil {
		return
	}
	r.Event(obj, corev1.EventTypeNormal, reason, msg)
}
