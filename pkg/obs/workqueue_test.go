package obs

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"

	"github.com/metabus/metabus/internal/testing/obstest"
)

// The workqueue_* families carry controller-runtime's names and labels
// (name and controller both the queue's name), and the running syncs show
// in unfinished_work_seconds and longest_running_processor_seconds until
// they end, then 0.
func TestWorkQueueMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewWorkQueueMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	// A second set on the same registry (another service of the process)
	// shares the families.
	m2, err := NewWorkQueueMetrics(reg)
	if err != nil {
		t.Fatalf("second registration: %v", err)
	}
	q := QueueName("CompositeController", "demo")
	m.Added(q)
	m2.Added(q)
	m.Retried(q)
	m.Waited(q, 3*time.Millisecond)
	done1 := m.Started(q)
	done2 := m2.Started(q)
	time.Sleep(20 * time.Millisecond)
	running := values(t, reg)
	if running["workqueue_unfinished_work_seconds"] < 0.04 || running["workqueue_longest_running_processor_seconds"] < 0.02 ||
		running["workqueue_longest_running_processor_seconds"] > running["workqueue_unfinished_work_seconds"] {
		t.Errorf("while two syncs run for 20ms: %v", running)
	}
	done1()
	done2()
	got := values(t, reg)
	want := map[string]float64{
		"workqueue_adds_total":                        2,
		"workqueue_retries_total":                     1,
		"workqueue_queue_duration_seconds":            1, // observations
		"workqueue_work_duration_seconds":             2,
		"workqueue_unfinished_work_seconds":           0,
		"workqueue_longest_running_processor_seconds": 0,
		"labels": 1,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("after the syncs ended (-want +got):\n%s", diff)
	}
}

// values sums each family (histograms: their sample counts) and sets
// "labels" to 1 if every series is labelled name=controller=the queue.
func values(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{"labels": 1}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if diff := cmp.Diff(map[string]string{"name": "CompositeController-demo", "controller": "CompositeController-demo"}, l); diff != "" {
				t.Logf("%s labels (-want +got):\n%s", mf.GetName(), diff)
				out["labels"] = 0
			}
			out[mf.GetName()] += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	return out
}

// A client-go queue given Provider reports its adds, waits, work, retries
// (items added with a delay) and, once its own ticker ran, its unfinished
// and longest-running figures under the queue's name; depth is left to
// the bus collector, so the registry has no second workqueue_depth.
func TestWorkQueueProvider(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewWorkQueueMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "composite-metacontroller", MetricsProvider: m.Provider()})
	defer q.ShutDown()
	q.Add("CompositeController/a")
	item, _ := q.Get()
	time.Sleep(600 * time.Millisecond) // client-go updates unfinished work every 500ms
	running := obstest.Series(t, reg)
	if got := running[`workqueue_longest_running_processor_seconds{controller="composite-metacontroller",name="composite-metacontroller"}`]; got < 0.4 {
		t.Errorf("longest running while an item is worked on for 600ms = %v", got)
	}
	q.AddRateLimited(item) // a retry
	q.Done(item)
	got := obstest.Series(t, reg)
	want := map[string]float64{
		`workqueue_adds_total{controller="composite-metacontroller",name="composite-metacontroller"}`:             1,
		`workqueue_retries_total{controller="composite-metacontroller",name="composite-metacontroller"}`:          1,
		`workqueue_queue_duration_seconds{controller="composite-metacontroller",name="composite-metacontroller"}`: 1,
		`workqueue_work_duration_seconds{controller="composite-metacontroller",name="composite-metacontroller"}`:  1,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	for k := range got {
		if strings.HasPrefix(k, "workqueue_depth") {
			t.Errorf("the provider reports %s: the bus collector owns workqueue_depth", k)
		}
	}
	var nilMetrics *WorkQueueMetrics
	if p := nilMetrics.Provider(); p != nil {
		t.Errorf("nil metrics provide %v, want nil (client-go's global provider)", p)
	}
}

// A queue made with QueueClock asks for its 500 ms gauge ticker and gets
// one of QueueGaugePeriod; longer periods (the delaying queue's 10 s
// heartbeat) are kept.
func TestQueueClockTickers(t *testing.T) {
	cases := []struct {
		reason string
		asked  time.Duration
		want   time.Duration
	}{
		{reason: "client-go's unfinished-work ticker is stretched", asked: 500 * time.Millisecond, want: QueueGaugePeriod},
		{reason: "the delaying queue's heartbeat is kept", asked: 10 * time.Second, want: 10 * time.Second},
		{reason: "a longer ticker is kept", asked: time.Minute, want: time.Minute},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			if diff := cmp.Diff(c.want, gaugePeriod(c.asked)); diff != "" {
				t.Errorf("gaugePeriod(%s) (-want +got):\n%s", c.asked, diff)
			}
		})
	}
	tk := QueueClock().NewTicker(time.Millisecond)
	defer tk.Stop()
	select {
	case <-tk.C():
		t.Errorf("a ticker asked for 1ms fired within 50ms: QueueClock does not stretch it to %s", QueueGaugePeriod)
	case <-time.After(50 * time.Millisecond):
	}
}
