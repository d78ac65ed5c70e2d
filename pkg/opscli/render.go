package opscli

import (
	"context"
	"fmt"
	"io"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/render"
)

// ClusterLister lists objects through the dynamic client.
func (b *Bus) ClusterLister() render.Lister {
	return func(ctx context.Context, res *apiresource.Resource, ns string) ([]*unstructured.Unstructured, error) {
		ri := b.Dyn.Resource(res.GVR)
		var l *unstructured.UnstructuredList
		var err error
		if ns != "" {
			l, err = ri.Namespace(ns).List(ctx, metav1.ListOptions{})
		} else {
			l, err = ri.List(ctx, metav1.ListOptions{})
		}
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", res.GVR.Resource, err)
		}
		out := make([]*unstructured.Unstructured, len(l.Items))
		for i := range l.Items {
			out[i] = &l.Items[i]
		}
		return out, nil
	}
}

// Resolver resolves resources through the cluster's discovery.
func (b *Bus) Resolver(ctx context.Context) func(apiVersion, resource string) (*apiresource.Resource, error) {
	return func(apiVersion, resource string) (*apiresource.Resource, error) {
		return b.Disc.Resolve(ctx, apiVersion, resource)
	}
}

// ShadowRow is one parent of a shadow run.
type ShadowRow struct {
	Parent  string `json:"parent"`
	Changed bool   `json:"changed"`
	Create  int    `json:"create"`
	// Update counts updates and recreations (update method Recreate).
	Update int `json:"update"`
	Delete int `json:"delete"`
	// Parent are the paths of the parent's changed fields (status...).
	ParentFields []string `json:"parentFields,omitempty"`
	Skipped      string   `json:"skipped,omitempty"`
	Error        string   `json:"error,omitempty"`
	// Result is the full render (JSON/YAML output only).
	Result *render.Result `json:"result,omitempty"`
}

// Shadow is a render of every live parent of a controller.
type Shadow struct {
	Controller string      `json:"controller"`
	HookURL    string      `json:"hookURL"`
	Parents    []ShadowRow `json:"parents"`
	Changed    int         `json:"changed"`
	Errors     int         `json:"errors"`
}

// RenderAll renders every live parent of a controller the controller
// selects, observing each from the cluster, with the hook URLs, related
// policy and hook client of with (its Controller, Parent, List and
// Resolve are set per parent; HookURL "" calls the controller's own
// hook): a shadow run of a hook version before it is rolled out. Nothing
// is written. A MapController's parent counts the changes of all its map
// keys.
func (b *Bus) RenderAll(ctx context.Context, controller string, with render.Input) (*Shadow, error) {
	c, err := b.oneController(ctx, controller)
	if err != nil {
		return nil, err
	}
	_, plan, err := b.plan(ctx, c)
	if err != nil {
		return nil, err
	}
	sh := &Shadow{Controller: controllerLabel(c.Kind, c.Name), HookURL: with.HookURL}
	list := b.ClusterLister()
	for _, wp := range plan.Parents {
		parents, err := list(ctx, wp.Res, "")
		if err != nil {
			return nil, err
		}
		for _, p := range parents {
			if !plan.Rules.Selects(p) && !hasFinalizer(p, plan.Finalizer) {
				continue
			}
			row := ShadowRow{Parent: parentLabel(p.GetNamespace(), p.GetName())}
			in := with
			in.Controller, in.Parent, in.List, in.Resolve = c.Obj, p, list, b.Resolver(ctx)
			res, err := render.Render(ctx, in)
			row.Result = res
			switch {
			case err != nil:
				row.Error = err.Error()
				sh.Errors++
			case res.Skipped != "":
				row.Skipped = res.Skipped
			default:
				row.Changed = res.Changed()
				for _, u := range res.Units() {
					for _, ch := range u.Changes.Children {
						switch ch.Action {
						case render.Create:
							row.Create++
						case render.Update, render.Recreate:
							row.Update++
						case render.Delete:
							row.Delete++
						}
					}
					for _, f := range u.Changes.Parent {
						row.ParentFields = append(row.ParentFields, f.Path)
					}
				}
			}
			if row.Changed {
				sh.Changed++
			}
			sh.Parents = append(sh.Parents, row)
		}
	}
	sort.Slice(sh.Parents, func(i, j int) bool { return sh.Parents[i].Parent < sh.Parents[j].Parent })
	return sh, nil
}

// WriteShadow prints a shadow run's summary.
func WriteShadow(w io.Writer, sh *Shadow) error {
	t := newTable(w, "PARENT", "CHANGES", "CREATE", "UPDATE", "DELETE", "PARENT FIELDS", "NOTE")
	for _, r := range sh.Parents {
		changes := "none"
		if r.Changed {
			changes = "yes"
		}
		note := r.Skipped
		if r.Error != "" {
			changes, note = "error", r.Error
		}
		t.row(r.Parent, changes, fmt.Sprint(r.Create), fmt.Sprint(r.Update), fmt.Sprint(r.Delete),
			dash(truncate(strings.Join(r.ParentFields, ","), 60)), dash(truncate(note, 100)))
	}
	if err := t.flush(); err != nil {
		return err
	}
	target := sh.HookURL
	if target == "" {
		target = "the controller's hook"
	}
	fmt.Fprintf(w, "%d of %d parents of %s would change with %s; %d errors\n", sh.Changed, len(sh.Parents), sh.Controller, target, sh.Errors)
	return nil
}

