package applier

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctlid "github.com/metabus/metabus/pkg/identity"
)

// AggregateLabel is the label of the ClusterRoles whose rules the applier's
// aggregated ClusterRole (deploy/rbac/applier.yaml) collects.
const AggregateLabel = "metabus.dev/aggregate-to-applier"

// denial is one write the RBAC authorizer refused to the applier.
type denial struct {
	User, Verb, Group, Resource, Namespace string
}

// rbacForbidden matches the message of the API server's authorizer
// (k8s.io/apiserver responsewriters.forbiddenMessage). Only that message
// means "missing RBAC": admission plugins also answer 403 Forbidden (a
// terminating namespace, PodSecurity, quotas...), and granting a role cannot
// fix those.
var rbacForbidden = regexp.MustCompile(`User "([^"]*)" cannot (\S+) resource "([^"]*)" in API group "([^"]*)"(?: in the namespace "([^"]*)")?`)

// denials returns the RBAC refusals found in err, which may join several
// write errors, in order and without repeats.
func denials(err error) []denial {
	var out []denial
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case nil:
		case *apierrors.StatusError:
			if e.ErrStatus.Reason != metav1.StatusReasonForbidden {
				return
			}
			if m := rbacForbidden.FindStringSubmatch(e.ErrStatus.Message); m != nil {
				d := denial{User: m[1], Verb: m[2], Resource: m[3], Group: m[4], Namespace: m[5]}
				if !slices.Contains(out, d) {
					out = append(out, d)
				}
			}
		case interface{ Unwrap() []error }:
			for _, inner := range e.Unwrap() {
				walk(inner)
			}
		case interface{ Unwrap() error }:
			walk(e.Unwrap())
		}
	}
	walk(err)
	return out
}

// forbiddenMessage is the Event message for refused writes: what was
// refused, and the RBAC that would allow it. Writes made as the applier
// (id none) are fixed in the form an admin pastes into a ClusterRole
// labelled AggregateLabel (or the Helm value applier.rbac.extraRules);
// writes made as a controller's identity are fixed by granting that
// ServiceAccount, never the applier.
func forbiddenMessage(ds []denial, retryIn time.Duration, id ctlid.Identity) string {
	var b strings.Builder
	for i, d := range ds {
		if i > 0 {
			b.WriteString("; ")
		}
		where := "cluster-wide"
		if d.Namespace != "" {
			where = fmt.Sprintf("in namespace %q", d.Namespace)
		}
		group := d.Group
		if group == "" {
			group = "core"
		}
		fmt.Fprintf(&b, "%s may not %s %s (API group %s) %s", d.User, d.Verb, d.Resource, group, where)
	}
	if id.None() {
		b.WriteString(". Grant it with a ClusterRole labelled " + AggregateLabel + `: "true"`)
	} else {
		fmt.Fprintf(&b, ". The controller acts as ServiceAccount %s (annotation %s or --default-service-account): "+
			"if it should, bind that ServiceAccount to a Role in the namespace (a ClusterRole for cluster-wide) with", id, ctlid.ServiceAccountAnnotation)
	}
	for i, d := range ds {
		sep := ","
		if i == 0 && !id.None() {
			sep = ""
		}
		fmt.Fprintf(&b, `%s rule {apiGroups: [%q], resources: [%q], verbs: [%q]}`, sep, d.Group, d.Resource, d.Verb)
	}
	if id.None() {
		b.WriteString(" (Helm value applier.rbac.extraRules)")
	}
	fmt.Fprintf(&b, "; retrying in %s, or at once when the parent changes", retryIn)
	return b.String()
}

// forbiddenBackoff is the delay before retrying a sync whose writes RBAC
// refused: only an admin can fix that, so retrying every few seconds would
// only load the API server and flood the parent with Events. It starts at a
// minute and doubles up to 15 minutes, so a fix made in a hurry is picked up
// within a few minutes while a forgotten one costs 4 syncs an hour.
func forbiddenBackoff(attempt int) time.Duration {
	const first, ceiling = time.Minute, 15 * time.Minute
	if attempt < 1 {
		attempt = 1
	}
	if attempt > 5 {
		return ceiling
	}
	return min(first<<(attempt-1), ceiling)
}
