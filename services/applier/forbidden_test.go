package applier

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ctlid "github.com/metabus/metabus/pkg/identity"
)

// forbidden builds the error the API server returns when RBAC refuses a
// request, with the authorizer's message.
func forbidden(verb, group, resource, ns string) error {
	where := " at the cluster scope"
	if ns != "" {
		where = fmt.Sprintf(" in the namespace %q", ns)
	}
	msg := fmt.Sprintf(`User "system:serviceaccount:metabus:metabus-applier" cannot %s resource %q in API group %q%s`, verb, resource, group, where)
	return apierrors.NewForbidden(schema.GroupResource{Group: group, Resource: resource}, "x", errors.New(msg))
}

func TestDenials(t *testing.T) {
	const sa = "system:serviceaccount:metabus:metabus-applier"
	cm := denial{User: sa, Verb: "create", Resource: "configmaps", Namespace: "ns"}
	crb := denial{User: sa, Verb: "delete", Group: "rbac.authorization.k8s.io", Resource: "clusterrolebindings"}
	status := denial{User: sa, Verb: "update", Group: "example.com", Resource: "things/status", Namespace: "ns"}
	tests := []struct {
		reason string
		err    error
		want   []denial
	}{
		{reason: "no error", err: nil},
		{reason: "not a Forbidden", err: apierrors.NewConflict(schema.GroupResource{Resource: "configmaps"}, "x", errors.New("changed"))},
		{reason: "a namespaced write, wrapped with context", err: fmt.Errorf("create ConfigMap ns/x: %w", forbidden("create", "", "configmaps", "ns")), want: []denial{cm}},
		{reason: "a cluster-scoped write", err: forbidden("delete", "rbac.authorization.k8s.io", "clusterrolebindings", ""), want: []denial{crb}},
		{reason: "a subresource", err: forbidden("update", "example.com", "things/status", "ns"), want: []denial{status}},
		{
			reason: "several child writes joined, repeats once, other errors skipped",
			err: errors.Join(
				fmt.Errorf("create ConfigMap ns/a: %w", forbidden("create", "", "configmaps", "ns")),
				errors.New("update Service ns/b: timeout"),
				fmt.Errorf("create ConfigMap ns/c: %w", forbidden("create", "", "configmaps", "ns")),
				fmt.Errorf("wrapped: %w", errors.Join(forbidden("delete", "rbac.authorization.k8s.io", "clusterrolebindings", ""))),
			),
			want: []denial{cm, crb},
		},
		{
			// Admission plugins answer 403 too; no role grant fixes these.
			reason: "a Forbidden from admission, not RBAC",
			err:    apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "x", errors.New("unable to create new content in namespace ns because it is being terminated")),
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, denials(tt.err)); diff != "" {
				t.Errorf("denials (-want +got):\n%s", diff)
			}
		})
	}
}

func TestForbiddenMessage(t *testing.T) {
	const sa = "system:serviceaccount:metabus:metabus-applier"
	tests := []struct {
		reason string
		ds     []denial
		id     ctlid.Identity
		want   string
	}{
		{
			reason: "one namespaced write in the core group",
			ds:     []denial{{User: sa, Verb: "create", Resource: "configmaps", Namespace: "ns"}},
			want: sa + ` may not create configmaps (API group core) in namespace "ns". ` +
				`Grant it with a ClusterRole labelled metabus.dev/aggregate-to-applier: "true", ` +
				`rule {apiGroups: [""], resources: ["configmaps"], verbs: ["create"]} ` +
				`(Helm value applier.rbac.extraRules); retrying in 1m0s, or at once when the parent changes`,
		},
		{
			reason: "two writes, one cluster-scoped",
			ds: []denial{
				{User: sa, Verb: "create", Resource: "configmaps", Namespace: "ns"},
				{User: sa, Verb: "delete", Group: "rbac.authorization.k8s.io", Resource: "clusterrolebindings"},
			},
			want: sa + ` may not create configmaps (API group core) in namespace "ns"; ` +
				sa + ` may not delete clusterrolebindings (API group rbac.authorization.k8s.io) cluster-wide. ` +
				`Grant it with a ClusterRole labelled metabus.dev/aggregate-to-applier: "true", ` +
				`rule {apiGroups: [""], resources: ["configmaps"], verbs: ["create"]}, ` +
				`rule {apiGroups: ["rbac.authorization.k8s.io"], resources: ["clusterrolebindings"], verbs: ["delete"]} ` +
				`(Helm value applier.rbac.extraRules); retrying in 1m0s, or at once when the parent changes`,
		},
		{
			reason: "a write as the controller's identity: the account is granted, not the applier",
			id:     ctlid.Identity{Namespace: "team-a", Name: "deployer"},
			ds:     []denial{{User: "system:serviceaccount:team-a:deployer", Verb: "create", Resource: "configmaps", Namespace: "team-b"}},
			want: `system:serviceaccount:team-a:deployer may not create configmaps (API group core) in namespace "team-b". ` +
				`The controller acts as ServiceAccount team-a/deployer (annotation metabus.dev/service-account or --default-service-account): ` +
				`if it should, bind that ServiceAccount to a Role in the namespace (a ClusterRole for cluster-wide) with ` +
				`rule {apiGroups: [""], resources: ["configmaps"], verbs: ["create"]}; retrying in 1m0s, or at once when the parent changes`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, forbiddenMessage(tt.ds, time.Minute, tt.id)); diff != "" {
				t.Errorf("message (-want +got):\n%s", diff)
			}
		})
	}
}

func TestForbiddenBackoff(t *testing.T) {
	tests := []struct {
		reason  string
		attempt int
		want    time.Duration
	}{
		{reason: "no attempt yet counts as the first", attempt: 0, want: time.Minute},
		{reason: "first retry: a minute, not a second", attempt: 1, want: time.Minute},
		{reason: "doubles", attempt: 3, want: 4 * time.Minute},
		{reason: "capped", attempt: 5, want: 15 * time.Minute},
		{reason: "stays capped, no overflow", attempt: 80, want: 15 * time.Minute},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, forbiddenBackoff(tt.attempt)); diff != "" {
				t.Errorf("forbiddenBackoff(%d) (-want +got):\n%s", tt.attempt, diff)
			}
		})
	}
}

// The message built from a real API error names the parts an admin needs,
// and stays under the 1 kB note limit of events.k8s.io Events.
func TestForbiddenMessageFromAPIError(t *testing.T) {
	msg := forbiddenMessage(denials(fmt.Errorf("create ConfigMap ns/x: %w", forbidden("create", "", "configmaps", "ns"))), forbiddenBackoff(1), ctlid.Identity{})
	for _, want := range []string{"may not create configmaps", `namespace "ns"`, AggregateLabel, "applier.rbac.extraRules"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	if len(msg) > 1024 {
		t.Errorf("message is %d bytes, want at most 1024", len(msg))
	}
}
