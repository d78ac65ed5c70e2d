package related

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPolicy(t *testing.T) {
	type check struct {
		group, resource string
		want            bool
	}
	tests := []struct {
		reason  string
		entries []string
		checks  []check
		wantErr bool
	}{
		{
			reason:  "default: everything, Secrets included, as upstream",
			entries: DefaultPolicy,
			checks:  []check{{"", "configmaps", true}, {"", "secrets", true}, {"apps", "deployments", true}},
		},
		{
			reason:  "controllers' default: everything, as upstream",
			entries: DefaultControllerPolicy,
			checks:  []check{{"", "secrets", true}, {"example.com", "things", true}},
		},
		{
			reason:  "hardened: everything but Secrets",
			entries: HardenedPolicy,
			checks: []check{
				{"", "configmaps", true}, {"apps", "deployments", true}, {"example.com", "things", true},
				{"", "secrets", false},
				// Only the core group's secrets are meant; a CRD named so is not a Secret.
				{"example.com", "secrets", true},
			},
		},
		{
			reason:  "a lone * allows Secrets too",
			entries: []string{"*"},
			checks:  []check{{"", "secrets", true}, {"events.k8s.io", "events", true}},
		},
		{
			reason:  "nothing listed: nothing allowed",
			entries: nil,
			checks:  []check{{"", "configmaps", false}},
		},
		{
			reason:  "an explicit list; core written empty or as core",
			entries: []string{"core/configmaps", "/services", "apps/*"},
			checks: []check{
				{"", "configmaps", true}, {"", "services", true}, {"apps", "deployments", true}, {"apps", "statefulsets", true},
				{"", "secrets", false}, {"batch", "jobs", false},
			},
		},
		{
			reason:  "a deny wins over an allow, whatever the order",
			entries: []string{"-core/events", "*/*", "core/events", "-events.k8s.io/*"},
			checks:  []check{{"", "events", false}, {"events.k8s.io", "events", false}, {"", "pods", true}},
		},
		{
			reason:  "blank entries are skipped (a trailing comma)",
			entries: []string{" core/pods ", ""},
			checks:  []check{{"", "pods", true}},
		},
		{reason: "no slash", entries: []string{"secrets"}, wantErr: true},
		{reason: "a subresource", entries: []string{"core/pods/log"}, wantErr: true},
		{reason: "no resource", entries: []string{"apps/"}, wantErr: true},
		{reason: "inner space", entries: []string{"core/config maps"}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			p, err := ParsePolicy(tt.entries)
			if (err != nil) != tt.wantErr {
				t.Fatalf("ParsePolicy(%q) error = %v, want error %v", tt.entries, err, tt.wantErr)
			}
			var got, want []check
			for _, c := range tt.checks {
				want = append(want, c)
				got = append(got, check{c.group, c.resource, p.Allows(c.group, c.resource)})
			}
			if diff := cmp.Diff(want, got, cmp.AllowUnexported(check{})); diff != "" {
				t.Errorf("Allows (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPolicyRefusal(t *testing.T) {
	p, err := ParsePolicy([]string{"*", "-core/secrets"})
	if err != nil {
		t.Fatal(err)
	}
	q, err := ParsePolicy([]string{"apps/*"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := ParsePolicyOf(ControllerSetting, HardenedPolicy)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		reason          string
		p               Policy
		group, resource string
		want            string
	}{
		{
			reason: "denied by an entry: names it", p: p, resource: "secrets",
			want: "core/secrets is denied by -core/secrets in the dispatcher's --related-resources (Helm value dispatcher.relatedResources); an admin may allow it",
		},
		{
			reason: "not listed", p: q, group: "batch", resource: "jobs",
			want: "batch/jobs is not listed in the dispatcher's --related-resources (Helm value dispatcher.relatedResources); an admin may add it",
		},
		{
			reason: "the watcher's policy names the watcher's flag and value", p: c, resource: "secrets",
			want: "core/secrets is denied by -core/secrets in the watcher's --controller-resources (Helm value watcher.controllerResources); an admin may allow it",
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, tt.p.Refusal(tt.group, tt.resource)); diff != "" {
				t.Errorf("Refusal (-want +got):\n%s", diff)
			}
		})
	}
}

func TestAppendEntries(t *testing.T) {
	type result struct {
		Entries []string
		Err     bool
	}
	tests := []struct {
		reason string
		values []string // one per flag occurrence
		want   result
	}{
		{reason: "a comma-separated list", values: []string{"core/configmaps,apps/*"}, want: result{Entries: []string{"core/configmaps", "apps/*"}}},
		{reason: "repeated flags add up", values: []string{"*", "-core/events"}, want: result{Entries: []string{"*", "-core/events"}}},
		{reason: "an empty value: nothing allowed (not the default)", values: []string{""}, want: result{Entries: []string{""}}},
		{reason: "a malformed entry is rejected and not kept", values: []string{"secrets"}, want: result{Err: true}},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			var got result
			parse := AppendEntries(ControllerSetting, &got.Entries)
			for _, v := range tt.values {
				got.Err = got.Err || parse(v) != nil
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
