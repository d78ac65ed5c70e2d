package opscli

import (
	"context"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/kindtable"
)

// parentMatch is one live parent of one controller.
type parentMatch struct {
	ctrl   controllerObj
	core   kinds.Controller
	plan   *kinds.WatchPlan
	res    *apiresource.Resource
	parent *unstructured.Unstructured
}

// ref is the controller as work items name it, with a weight of at most
// granted (the weight the watcher gave an earlier item of it).
func (m *parentMatch) ref(granted int) bus.ControllerRef {
	ref := m.core.Ref()
	asked, _ := bus.ParseWeight(m.ctrl.Obj.GetAnnotations()[bus.WeightAnnotation])
	ref.Weight = replayWeight(asked, granted)
	return ref
}

// replayWeight is the weight of an item this tool publishes for a
// controller whose annotation asks for asked, when the watcher granted an
// earlier item of it granted (0 means 1, as on the wire). The annotation
// is its author's ask; what it is granted is the operator's
// (--max-controller-weight, --weighted-controllers), in the watcher's
// flags, which this tool cannot see. A consumer schedules a controller by
// the weight of its latest message, so an item carrying the bare ask
// would lift the controller past the operator's bound until the watcher's
// next item. The grant the parked item carried is the bound instead; an
// annotation lowered since then lowers it. 0 (the wire's 1) when either is
// at most 1.
func replayWeight(asked, granted int) int {
	if w := min(asked, granted); w > 1 {
		return w
	}
	return 0
}

// item is a fresh work item for the parent (map key "" for the whole
// parent), as the watcher publishes one, for a controller the watcher
// granted weight granted.
func (m *parentMatch) item(reason, mapKey string, granted int) bus.WorkItem {
	p := m.parent
	return bus.WorkItem{
		Controller: m.ref(granted),
		Parent: bus.ObjectRef{
			APIVersion: m.res.APIVersion(), Kind: m.res.Kind, Resource: m.res.GVR.Resource,
			Namespace: p.GetNamespace(), Name: p.GetName(), UID: string(p.GetUID()),
		},
		MapKey: mapKey,
		Reason: reason,
		MinResourceVersions: map[string]string{
			bus.FreshnessKey(m.res.GVR.Group, m.res.GVR.Resource): p.GetResourceVersion(),
		},
	}
}

// plan decodes a controller and resolves what it watches.
func (b *Bus) plan(ctx context.Context, c controllerObj) (kinds.Controller, *kinds.WatchPlan, error) {
	core, err := kindtable.Decode(c.Obj)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", controllerLabel(c.Kind, c.Name), err)
	}
	plan, err := core.WatchPlan(func(apiVersion, resource string) (*apiresource.Resource, error) {
		return b.Disc.Resolve(ctx, apiVersion, resource)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", controllerLabel(c.Kind, c.Name), err)
	}
	return core, plan, nil
}

// ParseObjectName reads "namespace/name" or "name".
func ParseObjectName(s string) (ns, name string, err error) {
	ns, name, found := strings.Cut(s, "/")
	if !found {
		ns, name = "", s
	}
	if name == "" || strings.Contains(name, "/") {
		return "", "", Usage("%q: want namespace/name, or name for a cluster-scoped object", s)
	}
	return ns, name, nil
}

// resourceMatches reports whether a resource is the one a --resource flag
// names: "<resource>", "<resource>.<group>" or "<kind>" (any case).
func resourceMatches(res *apiresource.Resource, flag string) bool {
	if flag == "" {
		return true
	}
	f := strings.ToLower(flag)
	full := res.GVR.Resource
	if res.GVR.Group != "" {
		full += "." + res.GVR.Group
	}
	return f == res.GVR.Resource || f == full || f == strings.ToLower(res.Kind) ||
		f == schema.GroupResource{Group: res.GVR.Group, Resource: res.GVR.Resource}.String()
}

// findParents finds the live parents named ns/name among the parents the
// controllers watch (optionally only of one resource), and which of the
// controllers select them.
func (b *Bus) findParents(ctx context.Context, ctrls []controllerObj, resource, ns, name string) ([]parentMatch, error) {
	var out []parentMatch
	for _, c := range ctrls {
		core, plan, err := b.plan(ctx, c)
		if err != nil {
			continue // a controller metabus cannot serve has no parents
		}
		for _, wp := range plan.Parents {
			if !resourceMatches(wp.Res, resource) || wp.Res.Namespaced != (ns != "") {
				continue
			}
			ri := b.Dyn.Resource(wp.Res.GVR)
			var obj *unstructured.Unstructured
			if wp.Res.Namespaced {
				obj, err = ri.Namespace(ns).Get(ctx, name, metav1.GetOptions{})
			} else {
				obj, err = ri.Get(ctx, name, metav1.GetOptions{})
			}
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("get %s %s: %w", wp.Res.GVR.Resource, parentLabel(ns, name), err)
			}
			if !plan.Rules.Selects(obj) && !hasFinalizer(obj, plan.Finalizer) {
				continue
			}
			out = append(out, parentMatch{ctrl: c, core: core, plan: plan, res: wp.Res, parent: obj})
		}
	}
	return out, nil
}

func hasFinalizer(obj *unstructured.Unstructured, f string) bool {
	return f != "" && slices.Contains(obj.GetFinalizers(), f)
}

// oneParent is findParents for a command that needs exactly one parent.
func (b *Bus) oneParent(ctx context.Context, controller, resource, object string) (*parentMatch, error) {
	ns, name, err := ParseObjectName(object)
	if err != nil {
		return nil, err
	}
	ctrls, err := listControllers(ctx, b.Dyn)
	if err != nil {
		return nil, err
	}
	if controller != "" {
		kind, cname, err := ParseControllerRef(controller)
		if err != nil {
			return nil, err
		}
		if ctrls = matchControllers(ctrls, kind, cname); len(ctrls) == 0 {
			return nil, NotFound("controller %s not found", controller)
		}
	}
	ms, err := b.findParents(ctx, ctrls, resource, ns, name)
	if err != nil {
		return nil, err
	}
	switch len(ms) {
	case 0:
		return nil, NotFound("no controller's parent %s found (give --controller or --resource if the name is right)", parentLabel(ns, name))
	case 1:
		return &ms[0], nil
	}
	var names []string
	for _, m := range ms {
		names = append(names, fmt.Sprintf("%s (%s)", controllerLabel(m.ctrl.Kind, m.ctrl.Name), m.res.GVR.Resource))
	}
	return nil, Usage("%s is a parent of several controllers: %s; say which with --controller or --resource", parentLabel(ns, name), strings.Join(names, ", "))
}
