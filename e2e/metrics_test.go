package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/deploy/monitoring"
	"github.com/metabus/metabus/internal/testing/testnats"
)

// TestMetrics scrapes live metabus processes (the real binaries) over HTTP
// while they run a CompositeController whose sync hook fails once per
// parent (a retry) and which has customize and finalize hooks, and checks
// every metric family and label set they expose against the lists in
// deploy/monitoring/metrics (upstream.txt, taken from upstream
// Metacontroller's source, and metabus.txt): nothing exported that is not
// listed, every series with exactly its listed labels and type, and every
// listed family that is not optional present. It runs the all-in-one
// binary (embedded JetStream, leader election on), then the four services
// as separate processes against a nats-server loaded from the shipped
// deploy/nats/nats-server.conf (each as its own NATS user, so the leading
// watcher's bus metrics are read under its production permissions).
func TestMetrics(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binaries")
	}
	// Most of its time is other processes starting and being scraped.
	waitsInParallel(t)
	exported, err := monitoring.Exported()
	if err != nil {
		t.Fatal(err)
	}
	bin := serviceBinaries(t)

	t.Run("all-in-one", func(t *testing.T) {
		ns := newNamespace(t)
		label := "metrics-all-in-one"
		addr := freeAddr(t)
		runBinary(t, bin, "metabus", "--kubeconfig="+env.Kubeconfig, "--metrics-address="+addr, "--health-probe-bind-address=0",
			"--target-label-selector=metabus.dev/e2e="+label, "--discovery-interval=5s",
			"--leader-election", "--leader-election-namespace="+ns, "--leader-election-id=metabus-metrics",
			"--nats-store-dir="+t.TempDir(), "--nats-listen=-")
		exerciseForMetrics(t, ns, label)
		scrapeUntilComplete(t, exported, map[string]string{"metabus": addr}, func(got map[string]map[string]*dto.MetricFamily) error {
			return errors.Join(wantSeries(got["metabus"], "leader_election_master_status", map[string]string{"name": "metabus-metrics"}, 1),
				wantReconciled(got["metabus"]))
		})
	})

	t.Run("separate-processes", func(t *testing.T) {
		ns := newNamespace(t)
		nats := testnats.StartProduction(t, "../deploy/nats/nats-server.conf")
		label := "metrics-separate"
		addrs := map[string]string{}
		for _, svc := range []struct {
			name string
			args []string
		}{
			{"watcher", []string{"--target-label-selector=metabus.dev/e2e=" + label, "--discovery-interval=5s"}},
			{"dispatcher", nil},
			{"applier", []string{"--discovery-interval=5s"}},
			{"revisions", nil},
		} {
			addrs[svc.name] = freeAddr(t)
			args := append([]string{"--kubeconfig=" + serviceKubeconfig(t, svc.name), "--nats-url=" + nats.URL, "--nats-nkey=" + nats.Seeds[svc.name],
				"--metrics-address=" + addrs[svc.name], "--health-probe-bind-address=0"}, svc.args...)
			runBinary(t, bin, svc.name, args...)
		}
		exerciseForMetrics(t, ns, label)
		scrapeUntilComplete(t, exported, addrs, func(got map[string]map[string]*dto.MetricFamily) error {
			// The bus's state comes from the (only, hence leading) watcher.
			return errors.Join(wantSeries(got["watcher"], "metabus_bus_stats_up", nil, 1), wantReconciled(got["watcher"]))
		})
	})
}

// exerciseForMetrics makes every non-optional metric appear: a
// CompositeController with sync (failing once per parent: a retry),
// customize and finalize hooks, reached by host name (DNS events), syncs
// a parent, which is then deleted (finalize).
func exerciseForMetrics(t *testing.T, ns, label string) {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	calls := map[string]int{}
	hook := func(kind string, reply func(req map[string]any) (int, any)) http.Handler {
		return jsonHook(func(req map[string]any) (int, any) {
			mu.Lock()
			calls[kind]++
			n := calls[kind]
			mu.Unlock()
			if kind == "sync" && n == 1 {
				return http.StatusInternalServerError, map[string]any{"error": "the first sync fails, to be retried"}
			}
			return reply(req)
		})
	}
	mux := http.NewServeMux()
	mux.Handle("/sync", hook("sync", func(map[string]any) (int, any) {
		return 200, map[string]any{"status": map[string]any{"synced": true}, "children": []any{}}
	}))
	mux.Handle("/finalize", hook("finalize", func(map[string]any) (int, any) {
		return 200, map[string]any{"children": []any{}, "finalized": true}
	}))
	mux.Handle("/customize", hook("customize", func(map[string]any) (int, any) {
		return 200, map[string]any{"relatedResources": []any{}}
	}))
	url := strings.Replace(hookServer(t, mux), "127.0.0.1", "localhost", 1)
	webhook := func(path string) map[string]any { return map[string]any{"webhook": map[string]any{"url": url + path}} }
	createController(t, &instance{selector: label}, "CompositeController", "metrics-"+ns, map[string]any{
		"parentResource":   map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"},
		"childResources":   []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
		"generateSelector": true,
		"hooks":            map[string]any{"sync": webhook("/sync"), "finalize": webhook("/finalize"), "customize": webhook("/customize")},
	})
	w := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.metabus.dev/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "measured", "namespace": ns}, "spec": map[string]any{"size": int64(1)},
	}}
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, w, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the parent synced after its failed first sync", func() error {
		p, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "measured", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if synced, _, _ := unstructured.NestedBool(p.Object, "status", "synced"); !synced {
			return fmt.Errorf("status %v", p.Object["status"])
		}
		return nil
	})
	if err := dyn.Resource(widgetsGVR).Namespace(ns).Delete(ctx, "measured", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the parent finalized and gone", func() error {
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "measured", metav1.GetOptions{}); err == nil {
			return fmt.Errorf("still there")
		}
		mu.Lock()
		defer mu.Unlock()
		if calls["finalize"] == 0 || calls["customize"] == 0 {
			return fmt.Errorf("hook calls %v", calls)
		}
		return nil
	})
}

