package children

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// errString is err's message, "" for nil.
func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func hpaRule(version string) Rule {
	return Rule{APIVersion: "autoscaling/" + version, Resource: "horizontalpodautoscalers", Kind: "HorizontalPodAutoscaler", Namespaced: true, Method: "InPlace"}
}

// A resource declared twice (in one version or two) cannot be planned consistently, so the
// rules are rejected: by CheckDistinct, which the services call on the controller spec, and by
// Normalize and Plan, which must never plan with such rules.
func TestDuplicateRulesAreRejected(t *testing.T) {
	pods := Rule{APIVersion: "v1", Resource: "pods", Kind: "Pod", Namespaced: true}
	cases := []struct {
		reason string
		rules  []Rule
		want   string // CheckDistinct's message; "" when the rules are fine
	}{
		{reason: "distinct kinds are fine", rules: testRules("")},
		{reason: "no rules are fine", rules: nil},
		{
			reason: "same kind name in two groups is two resources",
			rules:  []Rule{pods, {APIVersion: "example.com/v1", Resource: "pods", Kind: "Pod", Namespaced: true}},
		},
		{
			reason: "the same resource twice",
			rules:  []Rule{pods, testRules("")[1], pods},
			want:   "spec.childResources[2] declares Pod.v1, which spec.childResources[0] declares too: list each resource once, in one version",
		},
		{
			reason: "one kind in two versions",
			rules:  []Rule{hpaRule("v1"), hpaRule("v2")},
			want:   "spec.childResources[1] declares HorizontalPodAutoscaler.autoscaling/v2, which spec.childResources[0] declares as autoscaling/v1: list each resource once, in one version",
		},
		{
			reason: "every duplicate is reported",
			rules:  []Rule{pods, hpaRule("v2"), pods, hpaRule("v1")},
			want: "spec.childResources[2] declares Pod.v1, which spec.childResources[0] declares too: list each resource once, in one version\n" +
				"spec.childResources[3] declares HorizontalPodAutoscaler.autoscaling/v1, which spec.childResources[1] declares as autoscaling/v2: list each resource once, in one version",
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			if diff := cmp.Diff(c.want, errString(CheckDistinct("spec.childResources", c.rules))); diff != "" {
				t.Errorf("CheckDistinct (-want +got):\n%s", diff)
			}
			_, nErr := Normalize(nsOwner(), c.rules, nil)
			acts, pErr := Plan(nsOwner(), c.rules, nil, nil)
			if rejected := c.want != ""; (nErr != nil) != rejected || (pErr != nil) != rejected {
				t.Errorf("Normalize: %v; Plan: %v; want rejected = %v", nErr, pErr, rejected)
			}
			if pErr != nil && acts != nil {
				t.Errorf("Plan returned actions %v with error %v", acts, pErr)
			}
		})
	}
}

// The defect behind the check: an HPA declared as autoscaling/v1 and v2 is observed under both
// rules but desired under one, and Plan deleted it on every sync.
func TestPlanDoesNotChurnAKindDeclaredInTwoVersions(t *testing.T) {
	rules := []Rule{hpaRule("v1"), hpaRule("v2")}
	hpa := func(version string) *unstructured.Unstructured {
		return decode(t, `{"apiVersion":"autoscaling/`+version+`","kind":"HorizontalPodAutoscaler",
			"metadata":{"name":"web","namespace":"ns","uid":"u1","labels":{"app":"web"},
			"ownerReferences":[{"apiVersion":"example.com/v1","kind":"Thing","name":"web","uid":"`+ownerUID+`","controller":true}]}}`)
	}
	observed := map[int][]*unstructured.Unstructured{0: {hpa("v1")}, 1: {hpa("v2")}}
	desired := []Desired{{Rule: &rules[1], Object: hpa("v2")}}
	acts, err := Plan(nsOwner(), rules, observed, desired)
	if err == nil || len(acts) != 0 {
		t.Fatalf("Plan = %d actions %v, error %v; want no action and an error", len(acts), acts, err)
	}
}
