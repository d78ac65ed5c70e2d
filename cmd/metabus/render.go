package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/metabus/metabus/pkg/hooks"
	"github.com/metabus/metabus/pkg/opscli"
	"github.com/metabus/metabus/pkg/render"
)

// renderCommand is `metabus render`: call a controller's hook outside the
// bus with the request metabus would send, and show the desired state and
// what applying it would change.
func renderCommand() *cobra.Command {
	var (
		f                                                 *opsFlags
		ctrlFile, parentFile, childrenAt, inputsAt, relAt string
		fromCluster, all                                  bool
		controller, hookURL, customizeURL                 string
		relatedPolicy                                     []string
	)
	cmd := &cobra.Command{
		Use:   "render",
		Short: "Call hooks offline with the requests metabus would send; show the desired state and its diff",
		Long: `Render calls a controller's hooks with exactly the requests a dispatcher would
send for a parent, and prints the desired state the answers make and what
applying it would change (children created, updated field by field with the
applier's merge, deleted; the parent's status, labels, annotations and
finalizers). No bus is needed, and with files no cluster either: the observed
objects are the ones given (--children, --inputs, --related), or the live ones
(--from-cluster, which also fills in the parent's live metadata and status).

A controller with a customize hook: the customize hook is called first, its
related rules are checked as the dispatcher checks them (--related-resources,
default: everything, as the dispatcher's default), and the objects they select
(from --related, or the cluster) are sent to the sync hook.

A MapController: its parent is rendered as the dispatcher syncs it, the
aggregated status and then one map hook call per input the parent selects
(from --inputs, or the cluster), each against that input's outputs (the
--children); a map key whose input is gone gets its tombstone hook.

--hook-url calls another URL than the controller's sync, finalize, map or
tombstone hook (a new hook version); --customize-url does the same for the
customize hook. With --controller NAME --all it renders every live parent of
the controller from the cluster and summarises which would change and how: a
shadow run of a hook before it is rolled out.

Not rendered: older revisions of a rolling update.

Exit code 4 when the desired state differs from the observed one, 0 when not.`,
		Example: `  metabus render -c controller.yaml -p parent.yaml
  metabus render -c controller.yaml -p parent.yaml --children children/ --hook-url http://localhost:8080/sync
  metabus render -c controller.yaml -p parent.yaml --related related/
  metabus render -c mapcontroller.yaml -p parent.yaml --inputs inputs/ --children outputs/
  metabus render -c controller.yaml -p parent.yaml --from-cluster -o yaml
  metabus render --controller cc/hello --all --hook-url http://hello-v2.hooks/sync`,
		Args: usageArgs(0, "no arguments (the controller and parent are files: -c, -p)"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			format, err := f.format()
			if err != nil {
				return err
			}
			ctx := runCtx(cmd)
			hc := hooks.New(hooks.Options{})
			out := cmd.OutOrStdout()
			if all {
				if controller == "" || ctrlFile != "" || parentFile != "" || childrenAt != "" || inputsAt != "" || relAt != "" {
					return opscli.Usage("--all renders every parent of --controller NAME from the cluster: give no -c, -p, --children, --inputs or --related")
				}
				b, done, err := f.connect(runCtx(cmd), needCluster)
				if err != nil {
					return err
				}
				defer done()
				sh, err := b.RenderAll(ctx, controller, render.Input{HookURL: hookURL, CustomizeURL: customizeURL, RelatedPolicy: relatedPolicy, Hooks: hc})
				if err != nil {
					return err
				}
				if format == opscli.Table {
					for i := range sh.Parents {
						sh.Parents[i].Result = nil
					}
				}
				if err := opscli.Print(out, format, sh, func(w io.Writer) error { return opscli.WriteShadow(w, sh) }); err != nil {
					return err
				}
				if sh.Errors > 0 {
					return fmt.Errorf("%d parents could not be rendered", sh.Errors)
				}
				if sh.Changed > 0 {
					return &opscli.ExitCodeError{Code: opscli.ExitDiffers, Err: errors.New("desired states differ")}
				}
				return nil
			}
			if parentFile == "" || (ctrlFile == "" && controller == "") {
				return opscli.Usage("give the parent (-p FILE) and the controller (-c FILE, or --controller NAME with --from-cluster)")
			}
			if (childrenAt != "" || inputsAt != "" || relAt != "") && fromCluster {
				return opscli.Usage("--children, --inputs or --related and --from-cluster both say where the observed objects come from: give one")
			}
			parents, err := readObjects(parentFile)
			if err != nil {
				return err
			}
			if len(parents) != 1 {
				return opscli.Usage("%s: want one parent object, found %d", parentFile, len(parents))
			}
			in := render.Input{Parent: parents[0], HookURL: hookURL, CustomizeURL: customizeURL, RelatedPolicy: relatedPolicy, Hooks: hc}
			if ctrlFile != "" {
				ctrls, err := readObjects(ctrlFile)
				if err != nil {
					return err
				}
				if len(ctrls) != 1 {
					return opscli.Usage("%s: want one controller object, found %d", ctrlFile, len(ctrls))
				}
				in.Controller = ctrls[0]
			}
			if fromCluster {
				b, done, err := f.connect(runCtx(cmd), needCluster)
				if err != nil {
					return err
				}
				defer done()
				if in.Controller == nil {
					if in.Controller, err = b.ControllerObject(ctx, controller); err != nil {
						return err
					}
				}
				in.Resolve = b.Resolver(ctx)
				in.List = b.ClusterLister()
				if err := liveParent(cmd, b, in.Parent); err != nil {
					return err
				}
			} else {
				if in.Controller == nil {
					return opscli.Usage("without --from-cluster the controller is a file: -c FILE")
				}
				for _, given := range []struct {
					at   string
					objs *[]*unstructured.Unstructured
				}{{childrenAt, &in.Children}, {inputsAt, &in.Inputs}, {relAt, &in.Related}} {
					if given.at != "" {
						if *given.objs, err = readObjects(given.at); err != nil {
							return err
						}
					}
				}
				known := append([]*unstructured.Unstructured{in.Parent}, in.Children...)
				known = append(append(known, in.Inputs...), in.Related...)
				in.Resolve = render.Offline(known...)
			}
			res, err := render.Render(ctx, in)
			if err != nil {
				return err
			}
			if err := opscli.Print(out, format, res, func(w io.Writer) error { return opscli.WriteRender(w, res) }); err != nil {
				return err
			}
			if res.Changed() {
				return &opscli.ExitCodeError{Code: opscli.ExitDiffers, Err: errors.New("the desired state differs from the observed one")}
			}
			return nil
		},
	}
	f = newOpsFlags(cmd)
	fs := cmd.Flags()
	fs.StringVarP(&ctrlFile, "controller-file", "c", "", "the controller object (YAML or JSON file)")
	fs.StringVarP(&parentFile, "parent", "p", "", "the parent object (YAML or JSON file)")
	fs.StringVar(&childrenAt, "children", "", "the observed children: a file or a directory of YAML/JSON files (default: none)")
	fs.BoolVar(&fromCluster, "from-cluster", false, "observe the children (and the parent's live metadata and status) in the cluster")
	fs.StringVar(&inputsAt, "inputs", "", "a MapController's input objects: a file or a directory of YAML/JSON files (default: none)")
	fs.StringVar(&relAt, "related", "", "the objects a customize hook's related rules select from: a file or a directory (default: none)")
	fs.StringVar(&hookURL, "hook-url", "", "call this URL instead of the controller's sync, finalize, map or tombstone hook")
	fs.StringVar(&customizeURL, "customize-url", "", "call this URL instead of the controller's customize hook")
	fs.StringSliceVar(&relatedPolicy, "related-resources", nil, "what customize hooks' related rules may name, as the dispatcher's flag (<group>/<resource>, * for any, -<entry> denies; default: everything)")
	fs.StringVar(&controller, "controller", "", "the controller in the cluster (<kind>/<name> or a name), with --from-cluster or --all")
	fs.BoolVar(&all, "all", false, "render every live parent of --controller from the cluster and summarise the changes")
	return cmd
}

