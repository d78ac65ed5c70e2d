package watcher

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/record"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/events/recorder"
)

// TestCheckAnnotations: an ignored metabus annotation value is reported on
// the controller, saying what applies instead; valid or absent ones are not.
func TestCheckAnnotations(t *testing.T) {
	cases := []struct {
		reason      string
		annotations map[string]string
		want        []string
	}{
		{reason: "none", want: nil},
		{reason: "opted in", annotations: map[string]string{bus.SuppressEchoesAnnotation: "true"}, want: nil},
		{
			reason: "not a boolean", annotations: map[string]string{bus.SuppressEchoesAnnotation: "sometimes"},
			want: []string{`Warning InvalidAnnotation annotation metabus.dev/suppress-echoes="sometimes": want true or false; echoes are not suppressed: every change reaches the hook`},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			fake := record.NewFakeRecorder(10)
			w := &Watcher{rec: &recorder.Recorder{EventRecorder: fake}}
			obj := &unstructured.Unstructured{}
			obj.SetAPIVersion("metacontroller.k8s.io/v1alpha1")
			obj.SetKind("CompositeController")
			obj.SetName("c")
			obj.SetAnnotations(c.annotations)
			w.checkAnnotations(obj)
			close(fake.Events)
			var got []string
			for e := range fake.Events {
				got = append(got, e)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("Events (-want +got):\n%s", diff)
			}
		})
	}
}
