package related

import (
	"fmt"
	"strings"
)

// DefaultPolicy is what customize hooks' related rules may name unless an
// admin says otherwise (the dispatcher's --related-resources): everything,
// as upstream Metacontroller allows, so that existing controllers work
// unchanged (upstream's SecretPropagation example names Secrets in its
// customize hook). A controller and its hooks are code of whoever may
// create a controller, and a related rule on Secrets makes metabus watch
// every Secret of the cluster and send those it selects to that
// controller's hooks: the hardened profile (SECURITY.md) sets
// HardenedPolicy instead.
var DefaultPolicy = []string{"*"}

// DefaultControllerPolicy is what controllers may name as parent, child,
// decorator target or attachment unless an admin says otherwise (the
// watcher's --controller-resources): everything, as upstream Metacontroller
// allows, so existing controllers that manage Secrets keep working.
var DefaultControllerPolicy = []string{"*"}

// HardenedPolicy is what the hardened profile lets both policies name:
// everything but Secrets.
var HardenedPolicy = []string{"*", "-core/secrets"}

// Where an admin sets each policy, for the messages of refusals.
const (
	RelatedSetting    = "the dispatcher's --related-resources (Helm value dispatcher.relatedResources)"
	ControllerSetting = "the watcher's --controller-resources (Helm value watcher.controllerResources)"
)

// Policy says which resources controllers may make metabus watch and send
// to their hooks, so that creating a controller does not let anyone read
// any type of the cluster through metabus.
type Policy struct {
	allow, deny []groupResource
	// setting is where the policy comes from (RelatedSetting...).
	setting string
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

// ParsePolicy is ParsePolicyOf for the dispatcher's related-rules policy.
func ParsePolicy(entries []string) (Policy, error) {
	return ParsePolicyOf(RelatedSetting, entries)
}

// ParsePolicyOf parses entries "<group>/<resource>" (the core group is
// "core" or empty, "*" matches any group or resource, a lone "*" is "*/*");
// an entry starting with "-" denies, and a deny wins over any allow. A
// resource no entry allows is refused. setting says where the entries were
// set, for Refusal's messages.
func ParsePolicyOf(setting string, entries []string) (Policy, error) {
	p := Policy{setting: setting}
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
			return Policy{}, fmt.Errorf("entry %q: want <group>/<resource> (core/secrets, apps/*, *), optionally prefixed with - to deny", e)
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

// AppendEntries is the parser of a repeatable policy flag (flag.Func): it
// checks a comma-separated value, so a typo stops the service at start,
// and appends its entries to *entries.
func AppendEntries(setting string, entries *[]string) func(string) error {
	return func(v string) error {
		e := strings.Split(v, ",")
		if _, err := ParsePolicyOf(setting, e); err != nil {
			return err
		}
		*entries = append(*entries, e...)
		return nil
	}
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
			return fmt.Sprintf("%s is denied by -%s in %s; an admin may allow it", gr, d, p.setting)
		}
	}
	return fmt.Sprintf("%s is not listed in %s; an admin may add it", gr, p.setting)
}
