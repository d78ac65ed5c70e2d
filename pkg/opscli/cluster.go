package opscli

import (
	"context"
	"fmt"
	"sort"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/kindtable"
)

// controllerObj is one controller object of any kind metabus serves.
type controllerObj struct {
	Kind, Name string
	ID         string // its bus token (bus.ControllerID)
	Obj        *unstructured.Unstructured
}

// listControllers lists the controller objects of every kind metabus
// serves, sorted by kind and name. A kind whose CRD is not installed has
// none.
func listControllers(ctx context.Context, dyn dynamic.Interface) ([]controllerObj, error) {
	var out []controllerObj
	for _, k := range kindtable.Kinds {
		l, err := dyn.Resource(k.GVR).List(ctx, metav1.ListOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", k.GVR.Resource, err)
		}
		for i := range l.Items {
			o := &l.Items[i]
			out = append(out, controllerObj{Kind: k.Name, Name: o.GetName(), ID: bus.ControllerID(k.Name, o.GetName()), Obj: o})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// ParseControllerRef reads a controller reference as the CLI takes it:
// "<kind>/<name>", the kind being the full kind
// (CompositeController), its lower case, its resource
// (compositecontrollers) or its initials (cc, dc, mc); or a bare name,
// which any kind may have (kind "").
func ParseControllerRef(s string) (kind, name string, err error) {
	k, n, found := strings.Cut(s, "/")
	if !found {
		return "", s, nil
	}
	if n == "" {
		return "", "", Usage("controller %q: no name after the kind", s)
	}
	low := strings.ToLower(k)
	for _, row := range kindtable.Kinds {
		if low == strings.ToLower(row.Name) || low == row.GVR.Resource || low == bus.KindIDPrefix(row.Name) ||
			low == strings.TrimSuffix(row.GVR.Resource, "s") {
			return row.Name, n, nil
		}
	}
	return "", "", Usage("controller %q: unknown kind %q (want compositecontroller, decoratorcontroller or mapcontroller, or cc, dc, mc)", s, k)
}

// matchControllers selects the controllers a reference names.
func matchControllers(all []controllerObj, kind, name string) []controllerObj {
	var out []controllerObj
	for _, c := range all {
		if c.Name == name && (kind == "" || c.Kind == kind) {
			out = append(out, c)
		}
	}
	return out
}

// oneController is the one controller a reference names.
func (b *Bus) oneController(ctx context.Context, ref string) (controllerObj, error) {
	kind, name, err := ParseControllerRef(ref)
	if err != nil {
		return controllerObj{}, err
	}
	all, err := listControllers(ctx, b.Dyn)
	if err != nil {
		return controllerObj{}, err
	}
	ms := matchControllers(all, kind, name)
	switch len(ms) {
	case 0:
		return controllerObj{}, NotFound("controller %s not found", ref)
	case 1:
		return ms[0], nil
	}
	return controllerObj{}, Usage("several controllers are named %s: give its kind (cc/%s, dc/%s, mc/%s)", name, name, name, name)
}

// controllerLabel is how tables name a controller: kind in lower case,
// "/", name.
func controllerLabel(kind, name string) string { return strings.ToLower(kind) + "/" + name }

// parentLabel is how tables name a parent: namespace/name, or name.
func parentLabel(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}
