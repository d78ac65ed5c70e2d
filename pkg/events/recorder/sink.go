package recorder

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/kubeapi"
)

// objectKinds is the scheme the recorder asks for the kind of an object
// that does not carry one. Every caller passes an
// *unstructured.Unstructured with apiVersion and kind set, which needs no
// scheme at all; core/v1 is there so a typed core object would work too.
// client-go's kubernetes/scheme.Scheme, the recorder's usual scheme,
// registers every API group at init (megabytes of RSS) for nothing here.
var objectKinds = func() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = corev1.AddToScheme(s) // cannot fail on a new scheme
	return s
}()

// eventsGVR is where core Events live.
var eventsGVR = corev1.SchemeGroupVersion.WithResource("events")

// Sink is the recorder's record.EventSink over kubeapi: it creates Events
// and patches them (the recorder's count of repeats) in the event's own
// namespace, as client-go's typed EventSinkImpl does, without the typed
// clientset.
//
// Its errors are the REST client's, unwrapped, on purpose: the recorder
// tells an Event the API server rejected (*apierrors.StatusError: dropped)
// from a transport failure (retried), and a patch of an Event that no
// longer exists (NotFound: created instead), by type assertions on the
// error, which a wrapped error would defeat.
type Sink struct {
	API *kubeapi.Client
}

// withType is event with the apiVersion and kind a typed client would send.
func withType(event *corev1.Event) *corev1.Event {
	e := *event
	e.APIVersion, e.Kind = "v1", "Event"
	return &e
}

// Create creates event in its namespace.
func (s Sink) Create(event *corev1.Event) (*corev1.Event, error) {
	out := &corev1.Event{}
	if err := s.API.Create(context.Background(), kubeapi.Path(eventsGVR, event.Namespace, "", ""), withType(event), out); err != nil {
		return nil, err
	}
	return out, nil
}

// Update replaces event (at its resourceVersion).
func (s Sink) Update(event *corev1.Event) (*corev1.Event, error) {
	out := &corev1.Event{}
	if err := s.API.Update(context.Background(), kubeapi.Path(eventsGVR, event.Namespace, event.Name, ""), withType(event), out); err != nil {
		return nil, err
	}
	return out, nil
}

// Patch applies the recorder's strategic merge patch data to the Event
// named by event.
func (s Sink) Patch(event *corev1.Event, data []byte) (*corev1.Event, error) {
	out := &corev1.Event{}
	if err := s.API.Patch(context.Background(), kubeapi.Path(eventsGVR, event.Namespace, event.Name, ""), types.StrategicMergePatchType, data, out); err != nil {
		return nil, err
	}
	return out, nil
}