// scrapeUntilComplete scrapes every process (name → address) until every
// non-optional listed family shows in one of them and extra says the
// processes' own series are there, then checks every scraped family.
func scrapeUntilComplete(t *testing.T, exported []monitoring.Metric, addrs map[string]string, extra func(map[string]map[string]*dto.MetricFamily) error) {
	t.Helper()
	listed := map[string]monitoring.Metric{}
	for _, m := range exported {
		listed[m.Name] = m
	}
	var got map[string]map[string]*dto.MetricFamily
	eventually(t, 60*time.Second, "every listed metric family exported", func() error {
		got = map[string]map[string]*dto.MetricFamily{}
		seen := map[string]bool{}
		for name, addr := range addrs {
			fams, err := scrape(addr)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			got[name] = fams
			for f := range fams {
				seen[f] = true
			}
		}
		var missing []string
		for _, m := range exported {
			if !m.Optional && !seen[m.Name] {
				missing = append(missing, m.Name)
			}
		}
		if len(missing) > 0 {
			sort.Strings(missing)
			return fmt.Errorf("not exported yet: %s", strings.Join(missing, ", "))
		}
		return extra(got)
	})
	count := 0
	for proc, fams := range got {
		for name, f := range fams {
			m, ok := listed[name]
			if !ok {
				if upstreamNamespace(name) {
					t.Errorf("%s exports %s, which neither upstream.txt nor metabus.txt lists", proc, name)
				}
				continue
			}
			if typ := strings.ToLower(f.GetType().String()); typ != m.Type {
				t.Errorf("%s: %s is a %s, listed as a %s", proc, name, typ, m.Type)
			}
			for _, s := range f.GetMetric() {
				count++
				var labels []string
				for _, l := range s.GetLabel() {
					labels = append(labels, l.GetName())
				}
				sort.Strings(labels)
				if !slices.Equal(labels, m.Labels) {
					t.Errorf("%s: a series of %s has labels %v, listed %v", proc, name, labels, m.Labels)
					break
				}
			}
		}
	}
	t.Logf("checked %d series of %d processes against %d listed families", count, len(got), len(exported))
}

// wantReconciled checks that the watcher counted the CompositeController's
// reconcile under upstream's controller-runtime controller name, with the
// worker count of its one worker, and the queue of CompositeController
// objects under the same name.
func wantReconciled(fams map[string]*dto.MetricFamily) error {
	const name = "composite-metacontroller"
	atLeastOne := func(family string, labels map[string]string) error {
		for _, m := range fams[family].GetMetric() {
			if matchLabels(m, labels) && m.GetCounter().GetValue()+float64(m.GetHistogram().GetSampleCount()) >= 1 {
				return nil
			}
		}
		return fmt.Errorf("no series %s%v >= 1 in %v", family, labels, fams[family].GetMetric())
	}
	return errors.Join(
		atLeastOne("controller_runtime_reconcile_total", map[string]string{"controller": name, "result": "success"}),
		atLeastOne("controller_runtime_reconcile_time_seconds", map[string]string{"controller": name}),
		atLeastOne("workqueue_adds_total", map[string]string{"name": name, "controller": name}),
		wantSeries(fams, "controller_runtime_max_concurrent_reconciles", map[string]string{"controller": name}, 1))
}

// upstreamNamespace: the prefixes whose every family must be listed.
func upstreamNamespace(name string) bool {
	for _, p := range []string{"metabus_", "metacontroller_", "workqueue_", "rest_client_", "leader_election_", "controller_runtime_", "certwatcher_"} {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

// wantSeries checks that a family has a series with labels (a subset) and
// value.
func wantSeries(fams map[string]*dto.MetricFamily, name string, labels map[string]string, value float64) error {
	for _, m := range fams[name].GetMetric() {
		if matchLabels(m, labels) && m.GetGauge().GetValue()+m.GetCounter().GetValue() == value {
			return nil
		}
	}
	return fmt.Errorf("no series %s%v = %v in %v", name, labels, value, fams[name].GetMetric())
}

func scrape(addr string) (map[string]*dto.MetricFamily, error) {
	res, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: %s", res.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	return parser.TextToMetricFamilies(res.Body)
}

// freeAddr is a free loopback address for a process to listen on later:
// below the kernel's ephemeral range (testnats.FreePort), where no
// outgoing connection of the tests alongside takes it meanwhile.
func freeAddr(t *testing.T) string {
	t.Helper()
	port, err := testnats.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// runBinary starts bin/name with args until the test ends (SIGTERM, then
// SIGKILL after 20 s); its log is shown if the test fails.
func runBinary(t *testing.T, bin, name string, args ...string) {
	t.Helper()
	logf, err := os.Create(filepath.Join(t.TempDir(), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(bin, name), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("%s did not stop on SIGTERM", name)
		}
		_ = logf.Close()
		if t.Failed() {
			data, _ := os.ReadFile(logf.Name())
			t.Logf("--- %s log:\n%s", name, tail(string(data), 60))
		}
	})
}
