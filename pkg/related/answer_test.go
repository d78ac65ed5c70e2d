package related

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/pkg/hookapi"
)

func TestCheckRule(t *testing.T) {
	def, err := ParsePolicy(DefaultPolicy)
	if err != nil {
		t.Fatal(err)
	}
	hardened, err := ParsePolicy(HardenedPolicy)
	if err != nil {
		t.Fatal(err)
	}
	rule := func(apiVersion, resource string) hookapi.RelatedResourceRule {
		return hookapi.RelatedResourceRule{APIVersion: apiVersion, Resource: resource}
	}
	tests := []struct {
		reason  string
		policy  *Policy // nil: the default
		rule    hookapi.RelatedResourceRule
		wantErr string
	}{
		{reason: "ConfigMaps: allowed", rule: rule("v1", "configmaps")},
		{reason: "a custom resource: allowed", rule: rule("example.com/v1", "things")},
		{reason: "Secrets: allowed by default, as upstream", rule: rule("v1", "secrets")},
		{reason: "hardened: ConfigMaps allowed", policy: &hardened, rule: rule("v1", "configmaps")},
		{
			reason: "hardened: Secrets refused, saying how to allow them", policy: &hardened, rule: rule("v1", "secrets"),
			wantErr: "customize hook's relatedResources[2] (v1 secrets) refused, nothing watched and the sync hook not called: " +
				"core/secrets is denied by -core/secrets in the dispatcher's --related-resources (Helm value dispatcher.relatedResources); an admin may allow it",
		},
		{
			reason: "a malformed apiVersion", rule: rule("a/b/c", "things"),
			wantErr: `customize hook returned an invalid relatedResources[2]: apiVersion "a/b/c": unexpected GroupVersion string: a/b/c`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			p := def
			if tt.policy != nil {
				p = *tt.policy
			}
			if diff := cmp.Diff(tt.wantErr, errString(CheckRule(p, 2, tt.rule))); diff != "" {
				t.Errorf("CheckRule (-want +got):\n%s", diff)
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
