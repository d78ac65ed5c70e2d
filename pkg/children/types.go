package children

import (
	"errors"
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// Rule is one declared child (or attachment) resource, resolved through discovery.
type Rule struct {
	APIVersion string // as declared, e.g. "apps/v1"; the version hooks send and receive
	Resource   string // plural resource name, e.g. "statefulsets"
	Kind       string // from discovery, e.g. "StatefulSet"
	Namespaced bool
	Method     v1alpha1.ChildUpdateMethod // "" means OnDelete
}

// Owner is the parent (or decorator target) that owns the children.
type Owner struct {
	APIVersion, Kind, Namespace, Name, UID string
	Namespaced                             bool
	// Selector must match every desired child's labels (after ExtraLabels are added), because a
	// child that does not match would be released at the next sync and never seen again. nil
	// disables the check (decorators); composite parents always have one.
	Selector labels.Selector
	// ExtraLabels are injected into every desired child, overriding the hook's values (e.g.
	// controller-uid=<uid> with generateSelector).
	ExtraLabels map[string]string
	// ExtraAnnotations are injected into every desired child, overriding the hook's values
	// (e.g. metacontroller.k8s.io/decorator-controller=<name> for decorators).
	ExtraAnnotations map[string]string
}

// Desired is one validated desired child, ready to plan. Rule points into the rules slice that
// was given to Normalize.
type Desired struct {
	Rule   *Rule
	Object *unstructured.Unstructured
}

// ChildKey identifies a child: its rule's apiVersion and kind, its namespace ("" when
// cluster-scoped) and its name.
type ChildKey struct {
	APIVersion, Kind, Namespace, Name string
}

func (k ChildKey) String() string {
	if k.Namespace == "" {
		return fmt.Sprintf("%s.%s %s", k.Kind, k.APIVersion, k.Name)
	}
	return fmt.Sprintf("%s.%s %s/%s", k.Kind, k.APIVersion, k.Namespace, k.Name)
}

// OwnerOf is the identity part of the Owner that parent is for its children
// (a kind adds the selector and the labels or annotations it stamps).
func OwnerOf(parent *unstructured.Unstructured) Owner {
	return Owner{
		APIVersion: parent.GetAPIVersion(),
		Kind:       parent.GetKind(),
		Namespace:  parent.GetNamespace(),
		Name:       parent.GetName(),
		UID:        string(parent.GetUID()),
		Namespaced: parent.GetNamespace() != "",
	}
}

// ControllerRef returns the ownerReference metabus puts on every child it creates: a
// controller reference that also blocks the owner's foreground deletion until the child is
// gone, as upstream does.
func ControllerRef(owner Owner) metav1.OwnerReference {
	yes := true
	return metav1.OwnerReference{
		APIVersion:         owner.APIVersion,
		Kind:               owner.Kind,
		Name:               owner.Name,
		UID:                types.UID(owner.UID),
		Controller:         &yes,
		BlockOwnerDeletion: &yes,
	}
}

// IsOwnedBy reports whether obj's controller reference points at owner: same UID, same API
// group and kind. The version is ignored because an owner reachable under several versions is
// still the same object (the UID settles identity; group and kind guard against a reused UID
// in hand-written references).
func IsOwnedBy(obj metav1.Object, owner Owner) bool {
	if obj == nil || owner.UID == "" {
		return false
	}
	group := apiGroup(owner.APIVersion)
	for _, ref := range obj.GetOwnerReferences() {
		if ref.Controller != nil && *ref.Controller {
			// There is at most one controller reference, so the first one decides.
			return string(ref.UID) == owner.UID && ref.Kind == owner.Kind && apiGroup(ref.APIVersion) == group
		}
	}
	return false
}

// isOwnedRaw is IsOwnedBy on unstructured content without converting the references to
// typed structs, which matters when planning runs for every child on every sync.
func isOwnedRaw(obj map[string]any, owner Owner, ownerGroup string) bool {
	meta, _ := obj["metadata"].(map[string]any)
	refs, _ := meta["ownerReferences"].([]any)
	for _, r := range refs {
		ref, _ := r.(map[string]any)
		if controller, _ := ref["controller"].(bool); !controller {
			continue
		}
		uid, _ := ref["uid"].(string)
		kind, _ := ref["kind"].(string)
		apiVersion, _ := ref["apiVersion"].(string)
		return uid == owner.UID && kind == owner.Kind && apiGroup(apiVersion) == ownerGroup
	}
	return false
}

// apiGroup returns the group of an apiVersion ("" for the core group's "v1").
func apiGroup(apiVersion string) string {
	group, _, found := strings.Cut(apiVersion, "/")
	if !found {
		return ""
	}
	return group
}

// checkRules rejects rule sets that would make matching ambiguous or planning undefined. They
// come from the controller spec plus discovery, so a failure is a configuration error.
func checkRules(rules []Rule) error {
	var errs []error
	for i, r := range rules {
		if r.APIVersion == "" || r.Kind == "" {
			errs = append(errs, fmt.Errorf("rule %d (%s %q) lacks apiVersion or kind (not resolved through discovery?)", i, r.APIVersion, r.Resource))
		}
		switch r.Method {
		case "", v1alpha1.ChildUpdateOnDelete, v1alpha1.ChildUpdateRecreate, v1alpha1.ChildUpdateInPlace,
			v1alpha1.ChildUpdateRollingRecreate, v1alpha1.ChildUpdateRollingInPlace:
		default:
			errs = append(errs, fmt.Errorf("rule %d (%s.%s) has unknown update method %q", i, r.Kind, r.APIVersion, r.Method))
		}
	}
	if err := CheckDistinct("rules", rules); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("children: invalid child rules: %w", errors.Join(errs...))
	}
	return nil
}

// CheckDistinct rejects a list of rules (field names it in the message, e.g.
// "spec.childResources") that declares one resource twice: the same API group and kind, in
// the same version or in two (autoscaling/v1 and autoscaling/v2 HorizontalPodAutoscalers are
// the same objects). Such a list cannot be planned consistently: each object would be observed
// once per rule but desired under one only, so every sync would delete and recreate it. Rules
// without a kind (not resolved) are left to the other checks.
func CheckDistinct(field string, rules []Rule) error {
	var errs []error
	first := make(map[[2]string]int, len(rules))
	for i, r := range rules {
		if r.Kind == "" {
			continue
		}
		gk := [2]string{apiGroup(r.APIVersion), r.Kind}
		j, dup := first[gk]
		if !dup {
			first[gk] = i
			continue
		}
		how := "too"
		if rules[j].APIVersion != r.APIVersion {
			how = "as " + rules[j].APIVersion
		}
		errs = append(errs, fmt.Errorf("%s[%d] declares %s.%s, which %s[%d] declares %s: list each resource once, in one version",
			field, i, r.Kind, r.APIVersion, field, j, how))
	}
	return errors.Join(errs...)
}

// checkOwner rejects an owner whose scope and namespace disagree.
func checkOwner(owner Owner) error {
	if owner.Namespaced && owner.Namespace == "" {
		return fmt.Errorf("children: owner %s %q is namespaced but has no namespace", owner.Kind, owner.Name)
	}
	if !owner.Namespaced && owner.Namespace != "" {
		return fmt.Errorf("children: owner %s %q is cluster-scoped but has namespace %q", owner.Kind, owner.Name, owner.Namespace)
	}
	return nil
}