// liveParent fills in what a parent file usually lacks from the live
// parent: its UID (which finds its children), resourceVersion, generation,
// finalizers and status. A parent that does not exist yet keeps the file's.
func liveParent(cmd *cobra.Command, b *opscli.Bus, p *unstructured.Unstructured) error {
	live, err := b.LiveObject(runCtx(cmd), p)
	if apierrors.IsNotFound(err) {
		fmt.Fprintf(cmd.ErrOrStderr(), "note: %s %s does not exist in the cluster: rendering it as new\n", p.GetKind(), p.GetName())
		return nil
	}
	if err != nil {
		return err
	}
	if p.GetUID() == "" {
		p.SetUID(live.GetUID())
	}
	if p.GetResourceVersion() == "" {
		p.SetResourceVersion(live.GetResourceVersion())
	}
	if p.GetGeneration() == 0 {
		p.SetGeneration(live.GetGeneration())
	}
	if len(p.GetFinalizers()) == 0 {
		p.SetFinalizers(live.GetFinalizers())
	}
	if _, ok := p.Object["status"]; !ok {
		if st, ok := live.Object["status"]; ok {
			p.Object["status"] = st
		}
	}
	if p.GetDeletionTimestamp() == nil && live.GetDeletionTimestamp() != nil {
		p.SetDeletionTimestamp(live.GetDeletionTimestamp())
	}
	return nil
}

// readObjects reads the objects of a YAML or JSON file (several documents,
// and v1 List kinds, allowed), or of every such file in a directory.
func readObjects(path string) ([]*unstructured.Unstructured, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, opscli.Usage("%v", err)
	}
	files := []string{path}
	if st.IsDir() {
		files = nil
		entries, err := os.ReadDir(path)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			ext := strings.ToLower(filepath.Ext(e.Name()))
			if !e.IsDir() && (ext == ".yaml" || ext == ".yml" || ext == ".json") {
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
		sort.Strings(files)
	}
	var out []*unstructured.Unstructured
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var obj map[string]any
			if err := dec.Decode(&obj); err == io.EOF {
				break
			} else if err != nil {
				return nil, opscli.Usage("%s: %v", file, err)
			}
			if len(obj) == 0 {
				continue
			}
			u := &unstructured.Unstructured{Object: obj}
			if u.IsList() {
				l, err := u.ToList()
				if err != nil {
					return nil, opscli.Usage("%s: %v", file, err)
				}
				for i := range l.Items {
					out = append(out, &l.Items[i])
				}
				continue
			}
			if u.GetKind() == "" || u.GetAPIVersion() == "" || u.GetName() == "" {
				return nil, opscli.Usage("%s: an object without apiVersion, kind or metadata.name", file)
			}
			out = append(out, u)
		}
	}
	return out, nil
}
