package watcher

import (
	"flag"
	"io"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	compositecore "github.com/metabus/metabus/pkg/composite"
	decoratorcore "github.com/metabus/metabus/pkg/decorator"
	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/related"
)

func TestRefuse(t *testing.T) {
	rule := func(apiVersion, resource string) v1alpha1.ResourceRule {
		return v1alpha1.ResourceRule{APIVersion: apiVersion, Resource: resource}
	}
	widgets := v1alpha1.CompositeControllerParentResourceRule{ResourceRule: rule("test.metabus.dev/v1", "widgets")}
	// The resources come from the kinds' cores, as the watcher asks them.
	composite := func(parent v1alpha1.CompositeControllerParentResourceRule, children ...v1alpha1.ResourceRule) []kinds.WatchedResource {
		cc := &v1alpha1.CompositeController{Spec: v1alpha1.CompositeControllerSpec{ParentResource: parent}}
		for _, c := range children {
			cc.Spec.ChildResources = append(cc.Spec.ChildResources, v1alpha1.CompositeControllerChildResourceRule{ResourceRule: c})
		}
		return (&compositecore.Controller{CC: cc}).WatchResources()
	}
	decorator := func(targets []v1alpha1.ResourceRule, attachments ...v1alpha1.ResourceRule) []kinds.WatchedResource {
		dc := &v1alpha1.DecoratorController{}
		for _, r := range targets {
			dc.Spec.Resources = append(dc.Spec.Resources, v1alpha1.DecoratorControllerResourceRule{ResourceRule: r})
		}
		for _, a := range attachments {
			dc.Spec.Attachments = append(dc.Spec.Attachments, v1alpha1.DecoratorControllerAttachmentRule{ResourceRule: a})
		}
		return (&decoratorcore.Controller{DC: dc}).WatchResources()
	}
	const denied = "core/secrets is denied by -core/secrets in the watcher's --controller-resources (Helm value watcher.controllerResources); an admin may allow it"
	tests := []struct {
		reason  string
		entries []string // nil: the default policy
		named   []kinds.WatchedResource
		want    string // the refusal; "" allowed
	}{
		{
			reason: "default: a parent and ConfigMap children are allowed",
			named:  composite(widgets, rule("v1", "configmaps"), rule("apps/v1", "deployments")),
		},
		{
			reason: "default: Secret children are refused, named by field",
			named:  composite(widgets, rule("v1", "configmaps"), rule("v1", "secrets")),
			want:   "spec.childResources[1] (v1 secrets): " + denied,
		},
		{
			reason: "default: a Secret parent is refused",
			named:  composite(v1alpha1.CompositeControllerParentResourceRule{ResourceRule: rule("v1", "secrets")}),
			want:   "spec.parentResource (v1 secrets): " + denied,
		},
		{
			reason: "default: a decorator's Secret target and attachment are both reported",
			named:  decorator([]v1alpha1.ResourceRule{rule("apps/v1", "deployments"), rule("v1", "secrets")}, rule("v1", "secrets")),
			want:   "spec.resources[1] (v1 secrets): " + denied + "; spec.attachments[0] (v1 secrets): " + denied,
		},
		{
			reason: "default: a related rule on Secrets is refused",
			named:  relatedResources([]hookapi.RelatedResourceRule{{APIVersion: "v1", Resource: "configmaps"}, {APIVersion: "v1", Resource: "secrets"}}),
			want:   "relatedResources[1] (v1 secrets): " + denied,
		},
		{
			reason: "a custom resource named secrets is not the core group's",
			named:  composite(widgets, rule("example.com/v1", "secrets")),
		},
		{
			reason:  "* allows Secrets",
			entries: []string{"*"},
			named:   composite(widgets, rule("v1", "secrets")),
		},
		{
			reason:  "an explicit list refuses what it does not name",
			entries: []string{"core/configmaps", "test.metabus.dev/*"},
			named:   composite(widgets, rule("v1", "configmaps"), rule("apps/v1", "deployments")),
			want:    "spec.childResources[1] (apps/v1 deployments): apps/deployments is not listed in the watcher's --controller-resources (Helm value watcher.controllerResources); an admin may add it",
		},
		{
			reason:  "an explicit list without the parent's group refuses the parent",
			entries: []string{"core/configmaps"},
			named:   composite(widgets, rule("v1", "configmaps")),
			want:    "spec.parentResource (test.metabus.dev/v1 widgets): test.metabus.dev/widgets is not listed in the watcher's --controller-resources (Helm value watcher.controllerResources); an admin may add it",
		},
		{
			reason: "an apiVersion that does not parse is left to discovery, which cannot resolve it",
			named:  composite(widgets, rule("a/b/c", "secrets")),
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			entries := tt.entries
			if entries == nil {
				entries = []string{"*", "-core/secrets"} // the tightened policy SECURITY.md recommends
			}
			p, err := related.ParsePolicyOf(related.ControllerSetting, entries)
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if err := refuse(p, tt.named); err != nil {
				got = err.Error()
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("refuse (-want +got):\n%s", diff)
			}
		})
	}
}

// TestControllerResourcesFlag: the flag feeds Config.ControllerResources
// (related.TestAppendEntries covers the parsing).
func TestControllerResourcesFlag(t *testing.T) {
	var cfg Config
	fs := flag.NewFlagSet("watcher", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.RegisterFlags(fs)
	if err := fs.Parse([]string{"--controller-resources=core/configmaps,apps/*", "--controller-resources=-core/events"}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"core/configmaps", "apps/*", "-core/events"}, cfg.ControllerResources); diff != "" {
		t.Errorf("ControllerResources (-want +got):\n%s", diff)
	}
	if err := fs.Parse([]string{"--controller-resources=secrets"}); err == nil {
		t.Error("a malformed entry was accepted")
	}
}
