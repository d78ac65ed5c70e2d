package mapctl

import (
	"encoding/json"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// Finalizer is the finalizer a MapController with the given name puts on
// parents: none. The design defines no finalize hook for MapController:
// its outputs are owned by the parent, so the garbage collector deletes
// them with it, and the tombstone hook is about vanished inputs, not a
// vanishing parent. With nothing to run before a parent goes, holding it
// in Terminating would only risk leaving it stuck when the controller is
// deleted. The kind-table row gets this function; the services must treat
// "" as "nothing to release".
func Finalizer(string) string { return "" }

// Decode decodes a MapController from its unstructured form and validates
// its spec (Validate). Both failures mean the same to the services (the
// object cannot be served until it changes), so a MapController that
// decodes is always one the core can work with.
func Decode(obj *unstructured.Unstructured) (*v1alpha1.MapController, error) {
	if obj == nil {
		return nil, errors.New("no MapController object")
	}
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return nil, fmt.Errorf("encode MapController %s: %w", obj.GetName(), err)
	}
	var mc v1alpha1.MapController
	if err := json.Unmarshal(data, &mc); err != nil {
		return nil, fmt.Errorf("decode MapController %s: %w", obj.GetName(), err)
	}
	if err := Validate(&mc.Spec); err != nil {
		return nil, fmt.Errorf("MapController %s: %w", obj.GetName(), err)
	}
	return &mc, nil
}

// Validate checks what the services rely on and the CRD may not have
// enforced (it is not installed everywhere, and older objects predate it):
// a parent resource, at least one input and one output resource, each with
// apiVersion and resource, no resource listed twice in one list, output
// update methods that exist for outputs, and a map hook (and a tombstone
// hook, if any) that has a webhook to call. Every problem is reported,
// joined into one error, with the field it is in.
//
// Whether the resources exist and their scopes fit (CheckScopes) needs
// discovery and is left to the caller.
func Validate(spec *v1alpha1.MapControllerSpec) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	checkRule := func(field string, r v1alpha1.ResourceRule) {
		if r.APIVersion == "" {
			bad("%s.apiVersion is required", field)
		} else if _, err := schema.ParseGroupVersion(r.APIVersion); err != nil {
			bad("%s.apiVersion: %w", field, err)
		}
		if r.Resource == "" {
			bad("%s.resource is required", field)
		}
	}
	checkRule("spec.parentResource", spec.ParentResource)

	if len(spec.InputResources) == 0 {
		bad("spec.inputResources needs at least one resource")
	}
	seen := map[v1alpha1.ResourceRule]int{}
	for i, r := range spec.InputResources {
		field := fmt.Sprintf("spec.inputResources[%d]", i)
		checkRule(field, r)
		if j, dup := seen[r]; dup {
			bad("%s repeats spec.inputResources[%d]", field, j)
		} else {
			seen[r] = i
		}
	}

	if len(spec.OutputResources) == 0 {
		bad("spec.outputResources needs at least one resource")
	}
	seen = map[v1alpha1.ResourceRule]int{}
	for i, r := range spec.OutputResources {
		field := fmt.Sprintf("spec.outputResources[%d]", i)
		checkRule(field, r.ResourceRule)
		if j, dup := seen[r.ResourceRule]; dup {
			// Two rules for one resource would plan its objects twice
			// and delete what the other rule creates.
			bad("%s repeats spec.outputResources[%d]", field, j)
		} else {
			seen[r.ResourceRule] = i
		}
		if r.UpdateStrategy != nil {
			switch r.UpdateStrategy.Method {
			case "", v1alpha1.OutputUpdateOnDelete, v1alpha1.OutputUpdateRecreate, v1alpha1.OutputUpdateInPlace:
			default:
				bad("%s.updateStrategy.method %q is not OnDelete, Recreate or InPlace (outputs do not roll out)", field, r.UpdateStrategy.Method)
			}
		}
	}

	var hooks v1alpha1.MapControllerHooks
	if spec.Hooks != nil {
		hooks = *spec.Hooks
	}
	switch {
	case hooks.Map == nil:
		bad("spec.hooks.map is required")
	case hooks.Map.Webhook == nil && hooks.Map.NATS == nil:
		bad("spec.hooks.map.webhook is required (or spec.hooks.map.nats)")
	}
	if hooks.Tombstone != nil && hooks.Tombstone.Webhook == nil && hooks.Tombstone.NATS == nil {
		bad("spec.hooks.tombstone.webhook is required when the tombstone hook is set (or spec.hooks.tombstone.nats)")
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("invalid spec: %w", errors.Join(errs...))
}

// OutputMethod is an output rule's update method as a child update method
// (what package children and the applier's rules take), OnDelete when the
// rule has none, as for children.
func OutputMethod(r v1alpha1.MapControllerOutputResourceRule) v1alpha1.ChildUpdateMethod {
	if r.UpdateStrategy == nil || r.UpdateStrategy.Method == "" {
		return v1alpha1.ChildUpdateOnDelete
	}
	return v1alpha1.ChildUpdateMethod(r.UpdateStrategy.Method)
}

// Scopes are the scopes discovery resolved for a spec's resources: whether
// the parent resource is namespaced, and each input and output resource,
// in spec order.
type Scopes struct {
	Parent  bool
	Inputs  []bool
	Outputs []bool
}

// CheckScopes rejects resources whose scopes cannot work together under a
// namespaced parent: a cluster-scoped output, because Kubernetes forbids an
// owner reference from a cluster-scoped object to a namespaced one, and a
// cluster-scoped input, because a namespaced parent only sees inputs in
// its own namespace, so the controller would never map anything. A
// cluster-scoped parent may use both scopes.
func CheckScopes(s Scopes) error {
	if !s.Parent {
		return nil
	}
	var errs []error
	for i, namespaced := range s.Inputs {
		if !namespaced {
			errs = append(errs, fmt.Errorf("spec.inputResources[%d] is cluster-scoped: a namespaced parent only sees inputs in its own namespace", i))
		}
	}
	for i, namespaced := range s.Outputs {
		if !namespaced {
			errs = append(errs, fmt.Errorf("spec.outputResources[%d] is cluster-scoped: a namespaced parent cannot own it", i))
		}
	}
	return errors.Join(errs...)
}
