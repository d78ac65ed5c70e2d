package deploy

import (
	"slices"
	"strings"
	"testing"
)

// TestControllerIdentity (issue 35): in the hardened profile the applier
// writes nothing with its own authority: every controller's writes
// impersonate the account it names, or --default-service-account, an
// account the profile creates and binds to nothing; the applier may
// impersonate that account by name in metabus's namespace and nothing else
// (no user, group or other account). The default profile is upstream's: no
// default account, no impersonation.
func TestControllerIdentity(t *testing.T) {
	def, hardened := renders(t)
	const nobody = "metabus-nobody"
	impersonation := func(t *testing.T, r render) []policyRule {
		t.Helper()
		rules, _ := rbacSet{objs: r.objs}.rulesFor(t, "metabus", "metabus-applier")
		var out []policyRule
		for _, rule := range rules {
			if slices.Contains(rule.verbs, "impersonate") || slices.Contains(rule.verbs, "*") {
				out = append(out, rule)
			}
		}
		return out
	}
	// The watcher resolves a controller's identity as the applier does, so
	// that a controller reads as the account it writes as; and in both
	// profiles it may ask what an account may read (a controller naming
	// one is bounded by it in the default profile too).
	reads := func(t *testing.T, r render, want []string) {
		t.Helper()
		if got := flagValues(containerArgs(t, r.objs, "metabus-watcher"), "default-service-account"); !slices.Equal(got, want) {
			t.Errorf("watcher --default-service-account %q, want %q (the applier's)", got, want)
		}
		rules, _ := rbacSet{objs: r.objs}.rulesFor(t, "metabus", "metabus-watcher")
		if !canIn(rules, "", "authorization.k8s.io/subjectaccessreviews", "create") {
			t.Error("the watcher may not create subjectaccessreviews: controllers acting as an account would never be sent anything")
		}
	}
	for _, r := range def {
		t.Run(r.name, func(t *testing.T) {
			reads(t, r, nil)
			if got := flagValues(containerArgs(t, r.objs, "metabus-applier"), "default-service-account"); len(got) != 0 {
				t.Errorf("applier --default-service-account %q, want none (upstream)", got)
			}
			if got := impersonation(t, r); len(got) != 0 {
				t.Errorf("the applier may impersonate: %v", got)
			}
			if find(r.objs, "ServiceAccount", nobody) != nil {
				t.Errorf("ServiceAccount %s is rendered", nobody)
			}
		})
	}
	for _, r := range hardened {
		t.Run(r.name, func(t *testing.T) {
			reads(t, r, []string{"metabus/" + nobody})
			if got := flagValues(containerArgs(t, r.objs, "metabus-applier"), "default-service-account"); !slices.Equal(got, []string{"metabus/" + nobody}) {
				t.Errorf("applier --default-service-account %q, want [metabus/%s]", got, nobody)
			}
			if find(r.objs, "ServiceAccount", nobody) == nil {
				t.Errorf("no ServiceAccount %s", nobody)
			}
			if rules, bound := (rbacSet{objs: r.objs}).rulesFor(t, "metabus", nobody); bound || len(rules) > 0 {
				t.Errorf("%s is bound to %v; the default account must have no grants", nobody, rules)
			}
			imp := impersonation(t, r)
			if len(imp) == 0 {
				t.Fatal("the applier may impersonate nothing: no controller could write")
			}
			for _, rule := range imp {
				want := strings.HasPrefix(rule.role, "Role/") && strings.HasSuffix(rule.role, "(metabus)") &&
					slices.Equal(rule.groups, []string{""}) && slices.Equal(rule.resources, []string{"serviceaccounts"}) &&
					slices.Equal(rule.names, []string{nobody}) && slices.Equal(rule.verbs, []string{"impersonate"})
				if !want {
					t.Errorf("applier impersonation rule %v; want only impersonate on serviceaccounts/%s in metabus", rule, nobody)
				}
			}
			// What the applier could write itself, were impersonation not
			// used: nothing of a controller's.
			app, _ := rbacSet{objs: r.objs}.rulesFor(t, "metabus", "metabus-applier")
			for _, target := range []string{"/configmaps", "/secrets", "/namespaces", "apps/deployments", "rbac.authorization.k8s.io/clusterrolebindings", "example.com/things/status", "example.com/things/finalizers"} {
				for _, verb := range []string{"create", "update", "patch", "delete"} {
					if canIn(app, "tenant", target, verb) || canIn(app, "metabus", target, verb) {
						t.Errorf("the hardened applier may %s %s itself", verb, target)
					}
				}
			}
		})
	}
}

// TestHelmImpersonate: each account of applier.identity.impersonate gets
// impersonate by name in its own namespace, bound to the applier.
func TestHelmImpersonate(t *testing.T) {
	objs, err := helmRender(map[string]any{"profile": "hardened", "applier": map[string]any{"identity": map[string]any{
		"impersonate": []any{"team-a/deployer"},
	}}}, defaultRelease)
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	for _, o := range objs {
		if str(o, "kind") != "Role" || str(o, "metadata", "namespace") != "team-a" {
			continue
		}
		rules := slice(o, "rules")
		if len(rules) != 1 {
			t.Fatalf("Role %s: %d rules, want 1", str(o, "metadata", "name"), len(rules))
		}
		rule := rules[0].(map[string]any)
		names, _ := rule["resourceNames"].([]any)
		found = len(names) == 1 && names[0] == "deployer"
	}
	if !found {
		t.Fatal("no Role in team-a letting the applier impersonate deployer")
	}
	rules, _ := rbacSet{objs: objs}.rulesFor(t, "metabus", "metabus-applier")
	if !slices.ContainsFunc(rules, func(r policyRule) bool {
		return strings.HasSuffix(r.role, "(team-a)") && slices.Equal(r.names, []string{"deployer"}) && slices.Contains(r.verbs, "impersonate")
	}) {
		t.Errorf("the applier is not bound to impersonate team-a/deployer: %v", rules)
	}
	if _, err := helmRender(map[string]any{"applier": map[string]any{"identity": map[string]any{"impersonate": []any{"system:admin"}}}}, defaultRelease); err == nil {
		t.Error("an impersonate entry that is not <namespace>/<name> renders")
	}
}
