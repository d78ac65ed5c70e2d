package dispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/echo"
)

// TestRaisedFloor: what an answer wrote raises an item's freshness floor
// per resource, never lowers it, and leaves the item's own map alone.
func TestRaisedFloor(t *testing.T) {
	cases := []struct {
		reason         string
		floor, written map[string]string
		want           map[string]string
	}{
		{reason: "nothing written: the floor as it is", floor: map[string]string{"/configmaps": "5"},
			want: map[string]string{"/configmaps": "5"}},
		{reason: "a resource the item did not name is added", floor: map[string]string{"/configmaps": "5"},
			written: map[string]string{"example.com/things": "9"},
			want:    map[string]string{"/configmaps": "5", "example.com/things": "9"}},
		{reason: "a higher version written raises it", floor: map[string]string{"/configmaps": "5"},
			written: map[string]string{"/configmaps": "8"}, want: map[string]string{"/configmaps": "8"}},
		{reason: "a lower version written does not lower it", floor: map[string]string{"/configmaps": "9"},
			written: map[string]string{"/configmaps": "8"}, want: map[string]string{"/configmaps": "9"}},
		{reason: "no floor: what was written", written: map[string]string{"/configmaps": "8"},
			want: map[string]string{"/configmaps": "8"}},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			before := map[string]string{}
			for k, v := range tc.floor {
				before[k] = v
			}
			got := bus.RaisedFloor(tc.floor, tc.written)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("RaisedFloor (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, tc.floor, cmp.Transformer("nilEmpty", func(m map[string]string) map[string]string {
				if m == nil {
					return map[string]string{}
				}
				return m
			})); diff != "" {
				t.Errorf("the item's own floor changed (-before +after):\n%s", diff)
			}
		})
	}
}

// TestAwaitAnswer: a sync of an item whose previous answer this replica
// published waits for that answer's Done note and asks for a snapshot that
// reflects its writes; without the note it goes on once MergeWait has
// passed, with the item's own floor (a lost note costs the wait, never the
// sync); with no answer outstanding it does not wait at all.
func TestAwaitAnswer(t *testing.T) {
	ctrl := bus.ControllerRef{Kind: "CompositeController", Name: "c"}
	item := bus.WorkItem{Controller: ctrl, Parent: bus.ObjectRef{UID: "p"}, Reason: bus.ReasonEvent,
		MinResourceVersions: map[string]string{"/configmaps": "5"}}
	fresh := map[string]string{"/configmaps": "7", "example.com/things": "8"}
	cases := []struct {
		reason string
		// expect publishes an answer first; note records its Done note
		// after the sync started waiting.
		expect, note bool
		want         map[string]string
		result       string // the merge-wait metric's result, "" for no wait
	}{
		{reason: "no answer outstanding: no wait, the item's floor", want: item.MinResourceVersions},
		{reason: "the answer's Done note arrives: the floor raised to its writes", expect: true, note: true,
			want: map[string]string{"/configmaps": "7", "example.com/things": "8"}, result: "applied"},
		{reason: "no Done note: goes on after MergeWait with the item's floor", expect: true,
			want: item.MinResourceVersions, result: "timeout"},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			d := &Dispatcher{cfg: Config{MergeWait: 200 * time.Millisecond}, log: zap.NewNop(), metrics: newMetrics(nil),
				echoes: echo.NewBook(0)}
			if tc.expect {
				d.echoes.Expect(ctrl.ID(), "p", "", 1)
			}
			if tc.note {
				go func() {
					// Once the sync waits (the note can only end a wait it
					// is in, or find the answer ended before it).
					time.Sleep(20 * time.Millisecond)
					d.echoes.Record(&bus.Applied{Controller: ctrl, ParentUID: "p", WorkSeq: 1, Done: true, Fresh: fresh})
				}()
			}
			got := d.awaitAnswer(context.Background(), item)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("floor (-want +got):\n%s", diff)
			}
			for _, result := range []string{"applied", "timeout", "cancelled"} {
				n := histogramCount(t, d.metrics.mergeWaits.WithLabelValues(result))
				if want := map[bool]uint64{true: 1}[result == tc.result]; n != want {
					t.Errorf("merge waits %q: %d, want %d", result, n, want)
				}
			}
		})
	}
}

// histogramCount is how many observations h holds.
func histogramCount(t *testing.T, h prometheus.Observer) uint64 {
	t.Helper()
	var m dto.Metric
	if err := h.(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}