// WriteRender prints one render: for the parent (and each map key of a
// MapController's parent), the desired state, then what applying it would
// change.
func WriteRender(w io.Writer, r *render.Result) error {
	fmt.Fprintf(w, "# controller %s, parent %s%s\n", r.Controller, r.Parent, hookNote(&r.Unit))
	for _, n := range r.Notes {
		fmt.Fprintln(w, "# note:", n)
	}
	if err := writeUnit(w, &r.Unit); err != nil {
		return err
	}
	for _, k := range r.Keys {
		input := k.Input
		if input == "" {
			input = "none: detached"
		}
		fmt.Fprintf(w, "\n# map key %s (input %s)%s\n", k.Key, input, hookNote(&k.Unit))
		if k.Error != "" {
			fmt.Fprintln(w, "# error:", k.Error)
			continue
		}
		if err := writeUnit(w, &k.Unit); err != nil {
			return err
		}
	}
	return nil
}

// hookNote names the hook a unit called, or says metabus answers by
// itself (a MapController's status, a detached key without a tombstone
// hook).
func hookNote(u *render.Unit) string {
	switch {
	case u.Hook == "":
		return ""
	case len(u.Requests) == 0 || u.Requests[len(u.Requests)-1].Hook != u.Hook:
		return ", " + u.Hook + " (metabus's own answer, no hook called)"
	}
	return ", " + u.Hook + " hook"
}

// writeUnit prints one unit of a render.
func writeUnit(w io.Writer, u *render.Unit) error {
	for _, c := range u.Requests {
		if c.Hook == bus.HookCustomize {
			fmt.Fprintf(w, "# customize hook answered: %s\n", c.Response)
		}
	}
	if u.Skipped != "" {
		fmt.Fprintln(w, "# nothing rendered:", u.Skipped)
		return nil
	}
	if d := u.Desired; d != nil {
		for _, c := range d.Children {
			data, err := yaml.Marshal(c.Object)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "---\n%s", data)
		}
		if d.Status != nil {
			data, err := yaml.Marshal(map[string]any{"status": d.Status})
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "--- # parent status\n%s", data)
		}
		if d.ResyncAfterSeconds > 0 {
			fmt.Fprintf(w, "# resyncAfterSeconds: %g\n", d.ResyncAfterSeconds)
		}
		if d.Finalized {
			fmt.Fprintln(w, "# finalized: true")
		}
	}
	fmt.Fprintln(w, "\n# changes against the observed state:")
	if !u.Changes.Any() {
		fmt.Fprintln(w, "#   none")
	}
	for _, ch := range u.Changes.Children {
		if ch.Action == render.Unchanged {
			continue
		}
		fmt.Fprintf(w, "%s %s %s\n", ch.Action, ch.Kind, parentLabel(ch.Namespace, ch.Name))
		if ch.Action == render.Update || ch.Action == render.Recreate {
			writeFields(w, ch.Fields)
		}
	}
	if len(u.Changes.Parent) > 0 {
		fmt.Fprintln(w, "update parent")
		writeFields(w, u.Changes.Parent)
	}
	return nil
}

func writeFields(w io.Writer, fs []render.FieldChange) {
	for _, f := range fs {
		switch {
		case f.Before == nil:
			fmt.Fprintf(w, "  + %s: %s\n", f.Path, inline(f.After))
		case f.After == nil:
			fmt.Fprintf(w, "  - %s: %s\n", f.Path, inline(f.Before))
		default:
			fmt.Fprintf(w, "  ~ %s: %s -> %s\n", f.Path, inline(f.Before), inline(f.After))
		}
	}
}

func inline(v any) string {
	data, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Sprint(v)
	}
	s := strings.TrimSpace(string(data))
	if strings.Contains(s, "\n") {
		data, _ := jsonMarshal(v)
		return truncate(string(data), 200)
	}
	return truncate(s, 200)
}

// LiveObject reads the live version of an object named by a file (its
// apiVersion, kind, namespace and name).
func (b *Bus) LiveObject(ctx context.Context, o *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	res, err := b.Disc.ResolveKind(ctx, o.GetAPIVersion(), o.GetKind())
	if err != nil {
		return nil, err
	}
	ri := b.Dyn.Resource(res.GVR)
	if res.Namespaced {
		return ri.Namespace(o.GetNamespace()).Get(ctx, o.GetName(), metav1.GetOptions{})
	}
	return ri.Get(ctx, o.GetName(), metav1.GetOptions{})
}

// ControllerObject reads one controller object from the cluster.
func (b *Bus) ControllerObject(ctx context.Context, ref string) (*unstructured.Unstructured, error) {
	c, err := b.oneController(ctx, ref)
	if err != nil {
		return nil, err
	}
	return c.Obj, nil
}
