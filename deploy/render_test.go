package deploy

import (
	"fmt"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// The two kustomizations the repository ships: the default (upstream)
// profile and the hardened overlay.
const (
	kustomizeDefault  = "."
	kustomizeHardened = "overlays/hardened"
)

// kustomizeBuild renders a kustomization as `kubectl apply -k` would, with
// kustomize's own library (krusty), and returns its objects in order.
func kustomizeBuild(dir string) ([]map[string]any, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s: %w", dir, err)
	}
	out, err := m.AsYaml()
	if err != nil {
		return nil, err
	}
	return parseDocs(out)
}

// release is where a Helm render installs.
type release struct {
	name, namespace string
}

// defaultRelease is `helm install metabus deploy/helm/metabus -n metabus`,
// whose names are those of the kustomization.
var defaultRelease = release{"metabus", "metabus"}

// helmRender renders the chart with Helm's own engine for a first install
// (lookup finds nothing), validating values against values.schema.json as
// `helm install` does, and returns the objects in a stable order. The
// chart's crds/ are not included (Helm installs them before the release).
func helmRender(values map[string]any, rel release) ([]map[string]any, error) {
	files, err := helmRenderFiles(values, rel)
	if err != nil {
		return nil, err
	}
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	var objs []map[string]any
	for _, name := range names {
		if strings.HasSuffix(name, "NOTES.txt") {
			continue
		}
		docs, err := parseDocs([]byte(files[name]))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		objs = append(objs, docs...)
	}
	return objs, nil
}

// byKindName indexes objects by "Kind/name"; the same Kind/name twice (in
// two namespaces) is an error, since no render here needs it.
func byKindName(objs []map[string]any) (map[string]map[string]any, error) {
	out := map[string]map[string]any{}
	for _, o := range objs {
		key := str(o, "kind") + "/" + str(o, "metadata", "name")
		if out[key] != nil && str(o, "kind") != "Role" && str(o, "kind") != "RoleBinding" {
			return nil, fmt.Errorf("%s rendered twice", key)
		}
		if out[key] == nil {
			out[key] = o
		}
	}
	return out, nil
}

// helmRenderFiles renders the chart as helmRender does and returns the
// rendered text of each template (NOTES.txt included), by path.
func helmRenderFiles(values map[string]any, rel release) (map[string]string, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return nil, fmt.Errorf("load chart: %w", err)
	}
	rv, err := chartutil.ToRenderValues(ch, values, chartutil.ReleaseOptions{Name: rel.name, Namespace: rel.namespace, IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		return nil, fmt.Errorf("values: %w", err)
	}
	return engine.Render(ch, rv)
}
