package apply

import (
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The benchmarks measure the common steady state: a hook answers with the same desired object
// on every sync, and UpdateChild must conclude that nothing changed.

const benchPod = `{"apiVersion":"v1","kind":"Pod",
	"metadata":{"name":"web-0","namespace":"shop","labels":{"app":"web","tier":"frontend"},
		"annotations":{"team":"storefront"}},
	"spec":{"restartPolicy":"Always","terminationGracePeriodSeconds":30,
		"containers":[
			{"name":"web","image":"nginx:1.27","args":["-g","daemon off;"],
			 "ports":[{"containerPort":80,"name":"http"},{"containerPort":443,"name":"https"}],
			 "env":[{"name":"MODE","value":"prod"},{"name":"WORKERS","value":"4"},
			        {"name":"POD_IP","valueFrom":{"fieldRef":{"fieldPath":"status.podIP"}}}],
			 "resources":{"requests":{"cpu":"100m","memory":"128Mi"},"limits":{"memory":"256Mi"}},
			 "volumeMounts":[{"name":"conf","mountPath":"/etc/nginx/conf.d"},{"name":"cache","mountPath":"/var/cache/nginx"}]},
			{"name":"exporter","image":"nginx-exporter:1.1",
			 "ports":[{"containerPort":9113,"name":"metrics"}],
			 "env":[{"name":"SCRAPE_URI","value":"http://localhost/status"}]}],
		"volumes":[{"name":"conf","configMap":{"name":"web-conf"}},{"name":"cache","emptyDir":{}}]}}`

func benchmarkUpdateChild(b *testing.B, desiredJSON string) {
	desired := unstructuredFrom(b, hookJSON, desiredJSON)
	created, err := PrepareCreate(desired)
	if err != nil {
		b.Fatal(err)
	}
	observed := serverRoundTrip(b, created, "4242")
	if _, changed, err := UpdateChild(observed, desired); err != nil || changed {
		b.Fatalf("setup: changed=%v err=%v", changed, err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, _, err := UpdateChild(observed, desired); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkUpdateChildPod(b *testing.B) {
	benchmarkUpdateChild(b, benchPod)
}

// largeCR builds a custom resource with 40 sections of 6 scalars, a 2-item list-map of
// 3 fields and a 3-item scalar list each: about 600 fields and 80 lists.
func largeCR(b *testing.B) string {
	spec := map[string]any{}
	for s := range 40 {
		section := map[string]any{}
		for f := range 6 {
			section[fmt.Sprintf("field%d", f)] = fmt.Sprintf("value-%d-%d", s, f)
		}
		section["replicas"] = s
		section["endpoints"] = []any{
			map[string]any{"name": "primary", "port": 8000 + s, "protocol": "TCP"},
			map[string]any{"name": "secondary", "port": 9000 + s, "protocol": "UDP"},
		}
		section["tags"] = []any{"a", "b", fmt.Sprint(s)}
		spec[fmt.Sprintf("section%02d", s)] = section
	}
	obj := map[string]any{
		"apiVersion": "example.com/v1", "kind": "Big",
		"metadata": map[string]any{"name": "big", "namespace": "default"},
		"spec":     spec,
	}
	return mustJSON(b, obj)
}

func BenchmarkUpdateChildLargeCR(b *testing.B) {
	benchmarkUpdateChild(b, largeCR(b))
}

// BenchmarkMergePod isolates the merge from annotation handling.
func BenchmarkMergePod(b *testing.B) {
	desired := hookJSON(b, benchPod)
	observed := serverRoundTrip(b, &unstructured.Unstructured{Object: apiJSON(b, benchPod)}, "1").Object
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Merge(observed, desired, desired); err != nil {
			b.Fatal(err)
		}
	}
}
