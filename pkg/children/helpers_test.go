package children

import (
	"encoding/json"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	utiljson "k8s.io/apimachinery/pkg/util/json"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

const ownerUID = "11111111-2222-3333-4444-555555555555"

func nsOwner() Owner {
	return Owner{
		APIVersion: "example.com/v1", Kind: "Thing", Namespace: "ns", Name: "web", UID: ownerUID,
		Namespaced: true,
		Selector:   labels.SelectorFromSet(labels.Set{"app": "web"}),
	}
}

func clusterOwner() Owner {
	return Owner{APIVersion: "example.com/v1", Kind: "ClusterThing", Name: "global", UID: ownerUID}
}

// testRules: 0 Pod (namespaced), 1 ConfigMap (namespaced), 2 ClusterRole (cluster-scoped).
func testRules(method v1alpha1.ChildUpdateMethod) []Rule {
	return []Rule{
		{APIVersion: "v1", Resource: "pods", Kind: "Pod", Namespaced: true, Method: method},
		{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true, Method: method},
		{APIVersion: "rbac.authorization.k8s.io/v1", Resource: "clusterroles", Kind: "ClusterRole", Method: method},
	}
}

// decode parses JSON the way hook responses and API objects are parsed (integers as int64).
func decode(t testing.TB, s string) *unstructured.Unstructured {
	t.Helper()
	var m map[string]any
	if err := utiljson.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("bad test JSON %s: %v", s, err)
	}
	return &unstructured.Unstructured{Object: m}
}

// pod is a desired Pod as a hook would return it; image lets tests change it.
func pod(t testing.TB, name, image string) *unstructured.Unstructured {
	t.Helper()
	return decode(t, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"`+name+`","labels":{"app":"web"}},
		"spec":{"containers":[{"name":"main","image":"`+image+`","ports":[{"containerPort":8080,"protocol":"TCP"}],
		"env":[{"name":"MODE","value":"prod"},{"name":"REPLICA","value":"`+name+`"}],
		"resources":{"limits":{"cpu":"500m","memory":"128Mi"}}}],"restartPolicy":"Always"}}`)
}

func configMap(t testing.TB, name, value string) *unstructured.Unstructured {
	t.Helper()
	return decode(t, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"`+name+`","labels":{"app":"web"}},"data":{"k":"`+value+`"}}`)
}

func toJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// normalized runs Normalize and fails the test on error.
func normalized(t testing.TB, owner Owner, rules []Rule, objs ...*unstructured.Unstructured) []Desired {
	t.Helper()
	d, err := Normalize(owner, rules, objs)
	if err != nil {
		t.Fatalf("Normalize: %v", err)
	}
	return d
}

// live simulates a previous sync that created the desired children: it plans their creation and
// then lets a fake API server add server-side fields (uid, resourceVersion, timestamps, status,
// a defaulted field and a field set by another actor), returning the observed children grouped
// by rule index.
func live(t testing.TB, owner Owner, rules []Rule, desired []Desired) map[int][]*unstructured.Unstructured {
	t.Helper()
	actions, err := Plan(owner, rules, nil, desired)
	if err != nil {
		t.Fatalf("Plan (create): %v", err)
	}
	observed := map[int][]*unstructured.Unstructured{}
	for i, a := range actions {
		if a.Op != OpCreate {
			t.Fatalf("expected only creates, got %s", a.Op)
		}
		obj := a.Object.DeepCopy()
		// Round trip through JSON like a real server response.
		obj = decode(t, toJSON(t, obj.Object))
		obj.SetUID(types.UID("uid-" + obj.GetName()))
		obj.SetResourceVersion("100")
		obj.SetGeneration(1)
		obj.Object["metadata"].(map[string]any)["creationTimestamp"] = "2024-01-01T00:00:00Z"
		obj.Object["status"] = map[string]any{"phase": "Running"}
		if spec, ok := obj.Object["spec"].(map[string]any); ok {
			spec["dnsPolicy"] = "ClusterFirst" // defaulted by the server
			spec["nodeName"] = "node-1"        // set by the scheduler
		}
		ann := obj.GetAnnotations()
		ann["other.example.com/touched"] = "yes" // another actor
		obj.SetAnnotations(ann)
		idx := -1
		for j := range rules {
			if &rules[j] == a.Rule {
				idx = j
			}
		}
		if idx < 0 {
			t.Fatalf("action %d rule does not point into rules", i)
		}
		observed[idx] = append(observed[idx], obj)
	}
	return observed
}
