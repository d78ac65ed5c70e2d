package deploy

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/yaml"
)

// The chart's dashboard ConfigMap and PrometheusRule are off by default
// and, when enabled, carry deploy/monitoring's dashboard and rules as they
// are (the rules' {{ $value }} templates left to Prometheus).
func TestHelmMonitoring(t *testing.T) {
	objs, err := renderChart(nil)
	if err != nil {
		t.Fatal(err)
	}
	for key := range objs {
		if key == "ConfigMap/metabus-dashboard" || key == "PrometheusRule/metabus" {
			t.Errorf("%s rendered with the default values", key)
		}
	}
	vals, err := parseDocs([]byte(`monitoring: {dashboard: {enabled: true, namespace: grafana, annotations: {grafana_folder: metabus}}, prometheusRule: {enabled: true, labels: {release: kps}}}`))
	if err != nil {
		t.Fatal(err)
	}
	objs, err = renderChart(vals[0])
	if err != nil {
		t.Fatal(err)
	}
	cm := objs["ConfigMap/metabus-dashboard"]
	if cm == nil {
		t.Fatal("no dashboard ConfigMap")
	}
	if got := str(cm, "metadata", "namespace"); got != "grafana" {
		t.Errorf("dashboard ConfigMap in namespace %q, want grafana", got)
	}
	if got := str(cm, "metadata", "labels", "grafana_dashboard"); got != "1" {
		t.Errorf("dashboard ConfigMap label grafana_dashboard=%q, want 1", got)
	}
	if got := str(cm, "metadata", "annotations", "grafana_folder"); got != "metabus" {
		t.Errorf("dashboard ConfigMap annotation grafana_folder=%q, want metabus", got)
	}
	want, err := os.ReadFile(filepath.Join("monitoring", "metabus-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var wantJSON, gotJSON any
	if err := json.Unmarshal(want, &wantJSON); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(str(cm, "data", "metabus.json")), &gotJSON); err != nil {
		t.Fatalf("the ConfigMap's metabus.json: %v", err)
	}
	if diff := cmp.Diff(wantJSON, gotJSON); diff != "" {
		t.Errorf("dashboard in the ConfigMap differs from deploy/monitoring's (-want +got):\n%s", diff)
	}

	rule := objs["PrometheusRule/metabus"]
	if rule == nil {
		t.Fatal("no PrometheusRule")
	}
	if str(rule, "apiVersion") != "monitoring.coreos.com/v1" || str(rule, "metadata", "labels", "release") != "kps" || str(rule, "metadata", "namespace") != "metabus" {
		t.Errorf("PrometheusRule metadata: %v %v", rule["apiVersion"], rule["metadata"])
	}
	rules, err := os.ReadFile(filepath.Join("monitoring", "metabus-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var wantRules map[string]any
	if err := yaml.Unmarshal(rules, &wantRules); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantRules, rule["spec"]); diff != "" {
		t.Errorf("PrometheusRule spec differs from deploy/monitoring/metabus-rules.yaml (-want +got):\n%s", diff)
	}
}
