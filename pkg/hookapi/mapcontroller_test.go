package hookapi

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// TestMapRequestsGoldenJSON pins the bytes map and tombstone hooks receive: field names and
// order, and {} (never null) for outputs, with every declared output type present.
func TestMapRequestsGoldenJSON(t *testing.T) {
	controller := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "MapController",
		"metadata": map[string]any{"name": "snap"},
	}}
	parent := obj("ctl.example.com/v1", "SnapshotSchedule", "ns", "s")
	pvc := obj("v1", "PersistentVolumeClaim", "ns", "data-0")
	snap := obj("snapshot.storage.k8s.io/v1", "VolumeSnapshot", "ns", "data-0-1")

	outputs := NewObjectMap(v1alpha1.HookVersionV1, true)
	outputs.Ensure("snapshot.storage.k8s.io/v1", "VolumeSnapshot")
	outputs.Ensure("v1", "ConfigMap")
	if err := outputs.Add(snap, true); err != nil {
		t.Fatal(err)
	}
	const ctl = `{"controller":{"apiVersion":"metacontroller.k8s.io/v1alpha1","kind":"MapController","metadata":{"name":"snap"}},` +
		`"parent":{"apiVersion":"ctl.example.com/v1","kind":"SnapshotSchedule","metadata":{"name":"s","namespace":"ns"}},`
	const snapMap = `{"ConfigMap.v1":{},"VolumeSnapshot.snapshot.storage.k8s.io/v1":{"data-0-1":{"apiVersion":"snapshot.storage.k8s.io/v1","kind":"VolumeSnapshot","metadata":{"name":"data-0-1","namespace":"ns"}}}}`

	cases := []struct {
		reason string
		req    any
		want   string
	}{
		{
			reason: "map: the input and the outputs of its key",
			req:    MapRequest{Controller: controller, Parent: parent, MapKey: "k1", Input: pvc, Outputs: outputs.Map()},
			want: ctl + `"mapKey":"k1",` +
				`"input":{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"data-0","namespace":"ns"}},` +
				`"outputs":` + snapMap + `}`,
		},
		{
			reason: "map: a new input has no outputs yet, still {}",
			req:    MapRequest{Controller: controller, Parent: parent, MapKey: "k1", Input: pvc},
			want: ctl + `"mapKey":"k1",` +
				`"input":{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"data-0","namespace":"ns"}},` +
				`"outputs":{}}`,
		},
		{
			reason: "tombstone: no input, only the detached outputs",
			req:    TombstoneRequest{Controller: controller, Parent: parent, MapKey: "k1", Outputs: outputs.Map()},
			want:   ctl + `"mapKey":"k1","outputs":` + snapMap + `}`,
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			got, err := json.Marshal(c.req)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.want, string(got)); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
		})
	}
}

