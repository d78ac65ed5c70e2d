package related

import (
	"fmt"
	"strings"
)

// DefaultPolicy is what related rules may name unless an admin says
// otherwise (--related-resources): every resource but Secrets. A customize
// hook is code of whoever may create a controller; a rule on Secrets would
// make metabus watch every Secret of the cluster and send those the rule
// selects to that hook's URL.
var DefaultPolicy = []string{"*", "-core/secrets"}

// Policy says which resources customize-hook related rules may name, so
// that creating a controller does not let anyone make metabus watch, and
// send to a hook, any type of the cluster.
type Policy struct {
	allow, deny []groupResource
}

// groupResource is one entry; "*" in either part matches anything.
type groupResource struct{ group, resource string }

func (g groupResource) matches(group, resource string) bool {
	return (g.group == "*" || g.group == group) && (g.resource == "*" || g.resource == resource)
}

func (g groupResource) String() string {
	group := g.group
	if group == "" {
		group = "core"
	}
	return group + "/" + g.resource
}

// ParsePolicy parses entries "<group>/<resource>" (the core group is "core"
// or empty, "*" matches any group or resource, a lone "*" is "*/*"); an
// entry starting with "-" denies, and a deny wins over any allow. A resource
// no entry allows is refused.
func ParsePolicy(entries []string) (Policy, error) {
	var p Policy
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		deny := strings.HasPrefix(e, "-")
		body := strings.TrimPrefix(e, "-")
		if body == "*" {
			body = "*/*"
		}
		group, resource, ok := strings.Cut(body, "/")
		if !ok || resource == "" || strings.Contains(resource, "/") || strings.ContainsAny(body, " \t") {
			return Policy{}, fmt.Errorf("related resources entry %q: want <group>/<resource> (core/secrets, apps/*, *), optionally prefixed with - to deny", e)
		}
		if group == "core" {
			group = ""
		}
		gr := groupResource{group: group, resource: resource}
		if deny {
			p.deny = append(p.deny, gr)
		} else {
			p.allow = append(p.allow, gr)
		}
	}
	return p, nil
}

// Allows reports whether related rules may name resource of group ("" is
// the core group).
func (p Policy) Allows(group, resource string) bool {
	for _, d := range p.deny {
		if d.matches(group, resource) {
			return false
		}
	}
	for _, a := range p.allow {
		if a.matches(group, resource) {
			return true
		}
	}
	return false
}

// Refusal explains why Allows refused group/resource and how an admin
// allows it.
func (p Policy) Refusal(group, resource string) string {
	gr := groupResource{group: group, resource: resource}
	for _, d := range p.deny {
		if d.matches(group, resource) {
			return fmt.Sprintf("%s is denied by -%s in the dispatcher's --related-resources (Helm value dispatcher.relatedResources); an admin may allow it", gr, d)
		}
	}
	return fmt.Sprintf("%s is not listed in the dispatcher's --related-resources (Helm value dispatcher.relatedResources); an admin may add it", gr)
}