func TestDecodeMapResponse(t *testing.T) {
	const snap = `{"apiVersion":"snapshot.storage.k8s.io/v1","kind":"VolumeSnapshot","metadata":{"name":"s-1"},"spec":{"n":3}}`
	cases := []struct {
		reason  string
		body    string
		strict  bool
		want    *MapResponse
		wantErr *ObjectError // compared when the error is an *ObjectError
		errText bool         // an error without an index is expected
	}{
		{
			reason: "outputs and a resync; integers stay int64",
			body:   `{"outputs":[` + snap + `],"resyncAfterSeconds":2.5}`,
			strict: true,
			want: &MapResponse{
				Outputs: OutputList{{Object: map[string]any{
					"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
					"metadata": map[string]any{"name": "s-1"}, "spec": map[string]any{"n": int64(3)},
				}}},
				ResyncAfterSeconds: 2.5,
			},
		},
		{reason: "null outputs: none wanted (all observed outputs of the key go)", body: `{"outputs":null}`, strict: true, want: &MapResponse{}},
		{reason: "empty object: none wanted", body: `{}`, strict: true, want: &MapResponse{}},
		{reason: "loose ignores unknown fields", body: `{"outputs":[],"status":{"x":1}}`, want: &MapResponse{Outputs: OutputList{}}},
		{reason: "strict rejects unknown fields (a map hook returns no status)", body: `{"outputs":[],"status":{"x":1}}`, strict: true, errText: true},
		{reason: "strict rejects duplicate fields", body: `{"outputs":[],"outputs":[]}`, strict: true, errText: true},
		{reason: "keys are case-sensitive: Outputs is not outputs", body: `{"Outputs":[` + snap + `]}`, want: &MapResponse{}},
		{reason: "outputs not a list", body: `{"outputs":{"a":1}}`, errText: true},
		{
			reason:  "a null entry fails the whole list, naming it",
			body:    `{"outputs":[` + snap + `,null]}`,
			wantErr: &ObjectError{List: "outputs", Index: 1, Reason: "must be an object, got null"},
		},
		{
			reason:  "an entry without a name fails the whole list",
			body:    `{"outputs":[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"generateName":"c-"}}]}`,
			strict:  true,
			wantErr: &ObjectError{List: "outputs", Index: 0, APIVersion: "v1", Kind: "ConfigMap", Reason: "metadata.name is missing"},
		},
		{reason: "not JSON", body: `{"outputs":[`, errText: true},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			var got MapResponse
			err := Decode([]byte(c.body), c.strict, &got)
			checkDecoded(t, err, c.errText, c.wantErr)
			if c.want != nil {
				if diff := cmp.Diff(c.want, &got); diff != "" {
					t.Errorf("response (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func TestDecodeTombstoneResponse(t *testing.T) {
	keep := `{"apiVersion":"snapshot.storage.k8s.io/v1","kind":"VolumeSnapshot","metadata":{"name":"s-1","namespace":"ns"}}`
	cases := []struct {
		reason  string
		body    string
		strict  bool
		want    *TombstoneResponse
		wantErr *ObjectError
		errText bool
	}{
		{
			reason: "the outputs to keep",
			body:   `{"outputs":[` + keep + `]}`,
			strict: true,
			want: &TombstoneResponse{Outputs: OutputList{{Object: map[string]any{
				"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
				"metadata": map[string]any{"name": "s-1", "namespace": "ns"},
			}}}},
		},
		{reason: "absent outputs: keep nothing", body: `{}`, strict: true, want: &TombstoneResponse{}},
		{reason: "null outputs: keep nothing", body: `{"outputs":null}`, want: &TombstoneResponse{}},
		{reason: "strict rejects resyncAfterSeconds: the tombstone hook is asked again on each resync instead", body: `{"outputs":[],"resyncAfterSeconds":5}`, strict: true, errText: true},
		{reason: "loose ignores it", body: `{"outputs":[],"resyncAfterSeconds":5}`, want: &TombstoneResponse{Outputs: OutputList{}}},
		{
			reason:  "an entry that cannot name an output fails the whole list (keeping the wrong ones would delete the rest)",
			body:    `{"outputs":[` + keep + `,{"kind":"VolumeSnapshot","metadata":{"name":"s-2"}}]}`,
			wantErr: &ObjectError{List: "outputs", Index: 1, Kind: "VolumeSnapshot", Name: "s-2", Reason: "apiVersion is missing"},
		},
		{reason: "body is a list", body: `[]`, errText: true},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			var got TombstoneResponse
			err := Decode([]byte(c.body), c.strict, &got)
			checkDecoded(t, err, c.errText, c.wantErr)
			if c.want != nil {
				if diff := cmp.Diff(c.want, &got); diff != "" {
					t.Errorf("response (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// checkDecoded compares a decoding error with what a case expects: none, one without an index
// (errText), or exactly the *ObjectError wantErr.
func checkDecoded(t *testing.T, err error, errText bool, wantErr *ObjectError) {
	t.Helper()
	switch {
	case wantErr != nil:
		var oe *ObjectError
		if !errors.As(err, &oe) {
			t.Fatalf("error %v, want an *ObjectError", err)
		}
		if diff := cmp.Diff(wantErr, oe); diff != "" {
			t.Errorf("*ObjectError (-want +got):\n%s", diff)
		}
	case errText:
		if err == nil {
			t.Fatal("decoded, want an error")
		}
	case err != nil:
		t.Fatalf("unexpected error %v", err)
	}
}
