// Package deploy holds the installation artifacts of metabus (CRDs, RBAC,
// NATS configuration, kustomization, Helm chart) and the tests that keep
// them consistent with each other, with pkg/api/v1alpha1 and with upstream
// Metacontroller manifests.
//
// The tests need no cluster: CRD schemas are checked with a small structural
// schema validator (types, enums, required, preserve-unknown-fields, the
// strict unknown-field rejection kubectl asks the API server for),
// `kubectl kustomize` is run when kubectl is installed, and the Helm chart is
// rendered with Helm's own engine (helmrender_test.go).
package deploy

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/metabus/metabus/pkg/natscreds"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/services/applier"
)

// ---------------------------------------------------------------------------
// YAML helpers

// readDocs returns the non-empty YAML documents of a file as JSON-like maps
// (integers as int64, floats as float64). Duplicate keys are errors.
func readDocs(t *testing.T, path string) []map[string]any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	docs, err := parseDocs(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return docs
}

func parseDocs(data []byte) ([]map[string]any, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []map[string]any
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		j, err := yaml.YAMLToJSONStrict(doc)
		if err != nil {
			return nil, fmt.Errorf("document %d: %w", i, err)
		}
		if s := string(bytes.TrimSpace(j)); s == "null" || s == "" {
			continue // only comments
		}
		var m map[string]any
		if err := utiljson.Unmarshal(j, &m); err != nil {
			return nil, fmt.Errorf("document %d is not a mapping: %w", i, err)
		}
		out = append(out, m)
	}
}

func str(obj map[string]any, fields ...string) string {
	s, _, _ := unstructured.NestedString(obj, fields...)
	return s
}

func slice(obj map[string]any, fields ...string) []any {
	s, _, _ := unstructured.NestedSlice(obj, fields...)
	return s
}

func mapping(obj map[string]any, fields ...string) map[string]any {
	m, _, _ := unstructured.NestedMap(obj, fields...)
	return m
}

func stringList(v []any) []string {
	var out []string
	for _, x := range v {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

func objKey(o map[string]any) string {
	return fmt.Sprintf("%s/%s %s/%s", str(o, "apiVersion"), str(o, "kind"), str(o, "metadata", "namespace"), str(o, "metadata", "name"))
}

// skipDir reports directories under deploy/ that hold no plain manifests.
func skipDir(rel string) bool {
	base := filepath.Base(rel)
	return rel == filepath.Join("helm", "metabus", "templates") ||
		(rel != "." && (strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_")))
}

// ---------------------------------------------------------------------------
// Every YAML file under deploy/

func TestManifestsParse(t *testing.T) {
	notObjects := map[string]bool{
		"kustomization.yaml": true,
		filepath.Join("overlays", "hardened", "kustomization.yaml"):     true,
		filepath.Join("overlays", "plaintext", "kustomization.yaml"):    true,
		filepath.Join("components", "bus-events", "kustomization.yaml"): true,
		// Upstream Metacontroller's chart values (a test fixture).
		filepath.Join("testdata", "upstream-v4.17.2-values.yaml"): true,
		filepath.Join("helm", "metabus", "Chart.yaml"):            true,
		filepath.Join("helm", "metabus", "values.yaml"):           true,
		// Prometheus rule files (the PrometheusRule's spec).
		filepath.Join("monitoring", "metabus-rules.yaml"):                             true,
		filepath.Join("helm", "metabus", "files", "monitoring", "metabus-rules.yaml"): true,
		// docker-compose.yaml's Prometheus and Grafana configuration.
		filepath.Join("compose", "prometheus.yml"):              true,
		filepath.Join("compose", "grafana", "datasources.yaml"): true,
		filepath.Join("compose", "grafana", "dashboards.yaml"):  true,
	}
	seen := map[string]string{}
	n := 0
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if skipDir(path) {
				return filepath.SkipDir
			}
			return nil
		}
		if ext := filepath.Ext(path); ext != ".yaml" && ext != ".yml" {
			return nil
		}
		docs := readDocs(t, path)
		if len(docs) == 0 {
			t.Errorf("%s: no YAML documents", path)
		}
		if notObjects[path] {
			return nil
		}
		for i, o := range docs {
			for _, f := range [][]string{{"apiVersion"}, {"kind"}, {"metadata", "name"}} {
				if str(o, f...) == "" {
					t.Errorf("%s document %d: %s is missing", path, i, strings.Join(f, "."))
				}
			}
			n++
			// Helm copies, overlays' copies and test samples may repeat
			// objects; the installable manifests may not.
			if strings.HasPrefix(path, "helm"+string(filepath.Separator)) || strings.HasPrefix(path, "testdata"+string(filepath.Separator)) ||
				strings.HasPrefix(path, "overlays"+string(filepath.Separator)) {
				continue
			}
			if prev, dup := seen[objKey(o)]; dup {
				t.Errorf("%s: %s is also defined in %s", path, objKey(o), prev)
			}
			seen[objKey(o)] = path
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n < 30 {
		t.Errorf("only %d objects found under deploy/; is the walk skipping files?", n)
	}
}

// ---------------------------------------------------------------------------
// Structural schema model and validator

// schema is the subset of OpenAPI v3 the CRDs use. It is decoded with
// unknown fields disallowed, so a keyword this validator does not implement
// (pattern, minimum, oneOf, ...) fails the test instead of being ignored.
type schema struct {
	Description          string             `json:"description,omitempty"`
	Type                 string             `json:"type,omitempty"`
	Format               string             `json:"format,omitempty"`
	Enum                 []any              `json:"enum,omitempty"`
	Required             []string           `json:"required,omitempty"`
	Properties           map[string]*schema `json:"properties,omitempty"`
	Items                *schema            `json:"items,omitempty"`
	AdditionalProperties *schema            `json:"additionalProperties,omitempty"`
	Nullable             bool               `json:"nullable,omitempty"`
	PreserveUnknown      bool               `json:"x-kubernetes-preserve-unknown-fields,omitempty"`
	IntOrString          bool               `json:"x-kubernetes-int-or-string,omitempty"`
}

type crdInfo struct {
	path   string
	obj    map[string]any
	schema *schema
}

func loadCRD(t *testing.T, path string) crdInfo {
	t.Helper()
	docs := readDocs(t, path)
	if len(docs) != 1 {
		t.Fatalf("%s: want exactly one document, got %d", path, len(docs))
	}
	obj := docs[0]
	versions := slice(obj, "spec", "versions")
	if len(versions) != 1 {
		t.Fatalf("%s: want one version, got %d", path, len(versions))
	}
	raw, err := json.Marshal(mapping(versions[0].(map[string]any), "schema", "openAPIV3Schema"))
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var s schema
	if err := dec.Decode(&s); err != nil {
		t.Fatalf("%s: schema uses something the test's validator does not implement (extend it): %v", path, err)
	}
	return crdInfo{path: path, obj: obj, schema: &s}
}

func loadCRDs(t *testing.T) map[string]crdInfo {
	t.Helper()
	out := map[string]crdInfo{}
	for _, f := range []string{"compositecontrollers", "decoratorcontrollers", "mapcontrollers", "controllerrevisions"} {
		c := loadCRD(t, filepath.Join("crds", f+".yaml"))
		out[str(c.obj, "spec", "names", "kind")] = c
	}
	return out
}

// checkStructural applies the API server's structural-schema rules that
// matter here: every node has a type, properties/items/additionalProperties
// only where the type allows them, enums of the node's type, and a root
// metadata that is only "type: object".
func checkStructural(path string, s *schema, errs *[]string) {
	bad := func(format string, args ...any) {
		*errs = append(*errs, path+": "+fmt.Sprintf(format, args...))
	}
	if s.Type == "" && !s.IntOrString {
		bad("no type")
	}
	if s.Type != "object" {
		if len(s.Properties) > 0 || s.AdditionalProperties != nil || len(s.Required) > 0 || s.PreserveUnknown {
			bad("properties/required/additionalProperties/preserve-unknown-fields on a %q node", s.Type)
		}
	}
	if s.Type == "object" && len(s.Properties) > 0 && s.AdditionalProperties != nil {
		bad("both properties and additionalProperties")
	}
	if (s.Type == "array") != (s.Items != nil) {
		bad("items must be set exactly on arrays")
	}
	for _, r := range s.Required {
		if _, ok := s.Properties[r]; !ok {
			bad("required %q is not a property", r)
		}
	}
	for _, e := range s.Enum {
		if err := checkType(e, s); err != "" {
			bad("enum value %v: %s", e, err)
		}
	}
	for name, p := range s.Properties {
		checkStructural(path+"."+name, p, errs)
	}
	if s.Items != nil {
		checkStructural(path+"[]", s.Items, errs)
	}
	if s.AdditionalProperties != nil {
		checkStructural(path+"{}", s.AdditionalProperties, errs)
	}
}

// checkType returns "" if v has the node's type.
func checkType(v any, s *schema) string {
	if s.IntOrString {
		switch v.(type) {
		case int64, string:
			return ""
		}
		return fmt.Sprintf("Invalid value: %T: must be an integer or a string", v)
	}
	ok := false
	switch s.Type {
	case "object":
		_, ok = v.(map[string]any)
	case "array":
		_, ok = v.([]any)
	case "string":
		_, ok = v.(string)
	case "boolean":
		_, ok = v.(bool)
	case "integer":
		var i int64
		i, ok = v.(int64)
		if ok && s.Format == "int32" && (i > math.MaxInt32 || i < math.MinInt32) {
			return "Invalid value: out of int32 range"
		}
	case "number":
		switch v.(type) {
		case int64, float64:
			ok = true
		}
	}
	if !ok {
		return fmt.Sprintf("Invalid value: %q: must be of type %s", typeName(v), s.Type)
	}
	return ""
}

func typeName(v any) string {
	switch v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case bool:
		return "boolean"
	case int64:
		return "integer"
	case float64:
		return "number"
	}
	return fmt.Sprintf("%T", v)
}

// validate checks v against s the way the API server does for a custom
// resource created with strict field validation (kubectl's default since
// 1.27): nulls of non-nullable fields are pruned (so they count as absent),
// unknown fields are errors unless an enclosing object preserves them.
func validate(path string, v any, s *schema, errs *[]string) {
	bad := func(p, msg string) { *errs = append(*errs, p+": "+msg) }
	if v == nil {
		if !s.Nullable {
			bad(path, "Invalid value: null")
		}
		return
	}
	if msg := checkType(v, s); msg != "" {
		bad(path, msg)
		return
	}
	if len(s.Enum) > 0 && !slices.ContainsFunc(s.Enum, func(e any) bool { return e == v }) {
		var allowed []string
		for _, e := range s.Enum {
			allowed = append(allowed, fmt.Sprintf("%q", e))
		}
		bad(path, fmt.Sprintf("Unsupported value: %q: supported values: %s", fmt.Sprint(v), strings.Join(allowed, ", ")))
	}
	join := func(k string) string {
		if path == "" {
			return k
		}
		return path + "." + k
	}
	switch val := v.(type) {
	case map[string]any:
		for _, r := range s.Required {
			if x, ok := val[r]; !ok || (x == nil && (s.Properties[r] == nil || !s.Properties[r].Nullable)) {
				bad(join(r), "Required value")
			}
		}
		keys := make([]string, 0, len(val))
		for k := range val {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			x := val[k]
			if path == "" && k == "metadata" {
				continue // validated as ObjectMeta, not by the schema
			}
			switch p := s.Properties[k]; {
			case p != nil:
				if x == nil && !p.Nullable {
					continue // pruned
				}
				validate(join(k), x, p, errs)
			case s.AdditionalProperties != nil:
				validate(join(k), x, s.AdditionalProperties, errs)
			case s.PreserveUnknown:
			default:
				bad(join(k), "unknown field")
			}
		}
	case []any:
		for i, x := range val {
			validate(fmt.Sprintf("%s[%d]", path, i), x, s.Items, errs)
		}
	}
}

// ---------------------------------------------------------------------------
// CRDs

func TestCRDs(t *testing.T) {
	crds := loadCRDs(t)
	want := []struct {
		kind, plural, singular string
		short                  []string
		scope                  string
		status                 bool
	}{
		{"CompositeController", "compositecontrollers", "compositecontroller", []string{"cc", "cctl"}, "Cluster", true},
		{"DecoratorController", "decoratorcontrollers", "decoratorcontroller", []string{"dec", "decorators"}, "Cluster", true},
		{"MapController", "mapcontrollers", "mapcontroller", []string{"mapc"}, "Cluster", true},
		{"ControllerRevision", "controllerrevisions", "controllerrevision", nil, "Namespaced", false},
	}
	for _, w := range want {
		t.Run(w.kind, func(t *testing.T) {
			c, ok := crds[w.kind]
			if !ok {
				t.Fatalf("no CRD for kind %s", w.kind)
			}
			o := c.obj
			if got := str(o, "apiVersion"); got != "apiextensions.k8s.io/v1" {
				t.Errorf("apiVersion %q", got)
			}
			if got, want := str(o, "metadata", "name"), w.plural+".metacontroller.k8s.io"; got != want {
				t.Errorf("name %q, want %q", got, want)
			}
			if got := str(o, "spec", "group"); got != "metacontroller.k8s.io" {
				t.Errorf("group %q", got)
			}
			// Protected *.k8s.io groups are refused without it.
			if str(o, "metadata", "annotations", "api-approved.kubernetes.io") == "" {
				t.Error("missing annotation api-approved.kubernetes.io (required for *.k8s.io groups)")
			}
			names := mapping(o, "spec", "names")
			for k, v := range map[string]string{"plural": w.plural, "singular": w.singular, "kind": w.kind, "listKind": w.kind + "List"} {
				if got, _ := names[k].(string); got != v {
					t.Errorf("names.%s = %q, want %q", k, got, v)
				}
			}
			if got := stringList(slice(o, "spec", "names", "shortNames")); !slices.Equal(got, w.short) {
				t.Errorf("shortNames %v, want %v", got, w.short)
			}
			if got := str(o, "spec", "scope"); got != w.scope {
				t.Errorf("scope %q, want %q", got, w.scope)
			}
			v := slice(o, "spec", "versions")[0].(map[string]any)
			if v["name"] != "v1alpha1" || v["served"] != true || v["storage"] != true {
				t.Errorf("version %v served=%v storage=%v, want v1alpha1 served and storage", v["name"], v["served"], v["storage"])
			}
			_, hasStatus, _ := unstructured.NestedMap(v, "subresources", "status")
			if hasStatus != w.status {
				t.Errorf("status subresource %v, want %v", hasStatus, w.status)
			}
			var errs []string
			checkStructural("openAPIV3Schema", c.schema, &errs)
			if md := c.schema.Properties["metadata"]; md == nil || md.Type != "object" || len(md.Properties) > 0 {
				errs = append(errs, "root metadata must be just {type: object}")
			}
			for _, e := range errs {
				t.Error("not structural: " + e)
			}
		})
	}

	t.Run("preserve-unknown-fields", func(t *testing.T) {
		// Unknown upstream fields must survive in these places (see the
		// comment at the top of the CRD files).
		for kind, paths := range map[string][]string{
			"CompositeController": {"spec", "spec.parentResource", "spec.childResources[]", "spec.childResources[].updateStrategy",
				"spec.hooks", "spec.hooks.sync", "spec.hooks.sync.webhook", "spec.hooks.finalize.webhook", "spec.hooks.customize.webhook",
				"spec.endpointConfigs[]", "status"},
			"DecoratorController": {"spec", "spec.resources[]", "spec.attachments[]", "spec.attachments[].updateStrategy",
				"spec.hooks", "spec.hooks.sync", "spec.hooks.sync.webhook", "spec.hooks.finalize.webhook", "spec.hooks.customize.webhook", "status"},
			// MapController: no upstream to stay compatible with, so only
			// the upstream-shaped hooks and webhooks preserve them.
			"MapController":      {"spec.hooks.map", "spec.hooks.map.webhook", "spec.hooks.tombstone.webhook", "spec.endpointConfigs[]", "status"},
			"ControllerRevision": {"parentPatch"},
		} {
			for _, p := range paths {
				n := node(crds[kind].schema, p)
				if n == nil || !n.PreserveUnknown {
					t.Errorf("%s %s: want x-kubernetes-preserve-unknown-fields: true", kind, p)
				}
			}
		}
		// ...but not at the root (that would accept anything) nor on
		// ControllerRevision, whose fields are top-level.
		for kind, c := range crds {
			if c.schema.PreserveUnknown {
				t.Errorf("%s: root must not preserve unknown fields", kind)
			}
		}
		// A misspelt MapController field must be rejected, not kept.
		for _, p := range []string{"spec", "spec.parentResource", "spec.inputResources[]", "spec.outputResources[]", "spec.outputResources[].updateStrategy", "spec.hooks"} {
			if n := node(crds["MapController"].schema, p); n == nil || n.PreserveUnknown {
				t.Errorf("MapController %s: want unknown fields rejected (no upstream release to be compatible with)", p)
			}
		}
		if cr := crds["ControllerRevision"].schema; cr.Properties["spec"] != nil || cr.Properties["children"] == nil {
			t.Error("ControllerRevision: parentPatch and children are top-level fields, there is no spec")
		}
	})
}

// node returns the schema at a dotted path ("a.b[].c").
func node(s *schema, path string) *schema {
	for _, part := range strings.Split(path, ".") {
		if s == nil {
			return nil
		}
		arr := strings.HasSuffix(part, "[]")
		s = s.Properties[strings.TrimSuffix(part, "[]")]
		if arr && s != nil {
			s = s.Items
		}
	}
	return s
}

// TestCRDsCoverGoTypes checks, from the source of pkg/api/v1alpha1/types.go,
// that every JSON field of the Go API types is in the CRD schema with a
// matching type, and that enums equal the Go constants. A field added to
// the types without updating the CRDs fails here.
func TestCRDsCoverGoTypes(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filepath.Join("..", "pkg", "api", "v1alpha1", "types.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	g := goTypes{structs: map[string]*ast.StructType{}, strs: map[string]bool{}, enums: map[string][]string{}}
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok {
			continue
		}
		for _, sp := range gd.Specs {
			switch sp := sp.(type) {
			case *ast.TypeSpec:
				switch tt := sp.Type.(type) {
				case *ast.StructType:
					g.structs[sp.Name.Name] = tt
				case *ast.Ident:
					if tt.Name == "string" {
						g.strs[sp.Name.Name] = true
					}
				}
			case *ast.ValueSpec:
				id, ok := sp.Type.(*ast.Ident)
				if gd.Tok != token.CONST || !ok {
					continue
				}
				for _, v := range sp.Values {
					if lit, ok := v.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						s, _ := strconv.Unquote(lit.Value)
						g.enums[id.Name] = append(g.enums[id.Name], s)
					}
				}
			}
		}
	}
	if len(g.structs) < 20 || len(g.enums) < 3 {
		t.Fatalf("parsed only %d structs and %d enums from types.go", len(g.structs), len(g.enums))
	}
	crds := loadCRDs(t)
	for kind, c := range crds {
		t.Run(kind, func(t *testing.T) {
			g.t = t
			g.covered = 0
			g.checkStruct("", kind, c.schema)
			if g.covered < 3 {
				t.Errorf("only %d fields compared", g.covered)
			}
		})
	}
}

type goTypes struct {
	t       *testing.T
	structs map[string]*ast.StructType
	strs    map[string]bool     // type X string
	enums   map[string][]string // constants of those types
	covered int
}

func (g *goTypes) checkStruct(path, name string, s *schema) {
	st := g.structs[name]
	if st == nil {
		g.t.Errorf("%s: no struct %s in types.go", path, name)
		return
	}
	if s.Type != "object" {
		g.t.Errorf("%s (%s): schema type %q, want object", path, name, s.Type)
		return
	}
	for _, fld := range st.Fields.List {
		tag := ""
		if fld.Tag != nil {
			tag, _ = strconv.Unquote(fld.Tag.Value)
		}
		jsonName, opts, _ := strings.Cut(reflectTag(tag, "json"), ",")
		if jsonName == "-" {
			continue
		}
		if len(fld.Names) == 0 && jsonName == "" || strings.Contains(opts, "inline") {
			g.checkEmbedded(path, fld.Type, s)
			continue
		}
		p := s.Properties[jsonName]
		fp := strings.TrimPrefix(path+"."+jsonName, ".")
		if p == nil {
			g.t.Errorf("%s: field of Go type %s is not in the CRD schema", fp, name)
			continue
		}
		g.covered++
		g.checkType(fp, fld.Type, p)
	}
}

func reflectTag(tag, key string) string {
	for tag != "" {
		k, rest, ok := strings.Cut(tag, ":\"")
		if !ok {
			return ""
		}
		v, rest2, _ := strings.Cut(rest, "\"")
		if strings.TrimSpace(k) == key {
			return v
		}
		tag = strings.TrimSpace(rest2)
	}
	return ""
}

func (g *goTypes) checkEmbedded(path string, e ast.Expr, s *schema) {
	switch e := e.(type) {
	case *ast.Ident:
		g.checkStruct(path, e.Name, s)
	case *ast.SelectorExpr:
		if e.Sel.Name == "TypeMeta" {
			for _, f := range []string{"apiVersion", "kind"} {
				if p := s.Properties[f]; p == nil || p.Type != "string" {
					g.t.Errorf("%s.%s: want a string property", path, f)
				}
			}
			return
		}
		g.t.Errorf("%s: embedded %s.%s not handled by the test", path, e.X, e.Sel.Name)
	}
}

func (g *goTypes) want(path string, s *schema, typ string) bool {
	if s.Type != typ {
		g.t.Errorf("%s: schema type %q, want %q", path, s.Type, typ)
		return false
	}
	return true
}

func (g *goTypes) checkType(path string, e ast.Expr, s *schema) {
	switch e := e.(type) {
	case *ast.StarExpr:
		g.checkType(path, e.X, s)
	case *ast.ArrayType:
		if g.want(path, s, "array") {
			g.checkType(path+"[]", e.Elt, s.Items)
		}
	case *ast.MapType:
		if g.want(path, s, "object") {
			if s.AdditionalProperties == nil {
				g.t.Errorf("%s: a Go map needs additionalProperties", path)
				return
			}
			g.checkType(path+"{}", e.Value, s.AdditionalProperties)
		}
	case *ast.Ident:
		switch {
		case e.Name == "string":
			g.want(path, s, "string")
		case e.Name == "bool":
			g.want(path, s, "boolean")
		case e.Name == "int32" || e.Name == "int64" || e.Name == "int":
			g.want(path, s, "integer")
		case g.strs[e.Name]:
			if g.want(path, s, "string") && len(g.enums[e.Name]) > 0 {
				var got []string
				for _, v := range s.Enum {
					got = append(got, fmt.Sprint(v))
				}
				wantEnum := slices.Clone(g.enums[e.Name])
				sort.Strings(got)
				sort.Strings(wantEnum)
				if !slices.Equal(got, wantEnum) {
					g.t.Errorf("%s: enum %v, want the Go constants of %s %v", path, got, e.Name, wantEnum)
				}
			}
		case g.structs[e.Name] != nil:
			if len(g.structs[e.Name].Fields.List) == 0 { // status: struct{}
				g.want(path, s, "object")
				return
			}
			g.checkStruct(path, e.Name, s)
		default:
			g.t.Errorf("%s: Go type %s not handled by the test", path, e.Name)
		}
	case *ast.SelectorExpr:
		switch fmt.Sprintf("%s.%s", e.X, e.Sel.Name) {
		case "metav1.ObjectMeta":
			g.want(path, s, "object")
		case "metav1.Duration":
			g.want(path, s, "string")
		case "json.RawMessage":
			if g.want(path, s, "object") && !s.PreserveUnknown {
				g.t.Errorf("%s: raw JSON needs x-kubernetes-preserve-unknown-fields", path)
			}
		case "metav1.LabelSelector":
			if g.want(path, s, "object") {
				if ml := s.Properties["matchLabels"]; ml == nil || ml.AdditionalProperties == nil || ml.AdditionalProperties.Type != "string" {
					g.t.Errorf("%s.matchLabels: want a map of strings", path)
				}
				g.checkRequirements(path+".matchExpressions", s.Properties["matchExpressions"])
			}
		case "metav1.LabelSelectorRequirement":
			g.checkRequirement(path, s)
		default:
			g.t.Errorf("%s: Go type %s.%s not handled by the test", path, e.X, e.Sel.Name)
		}
	default:
		g.t.Errorf("%s: Go type %T not handled by the test", path, e)
	}
}

func (g *goTypes) checkRequirements(path string, s *schema) {
	if s == nil || s.Type != "array" || s.Items == nil {
		g.t.Errorf("%s: want an array of requirements", path)
		return
	}
	g.checkRequirement(path+"[]", s.Items)
}

func (g *goTypes) checkRequirement(path string, s *schema) {
	if !g.want(path, s, "object") {
		return
	}
	for f, typ := range map[string]string{"key": "string", "operator": "string", "values": "array"} {
		if p := s.Properties[f]; p == nil || p.Type != typ {
			g.t.Errorf("%s.%s: want type %s", path, f, typ)
		}
	}
}

// TestSamplesAgainstCRDs validates upstream-style manifests (testdata/valid)
// and broken ones (testdata/invalid, each with a "# want-error:" line).
func TestSamplesAgainstCRDs(t *testing.T) {
	crds := loadCRDs(t)
	validateObj := func(o map[string]any) ([]string, error) {
		if got := str(o, "apiVersion"); got != "metacontroller.k8s.io/v1alpha1" {
			return nil, fmt.Errorf("apiVersion %q", got)
		}
		c, ok := crds[str(o, "kind")]
		if !ok {
			return nil, fmt.Errorf("no CRD for kind %q", str(o, "kind"))
		}
		namespaced := str(c.obj, "spec", "scope") == "Namespaced"
		if ns := str(o, "metadata", "namespace"); (ns != "") != namespaced {
			return nil, fmt.Errorf("namespace %q on a %s resource", ns, str(c.obj, "spec", "scope"))
		}
		var errs []string
		validate("", o, c.schema, &errs)
		return errs, nil
	}

	valid, _ := filepath.Glob(filepath.Join("testdata", "valid", "*.yaml"))
	invalid, _ := filepath.Glob(filepath.Join("testdata", "invalid", "*.yaml"))
	if len(valid) < 5 || len(invalid) < 10 {
		t.Fatalf("found %d valid and %d invalid samples", len(valid), len(invalid))
	}
	kinds := map[string]bool{}
	for _, path := range valid {
		t.Run(path, func(t *testing.T) {
			for _, o := range readDocs(t, path) {
				kinds[str(o, "kind")] = true
				errs, err := validateObj(o)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range errs {
					t.Errorf("%s: %s", str(o, "metadata", "name"), e)
				}
			}
		})
	}
	for k := range crds {
		if !kinds[k] {
			t.Errorf("no valid sample of kind %s", k)
		}
	}
	wantRE := regexp.MustCompile(`(?m)^# want-error: (.+)$`)
	for _, path := range invalid {
		t.Run(path, func(t *testing.T) {
			data, _ := os.ReadFile(path)
			m := wantRE.FindSubmatch(data)
			if m == nil {
				t.Fatal("no '# want-error:' line")
			}
			docs := readDocs(t, path)
			if len(docs) != 1 {
				t.Fatalf("want one object, got %d", len(docs))
			}
			errs, err := validateObj(docs[0])
			if err != nil {
				t.Fatal(err)
			}
			if !slices.ContainsFunc(errs, func(e string) bool { return strings.Contains(e, string(m[1])) }) {
				t.Errorf("want an error containing %q, got %q", m[1], errs)
			}
		})
	}
}

// ---------------------------------------------------------------------------
// RBAC

var services = []string{"watcher", "dispatcher", "applier", "revisions"}

type policyRule struct {
	groups, resources, verbs []string
	names                    []string // resourceNames; empty: any
	nonResource              bool
	role                     string // Kind/name (namespace) it came from
}

// String is the rule as one comparable line.
func (r policyRule) String() string {
	return fmt.Sprintf("%s groups=%v resources=%v names=%v verbs=%v", r.role, r.groups, r.resources, r.names, r.verbs)
}

func (r policyRule) writes() []string {
	var w []string
	for _, v := range r.verbs {
		switch v {
		case "create", "update", "patch", "delete", "deletecollection", "escalate", "bind", "impersonate", "*":
			w = append(w, v)
		}
	}
	return w
}

// targets lists group/resource pairs of the rule ("" is the core group).
func (r policyRule) targets() []string {
	var out []string
	for _, g := range r.groups {
		for _, res := range r.resources {
			out = append(out, g+"/"+res)
		}
	}
	return out
}

type rbacSet struct {
	objs []map[string]any
}

// applierAllResources is the applier's default write access on every
// resource, a file of its own so that leaving it out narrows the applier;
// dispatcherAllNamespaces likewise the dispatcher's reads of webhook
// Secrets in every namespace. The hardened profile leaves both out.
// credentials is the RBAC of the NATS credential generator.
const (
	applierAllResources     = "applier-all-resources"
	dispatcherAllNamespaces = "dispatcher-secrets-all-namespaces"
	credentialsRBAC         = "credentials"
)

// loadRBAC reads deploy/rbac, leaving out the files named in without.
func loadRBAC(t *testing.T, without ...string) rbacSet {
	var s rbacSet
	files, _ := filepath.Glob(filepath.Join("rbac", "*.yaml"))
	var want []string
	for _, svc := range append(slices.Clone(services), applierAllResources, dispatcherAllNamespaces, credentialsRBAC) {
		want = append(want, filepath.Join("rbac", svc+".yaml"))
	}
	slices.Sort(want)
	if !slices.Equal(files, want) {
		t.Fatalf("want one RBAC file per service plus %s.yaml, %s.yaml and %s.yaml %v, got %v", applierAllResources, dispatcherAllNamespaces, credentialsRBAC, want, files)
	}
	for _, f := range files {
		if !slices.Contains(without, strings.TrimSuffix(filepath.Base(f), ".yaml")) {
			s.objs = append(s.objs, readDocs(t, f)...)
		}
	}
	return s
}

// roleRules returns the rules of a role as the authorizer sees them: an
// aggregated ClusterRole's are those of every ClusterRole matching one of
// its selectors (what the clusterrole-aggregation controller writes).
func (s rbacSet) roleRules(role map[string]any) []any {
	selectors := slice(role, "aggregationRule", "clusterRoleSelectors")
	if len(selectors) == 0 {
		return slice(role, "rules")
	}
	var rules []any
	for _, o := range s.objs {
		if str(o, "kind") != "ClusterRole" || str(o, "metadata", "name") == str(role, "metadata", "name") {
			continue
		}
		labels := mapping(o, "metadata", "labels")
		for _, sel := range selectors {
			// matchLabels only: TestApplierAggregation keeps it so.
			match := true
			for k, v := range mapping(sel.(map[string]any), "matchLabels") {
				match = match && labels[k] == v
			}
			if match {
				rules = append(rules, slice(o, "rules")...)
				break
			}
		}
	}
	return rules
}

func (s rbacSet) find(kind, ns, name string) map[string]any {
	for _, o := range s.objs {
		if str(o, "kind") == kind && str(o, "metadata", "name") == name && str(o, "metadata", "namespace") == ns {
			return o
		}
	}
	return nil
}

// rulesFor returns every rule granted to a ServiceAccount through the
// bindings in the set, and whether it is bound at all.
func (s rbacSet) rulesFor(t *testing.T, ns, sa string) (rules []policyRule, bound bool) {
	for _, b := range s.objs {
		kind := str(b, "kind")
		if kind != "ClusterRoleBinding" && kind != "RoleBinding" {
			continue
		}
		match := false
		for _, sub := range slice(b, "subjects") {
			sm := sub.(map[string]any)
			if sm["kind"] == "ServiceAccount" && sm["name"] == sa && sm["namespace"] == ns {
				match = true
			}
		}
		if !match {
			continue
		}
		bound = true
		roleKind, roleName := str(b, "roleRef", "kind"), str(b, "roleRef", "name")
		roleNS := ""
		if roleKind == "Role" {
			roleNS = str(b, "metadata", "namespace")
		}
		role := s.find(roleKind, roleNS, roleName)
		if role == nil {
			t.Errorf("%s %s refers to missing %s %s", kind, str(b, "metadata", "name"), roleKind, roleName)
			continue
		}
		for _, r := range s.roleRules(role) {
			rm := r.(map[string]any)
			pr := policyRule{
				groups:    stringList(slice(rm, "apiGroups")),
				resources: stringList(slice(rm, "resources")),
				verbs:     stringList(slice(rm, "verbs")),
				names:     stringList(slice(rm, "resourceNames")),
				role:      fmt.Sprintf("%s/%s(%s)", roleKind, roleName, roleNS),
			}
			pr.nonResource = len(slice(rm, "nonResourceURLs")) > 0
			rules = append(rules, pr)
		}
	}
	return rules, bound
}

func TestRBAC(t *testing.T) {
	s := loadRBAC(t)
	const ns = "metabus"
	events := []string{"/events", "events.k8s.io/events"}
	for _, svc := range services {
		t.Run(svc, func(t *testing.T) {
			sa := "metabus-" + svc
			if s.find("ServiceAccount", ns, sa) == nil {
				t.Fatalf("no ServiceAccount %s/%s", ns, sa)
			}
			rules, bound := s.rulesFor(t, ns, sa)
			if !bound {
				t.Fatalf("ServiceAccount %s is not bound", sa)
			}
			writeTargets := map[string]bool{}
			for _, r := range rules {
				if r.nonResource {
					t.Errorf("%s grants nonResourceURLs", r.role)
				}
				for _, v := range r.verbs {
					if v == "*" || v == "escalate" || v == "bind" || v == "impersonate" {
						t.Errorf("%s grants verb %q", r.role, v)
					}
				}
				if len(r.writes()) > 0 {
					for _, tg := range r.targets() {
						writeTargets[tg] = true
						if strings.HasPrefix(tg, "coordination.k8s.io/leases") && !strings.HasPrefix(r.role, "Role/") {
							t.Errorf("%s: lease writes must come from a namespaced Role", r.role)
						}
					}
				}
			}
			for _, e := range events {
				if !hasGrant(rules, e, "create") || !hasGrant(rules, e, "patch") {
					t.Errorf("cannot create and patch %s", e)
				}
			}
			var allowedWrites []string
			switch svc {
			case "watcher":
				// A SubjectAccessReview writes nothing: it asks what a
				// controller's ServiceAccount may read.
				allowedWrites = append(slices.Clone(events), "coordination.k8s.io/leases", "authorization.k8s.io/subjectaccessreviews")
				for _, v := range []string{"get", "list", "watch"} {
					if !hasGrant(rules, "*/*", v) {
						t.Errorf("watcher cannot %s */* (informers for any controller-declared type)", v)
					}
					for _, r := range []string{"compositecontrollers", "decoratorcontrollers", "mapcontrollers", "controllerrevisions"} {
						if !hasGrant(rules, "metacontroller.k8s.io/"+r, v) {
							t.Errorf("watcher cannot %s %s", v, r)
						}
					}
				}
				for _, v := range []string{"get", "create", "update"} {
					if !hasGrant(rules, "coordination.k8s.io/leases", v) {
						t.Errorf("watcher cannot %s leases (leader election)", v)
					}
				}
				if role := s.find("Role", ns, "metabus-watcher-leader-election"); role == nil {
					t.Error("no leader-election Role in namespace metabus")
				}
			case "dispatcher":
				allowedWrites = events
				for _, r := range []string{"/secrets", "/configmaps"} {
					if !hasGrant(rules, r, "get") {
						t.Errorf("dispatcher cannot get %s (webhook TLS/auth)", r)
					}
					if hasGrant(rules, r, "list") || hasGrant(rules, r, "watch") {
						t.Errorf("dispatcher may list/watch %s; it only needs get", r)
					}
				}
				// Readable Secrets are a deliberate choice (issues #14, #22): those of
				// the metabus namespace through a namespaced Role, and those of every
				// namespace only through the file the hardened profile leaves out.
				for _, r := range rules {
					if hasGrant([]policyRule{r}, "/secrets", "get") || hasGrant([]policyRule{r}, "/configmaps", "get") {
						if r.role != "Role/metabus-dispatcher-secrets(metabus)" && r.role != "ClusterRole/metabus-dispatcher-secrets-all-namespaces()" {
							t.Errorf("%s grants the dispatcher Secrets/ConfigMaps; only metabus-dispatcher-secrets (Role) and metabus-dispatcher-secrets-all-namespaces may", r.role)
						}
					}
				}
				for _, r := range rules {
					for _, tg := range r.targets() {
						if tg != "/secrets" && tg != "/configmaps" && !slices.Contains(events, tg) {
							t.Errorf("dispatcher has access to %s (%s)", tg, r.role)
						}
					}
				}
			case "applier":
				allowedWrites = nil // anything: children can be any kind
				for _, v := range []string{"create", "update", "patch", "delete"} {
					if !hasGrant(rules, "*/*", v) {
						t.Errorf("applier cannot %s children of arbitrary kinds", v)
					}
				}
				if !hasGrant(rules, "*/*/status", "update") {
					t.Error("applier cannot update parent status")
				}
				// Live reads of parents: adoption recheck, finalizer release.
				if !hasGrant(rules, "*/*", "get") {
					t.Error("applier cannot get parents")
				}
				for _, v := range []string{"list", "watch"} {
					if hasGrant(rules, "*/*", v) {
						t.Errorf("applier may %s: it reads observed state from snapshots", v)
					}
				}
			case "revisions":
				allowedWrites = append(slices.Clone(events), "metacontroller.k8s.io/controllerrevisions")
				for _, v := range []string{"get", "list", "watch", "create", "update", "patch", "delete"} {
					if !hasGrant(rules, "metacontroller.k8s.io/controllerrevisions", v) {
						t.Errorf("revisions cannot %s controllerrevisions", v)
					}
				}
			}
			if allowedWrites != nil {
				for tg := range writeTargets {
					if !slices.Contains(allowedWrites, tg) {
						t.Errorf("%s has write verbs on %s; allowed only on %v", svc, tg, allowedWrites)
					}
				}
			}
		})
	}
	t.Run("every ServiceAccount is bound", func(t *testing.T) {
		for _, o := range s.objs {
			if str(o, "kind") == "ServiceAccount" {
				if _, bound := s.rulesFor(t, str(o, "metadata", "namespace"), str(o, "metadata", "name")); !bound {
					t.Errorf("ServiceAccount %s is not bound", str(o, "metadata", "name"))
				}
			}
		}
	})
}

// TestApplierAggregation: the applier's write access is the union of the
// ClusterRoles labelled metabus.dev/aggregate-to-applier (upstream's
// aggregate-to-metacontroller pattern), so that an admin can narrow it by
// leaving out rbac/applier-all-resources.yaml and labelling roles of their own.
func TestApplierAggregation(t *testing.T) {
	const label = "metabus.dev/aggregate-to-applier"
	full := loadRBAC(t)
	role := full.find("ClusterRole", "", "metabus-applier")
	if role == nil {
		t.Fatal("no ClusterRole metabus-applier")
	}
	if r := slice(role, "rules"); len(r) != 0 {
		t.Errorf("metabus-applier has rules of its own %v; the aggregation controller would overwrite them", r)
	}
	selectors := slice(role, "aggregationRule", "clusterRoleSelectors")
	if diff := cmp.Diff([]any{map[string]any{"matchLabels": map[string]any{label: "true"}}}, selectors); diff != "" {
		t.Errorf("metabus-applier aggregationRule.clusterRoleSelectors (-want +got):\n%s", diff)
	}
	for _, name := range []string{"metabus-applier-events", "metabus-applier-all-resources"} {
		if o := full.find("ClusterRole", "", name); o == nil || str(o, "metadata", "labels", label) != "true" {
			t.Errorf("ClusterRole %s missing or not labelled %s", name, label)
		}
	}
	// ApplyForbidden Events tell admins which label to put on a role.
	if applier.AggregateLabel != label {
		t.Errorf("services/applier names the label %q in its Events, the manifests %q", applier.AggregateLabel, label)
	}

	tests := []struct {
		reason  string
		without []string
		target  string
		verb    string
		want    bool
	}{
		{reason: "default: children of any kind", target: "apps/deployments", verb: "create", want: true},
		{reason: "default: parent status", target: "example.com/things/status", verb: "update", want: true},
		{reason: "default: events", target: "/events", verb: "create", want: true},
		{reason: "narrowed: no children", without: []string{applierAllResources}, target: "apps/deployments", verb: "create"},
		{reason: "narrowed: no Secrets", without: []string{applierAllResources}, target: "/secrets", verb: "update"},
		{reason: "narrowed: no parent status", without: []string{applierAllResources}, target: "example.com/things/status", verb: "update"},
		{reason: "narrowed: events still (ApplyForbidden must get through)", without: []string{applierAllResources}, target: "/events", verb: "create", want: true},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			rules, bound := loadRBAC(t, tt.without...).rulesFor(t, "metabus", "metabus-applier")
			if !bound {
				t.Fatal("metabus-applier is not bound")
			}
			if got := hasGrant(rules, tt.target, tt.verb); got != tt.want {
				t.Errorf("%s %s allowed: %v, want %v", tt.verb, tt.target, got, tt.want)
			}
		})
	}
}

// hasGrant reports whether a rule allows verb on target "group/resource"
// (or "group/resource/subresource"), honouring "*" like the RBAC authorizer.
func hasGrant(rules []policyRule, target, verb string) bool {
	group, res, _ := strings.Cut(target, "/")
	resource, sub, _ := strings.Cut(res, "/")
	for _, r := range rules {
		if !slices.Contains(r.verbs, verb) && !slices.Contains(r.verbs, "*") {
			continue
		}
		if len(r.names) > 0 {
			continue // named objects only, not the resource
		}
		if !slices.Contains(r.groups, group) && !slices.Contains(r.groups, "*") {
			continue
		}
		for _, rr := range r.resources {
			full := resource
			if sub != "" {
				full += "/" + sub
			}
			if rr == "*" || rr == full || (sub != "" && rr == "*/"+sub) {
				return true
			}
		}
	}
	return false
}

// ---------------------------------------------------------------------------
// Workloads

// dockerBinaries returns the binaries the Dockerfile installs into
// /usr/local/bin, keyed by name, with the package each is built from.
func dockerBinaries(t *testing.T) map[string]string {
	t.Helper()
	text := dockerfileText(t)
	if !regexp.MustCompile(`(?m)^COPY --from=build /out/ /usr/local/bin/\s*$`).MatchString(text) {
		t.Fatal("Dockerfile does not copy /out/ to /usr/local/bin/ in the runtime stage")
	}
	out := map[string]string{}
	for _, m := range regexp.MustCompile(`go build [^;&\n]*-o /out/(metabus[-a-z]*) (\./cmd/[a-z]+)`).FindAllStringSubmatch(text, -1) {
		out[m[1]] = m[2]
	}
	return out
}

// dockerfileText returns the Dockerfile without comment lines and with
// continuation lines joined.
func dockerfileText(t *testing.T) string {
	t.Helper()
	var lines []string
	for _, l := range strings.Split(readFile(t, filepath.Join("..", "Dockerfile")), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			lines = append(lines, l)
		}
	}
	return strings.ReplaceAll(strings.Join(lines, "\n"), "\\\n", " ")
}

type container struct {
	obj map[string]any
}

func (c container) args() []string    { return stringList(slice(c.obj, "args")) }
func (c container) command() []string { return stringList(slice(c.obj, "command")) }

func podContainer(t *testing.T, o map[string]any) container {
	t.Helper()
	cs := slice(o, "spec", "template", "spec", "containers")
	if len(cs) != 1 {
		t.Fatalf("%s: want one container, got %d", objKey(o), len(cs))
	}
	return container{cs[0].(map[string]any)}
}

func portNumber(c container, nameOrNumber any) int64 {
	switch v := nameOrNumber.(type) {
	case int64:
		return v
	case string:
		for _, p := range slice(c.obj, "ports") {
			pm := p.(map[string]any)
			if pm["name"] == v {
				n, _ := pm["containerPort"].(int64)
				return n
			}
		}
	}
	return -1
}

// deployed is what a metabus Deployment is expected to name: its image and
// NATS URL differ between deploy/apps (no tag), kustomize's output and
// Helm's (its NATS Service is <release>-nats).
type deployed struct {
	image, natsURL string
}

// mountedSecret returns the Secret whose volume container c of workload o
// mounts at path's directory, or "".
func mountedSecret(o map[string]any, c container, path string) string {
	if path == "" {
		return ""
	}
	for _, vm := range slice(c.obj, "volumeMounts") {
		m := vm.(map[string]any)
		if filepath.Dir(path) != m["mountPath"] {
			continue
		}
		for _, v := range slice(o, "spec", "template", "spec", "volumes") {
			vv := v.(map[string]any)
			if vv["name"] == m["name"] {
				return str(vv, "secret", "secretName")
			}
		}
	}
	return ""
}

// checkServiceDeployment checks the invariants every metabus Deployment
// must keep, whether it comes from deploy/apps, kustomize or Helm.
func checkServiceDeployment(t *testing.T, o map[string]any, svc string, binaries map[string]string, want deployed) {
	t.Helper()
	wantReplicas := map[string]int64{"watcher": 2, "dispatcher": 2, "applier": 2, "revisions": 2}[svc]
	if got, _, _ := unstructured.NestedInt64(o, "spec", "replicas"); got != wantReplicas {
		t.Errorf("replicas %d, want %d", got, wantReplicas)
	}
	if got := str(o, "spec", "template", "spec", "serviceAccountName"); got != "metabus-"+svc {
		t.Errorf("serviceAccountName %q", got)
	}
	// More than the consumers' AckWait (MC_DESIRED: 30s).
	if got, _, _ := unstructured.NestedInt64(o, "spec", "template", "spec", "terminationGracePeriodSeconds"); got != 45 {
		t.Errorf("terminationGracePeriodSeconds %d, want 45", got)
	}
	podSec := mapping(o, "spec", "template", "spec", "securityContext")
	if podSec["runAsNonRoot"] != true || str(podSec, "seccompProfile", "type") != "RuntimeDefault" {
		t.Errorf("pod securityContext %v", podSec)
	}
	c := podContainer(t, o)
	if got := str(c.obj, "image"); got != want.image {
		t.Errorf("image %q, want %q", got, want.image)
	}
	cmd := c.command()
	if len(cmd) != 1 || cmd[0] != "/usr/local/bin/metabus-"+svc {
		t.Errorf("command %v", cmd)
	} else if _, ok := binaries[filepath.Base(cmd[0])]; !ok {
		t.Errorf("command %s is not built by the Dockerfile (%v)", cmd[0], binaries)
	}
	args := c.args()
	for _, a := range []string{"--nats-url=" + want.natsURL, "--zap-log-level=info", "--metrics-address=:9999", "--health-probe-bind-address=:8081"} {
		if !slices.Contains(args, a) {
			t.Errorf("args %v lack %s", args, a)
		}
	}
	if got := slices.Contains(args, "--leader-election"); got != (svc == "watcher") {
		t.Errorf("--leader-election present=%v", got)
	}
	// NATS credentials: the seed file of this service's Secret.
	var seedPath string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--nats-nkey="); ok {
			seedPath = v
		}
		if strings.Contains(a, "@") || strings.Contains(strings.ToLower(a), "password") {
			t.Errorf("credentials in args: %s", a)
		}
	}
	if got := mountedSecret(o, c, seedPath); got != "metabus-nats-"+svc {
		t.Errorf("--nats-nkey %q is not a file of the mounted Secret metabus-nats-%s (%q)", seedPath, svc, got)
	}
	// NATS TLS: with a tls:// URL, the CA, certificate and key of this
	// service's Secret, the one `metabus credentials ensure` makes; with
	// nats://, none (no half-configured TLS).
	tlsSecret := natscreds.ClientTLSSecret(svc)
	for _, flag := range []string{"--nats-ca", "--nats-cert", "--nats-key"} {
		var path string
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, flag+"="); ok {
				path = v
			}
		}
		switch {
		case strings.HasPrefix(want.natsURL, "tls://"):
			if got := mountedSecret(o, c, path); got != tlsSecret {
				t.Errorf("%s %q is not a file of the mounted Secret %s (%q)", flag, path, tlsSecret, got)
			}
			if base := filepath.Base(path); base != map[string]string{"--nats-ca": natscreds.CACertKey, "--nats-cert": natscreds.CertKey, "--nats-key": natscreds.KeyKey}[flag] {
				t.Errorf("%s reads %s, not the Secret's key for it", flag, base)
			}
		case path != "":
			t.Errorf("%s=%s with a plaintext URL %s", flag, path, want.natsURL)
		}
	}
	for probe, path := range map[string]string{"livenessProbe": "/healthz", "readinessProbe": "/readyz"} {
		hg := mapping(c.obj, probe, "httpGet")
		if hg["path"] != path || portNumber(c, hg["port"]) != 8081 {
			t.Errorf("%s %v, want %s on 8081", probe, hg, path)
		}
	}
	if portNumber(c, "metrics") != 9999 {
		t.Error("no container port named metrics = 9999")
	}
	for _, k := range []string{"requests", "limits"} {
		for _, r := range []string{"cpu", "memory"} {
			if str(c.obj, "resources", k, r) == "" {
				t.Errorf("resources.%s.%s not set", k, r)
			}
		}
	}
	sc := mapping(c.obj, "securityContext")
	if sc["runAsNonRoot"] != true || sc["readOnlyRootFilesystem"] != true || sc["allowPrivilegeEscalation"] != false ||
		!slices.Equal(stringList(slice(sc, "capabilities", "drop")), []string{"ALL"}) || str(sc, "seccompProfile", "type") != "RuntimeDefault" {
		t.Errorf("container securityContext %v", sc)
	}
}

func TestDeployments(t *testing.T) {
	binaries := dockerBinaries(t)
	for _, svc := range services {
		t.Run(svc, func(t *testing.T) {
			docs := readDocs(t, filepath.Join("apps", svc+".yaml"))
			if len(docs) != 1 || str(docs[0], "kind") != "Deployment" {
				t.Fatalf("want one Deployment")
			}
			// The tag comes from kustomization.yaml's images: (TestVersioned).
			checkServiceDeployment(t, docs[0], svc, binaries, deployed{image: "ghcr.io/metabus/metabus", natsURL: "tls://nats.metabus:4222"})
		})
	}
}

func TestNATSStatefulSet(t *testing.T) {
	docs := readDocs(t, filepath.Join("nats", "statefulset.yaml"))
	byKind := map[string]map[string]any{}
	for _, o := range docs {
		byKind[str(o, "kind")+"/"+str(o, "metadata", "name")] = o
	}
	sts := byKind["StatefulSet/nats"]
	if sts == nil {
		t.Fatal("no StatefulSet nats")
	}
	c := podContainer(t, sts)
	if got := str(c.obj, "image"); got != natsx.ServerImage {
		t.Errorf("image %q, want %q (the nats-server go.mod builds)", got, natsx.ServerImage)
	}
	if len(slice(sts, "spec", "volumeClaimTemplates")) != 1 {
		t.Error("want a volumeClaimTemplate for the JetStream file store")
	}
	var dataMounted bool
	for _, vm := range slice(c.obj, "volumeMounts") {
		if vm.(map[string]any)["mountPath"] == "/data" {
			dataMounted = true
		}
	}
	if !dataMounted {
		t.Error("JetStream store /data is not mounted")
	}
	svc := byKind["Service/nats"]
	if svc == nil {
		t.Fatal("no Service nats")
	}
	var clientPort bool
	for _, p := range slice(svc, "spec", "ports") {
		if p.(map[string]any)["port"] == int64(4222) {
			clientPort = true
		}
	}
	if !clientPort {
		t.Error("Service nats does not expose 4222")
	}
	replicas, _, _ := unstructured.NestedInt64(sts, "spec", "replicas")
	routes := regexp.MustCompile(`nats-route://nats-\d+\.`).FindAllString(readFile(t, filepath.Join("nats", "cluster.conf")), -1)
	if int64(len(routes)) != replicas {
		t.Errorf("cluster.conf has %d routes for %d replicas", len(routes), replicas)
	}
	// The watcher creates streams with as many replicas as there are nodes.
	w := podContainer(t, readDocs(t, filepath.Join("apps", "watcher.yaml"))[0])
	if !slices.Contains(w.args(), fmt.Sprintf("--stream-replicas=%d", replicas)) {
		t.Errorf("watcher args %v: want --stream-replicas=%d", w.args(), replicas)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// ---------------------------------------------------------------------------
// NATS configuration

// natsPermissions extracts, per user (the env var of its nkey), the publish
// and subscribe allow lists of nats-server.conf. It understands exactly the
// shape used there and fails on anything else (deny lists, passwords).
func natsPermissions(t *testing.T, conf string) map[string]map[string][]string {
	t.Helper()
	var lines []string
	for _, l := range strings.Split(conf, "\n") {
		if i := strings.Index(l, "#"); i >= 0 {
			l = l[:i]
		}
		lines = append(lines, l)
	}
	text := strings.Join(lines, "\n")
	if strings.Contains(text, "deny") {
		t.Fatal("deny lists are not understood by this test; extend it")
	}
	userRE := regexp.MustCompile(`nkey:\s*\$([A-Z_]+)`)
	locs := userRE.FindAllStringSubmatchIndex(text, -1)
	out := map[string]map[string][]string{}
	for i, loc := range locs {
		end := len(text)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		block := text[loc[0]:end]
		user := text[loc[2]:loc[3]]
		out[user] = map[string][]string{}
		for _, op := range []string{"publish", "subscribe"} {
			start := strings.Index(block, op+":")
			if start < 0 {
				t.Errorf("user %s: no %s permissions (an absent list allows everything)", user, op)
				continue
			}
			sec := block[start:]
			depth, stop := 0, -1
			for j, r := range sec {
				if r == '{' {
					depth++
				} else if r == '}' {
					depth--
					if depth == 0 {
						stop = j
						break
					}
				}
			}
			if stop < 0 {
				t.Fatalf("user %s: unbalanced %s block", user, op)
			}
			for _, m := range regexp.MustCompile(`"([^"]+)"`).FindAllStringSubmatch(sec[:stop], -1) {
				out[user][op] = append(out[user][op], m[1])
			}
		}
		if strings.Contains(block, "allow_responses: true") {
			out[user]["responses"] = []string{"true"}
		}
	}
	return out
}

// subjectMatch implements NATS subject matching of a permission pattern.
func subjectMatch(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		if tok == ">" {
			return len(s) > i
		}
		if i >= len(s) || (tok != "*" && tok != s[i]) {
			return false
		}
	}
	return len(p) == len(s)
}

func TestNATSConfig(t *testing.T) {
	prod := readFile(t, filepath.Join("nats", "nats-server.conf"))
	dev := readFile(t, filepath.Join("nats", "nats-dev.conf"))
	for name, conf := range map[string]string{"nats-server.conf": prod, "nats-dev.conf": dev} {
		if !regexp.MustCompile(`(?m)^max_payload:\s*8MB\s*$`).MatchString(conf) {
			t.Errorf("%s: want max_payload: 8MB", name)
		}
		if !regexp.MustCompile(`(?m)^jetstream\s*\{`).MatchString(conf) {
			t.Errorf("%s: JetStream is not enabled", name)
		}
		// No committed secrets: seeds, literal nkeys, passwords.
		for _, re := range []string{`\bS[UO][A-Z2-7]{50,}`, `\bU[A-Z2-7]{55}\b`, `(?i)password\s*[:=]\s*[^$\s]`} {
			if m := regexp.MustCompile(re).FindString(conf); m != "" {
				t.Errorf("%s: looks like a committed secret: %q", name, m)
			}
		}
	}
	if strings.Contains(dev, "authorization") {
		t.Error("nats-dev.conf should have no auth (local development only)")
	}
	// Acknowledged writes survive a node's power loss (issue #25).
	if !regexp.MustCompile(`(?m)^\s*sync_interval:\s*always\s*$`).MatchString(prod) {
		t.Error("nats-server.conf: want JetStream sync_interval: always (docs/reliability.md, \"JetStream fsync\")")
	}
	if m := regexp.MustCompile(`(?m)^include\s+(\S+)`).FindStringSubmatch(prod); m == nil {
		t.Error("nats-server.conf does not include cluster.conf")
	} else if _, err := os.Stat(filepath.Join("nats", m[1])); err != nil {
		t.Errorf("included file: %v", err)
	}

	perms := natsPermissions(t, prod)
	users := []string{"WATCHER_NKEY", "DISPATCHER_NKEY", "APPLIER_NKEY", "REVISIONS_NKEY", "OPERATOR_NKEY", "OPERATOR_ADMIN_NKEY", "EVENTS_NKEY"}
	if got := slices.Sorted(maps.Keys(perms)); !slices.Equal(got, slices.Sorted(slices.Values(users))) {
		t.Fatalf("users %v, want %v", got, users)
	}
	// nats-server refuses a configuration naming a variable nobody set:
	// the credential generator must write every user's public key.
	var generated []string
	for _, u := range natscreds.Users {
		generated = append(generated, natscreds.UserKey(u))
	}
	if !slices.Equal(slices.Sorted(slices.Values(generated)), slices.Sorted(slices.Values(users))) {
		t.Errorf("the credential generator writes %v, nats-server.conf reads %v", generated, users)
	}
	allowed := func(user, op, subject string) bool {
		return slices.ContainsFunc(perms[user][op], func(p string) bool { return subjectMatch(p, subject) })
	}
	type tc struct {
		user, op, subject string
		want              bool
	}
	cases := []tc{
		// watcher
		{"WATCHER_NKEY", "publish", "$JS.API.STREAM.CREATE.MC_WORK", true},
		{"WATCHER_NKEY", "publish", "$JS.API.STREAM.UPDATE.MC_SCHED", true},
		{"WATCHER_NKEY", "publish", "$JS.API.CONSUMER.CREATE.MC_WORK.work-64-p00", true},
		// Partition-count cut-over (pkg/bus/layout.go, pkg/jsbus/layout.go).
		{"WATCHER_NKEY", "publish", "$JS.API.CONSUMER.NAMES.MC_WORK", true},
		{"WATCHER_NKEY", "publish", "$JS.API.CONSUMER.DELETE.MC_DESIRED.desired-64-p00", true},
		{"WATCHER_NKEY", "publish", "$JS.API.DIRECT.GET.KV_MC_OWNERS.$KV.MC_OWNERS.lease.work.64-p00", true},
		{"WATCHER_NKEY", "publish", "$KV.MC_OWNERS.lease.work.64-p00", false},
		{"WATCHER_NKEY", "publish", "$JS.API.CONSUMER.CREATE.MC_ADV.dlq", true},
		{"WATCHER_NKEY", "publish", "mc.work.cc-hello.4f1c", true},
		{"WATCHER_NKEY", "subscribe", "mc.svc.snapshot", true},
		{"WATCHER_NKEY", "subscribe", "$SRV.PING.metabus-snapshot", true},
		{"WATCHER_NKEY", "responses", "", true},
		{"WATCHER_NKEY", "publish", "$JS.API.STREAM.DELETE.MC_WORK", false},
		{"WATCHER_NKEY", "publish", "$JS.API.STREAM.PURGE.MC_WORK", false},
		{"WATCHER_NKEY", "publish", "mc.desired.cc-hello.4f1c", false},
		{"WATCHER_NKEY", "publish", "mc.work.7.cc-hello.4f1c", false},
		{"WATCHER_NKEY", "publish", "$JS.API.CONSUMER.MSG.NEXT.MC_WORK.work-64-p00", false},
		// dispatcher
		{"DISPATCHER_NKEY", "publish", "$JS.API.CONSUMER.MSG.NEXT.MC_WORK.work-64-p63", true},
		{"DISPATCHER_NKEY", "publish", "$JS.API.DIRECT.GET.KV_MC_OWNERS.$KV.MC_OWNERS.lease.work.64-p63", true},
		{"DISPATCHER_NKEY", "publish", "$JS.ACK.MC_WORK.work-64-p00.1.20.3.1700000000000000000.0", true},
		{"DISPATCHER_NKEY", "publish", "$JS.API.CONSUMER.MSG.NEXT.MC_SCHED.due-relay", true},
		{"DISPATCHER_NKEY", "publish", "$JS.ACK.MC_SCHED.due-relay.1.2.3.4.5", true},
		{"DISPATCHER_NKEY", "publish", "$JS.API.CONSUMER.MSG.NEXT.MC_ADV.dlq", true},
		{"DISPATCHER_NKEY", "publish", "$JS.API.STREAM.MSG.GET.MC_WORK", true},
		{"DISPATCHER_NKEY", "publish", "$JS.API.DIRECT.GET.MC_DESIRED", true},
		{"DISPATCHER_NKEY", "publish", "$JS.API.STREAM.MSG.DELETE.MC_WORK", true},
		{"DISPATCHER_NKEY", "publish", "$JS.API.STREAM.MSG.DELETE.MC_DESIRED", true},
		{"DISPATCHER_NKEY", "publish", "$JS.API.STREAM.MSG.DELETE.MC_SCHED", true},
		{"APPLIER_NKEY", "publish", "$JS.API.STREAM.MSG.DELETE.MC_SCHED", false},
		{"DISPATCHER_NKEY", "publish", "$JS.API.STREAM.MSG.GET.MC_SCHED", true},
		{"APPLIER_NKEY", "publish", "$JS.API.STREAM.MSG.GET.MC_SCHED", true},
		{"DISPATCHER_NKEY", "publish", "mc.desired.cc-hello.4f1c", true},
		{"DISPATCHER_NKEY", "publish", "mc.sched.cc-hello.4f1c", true},
		{"DISPATCHER_NKEY", "publish", "mc.work.cc-hello.4f1c", true},
		{"DISPATCHER_NKEY", "publish", "mc.dlq.work.cc-hello.4f1c", true},
		{"DISPATCHER_NKEY", "publish", "mc.svc.snapshot", true},
		{"DISPATCHER_NKEY", "publish", "$JS.API.STREAM.CREATE.MC_WORK", false},
		{"DISPATCHER_NKEY", "publish", "$JS.API.CONSUMER.CREATE.MC_WORK.work-64-p00", false},
		{"DISPATCHER_NKEY", "publish", "$JS.API.CONSUMER.MSG.NEXT.MC_DESIRED.desired-64-p00", false},
		{"DISPATCHER_NKEY", "publish", "$JS.API.STREAM.MSG.DELETE.MC_DLQ", false},
		{"DISPATCHER_NKEY", "subscribe", "mc.work.>", false},
		{"DISPATCHER_NKEY", "subscribe", "mc.svc.snapshot", false},
		// The dispatcher answers the operator CLI's inspect requests.
		{"DISPATCHER_NKEY", "responses", "", true},
		// Hooks served over NATS: only the dispatcher sends them requests.
		{"DISPATCHER_NKEY", "publish", "hooks.hello.sync", true},
		{"WATCHER_NKEY", "publish", "hooks.hello.sync", false},
		{"APPLIER_NKEY", "publish", "hooks.hello.sync", false},
		{"REVISIONS_NKEY", "publish", "hooks.hello.sync", false},
		{"OPERATOR_ADMIN_NKEY", "publish", "hooks.hello.sync", false},
		{"DISPATCHER_NKEY", "subscribe", "hooks.hello.sync", false},
		// applier
		{"APPLIER_NKEY", "publish", "$JS.API.CONSUMER.MSG.NEXT.MC_DESIRED.desired-64-p17", true},
		{"APPLIER_NKEY", "publish", "$JS.ACK.MC_DESIRED.desired-64-p17.1.2.3.4.5", true},
		{"APPLIER_NKEY", "publish", "$JS.API.DIRECT.GET.MC_DESIRED.mc.desired.12.cc-hello.4f1c", true},
		{"APPLIER_NKEY", "publish", "mc.work.cc-hello.4f1c", true},
		{"APPLIER_NKEY", "publish", "mc.sched.cc-hello.4f1c", true},
		{"APPLIER_NKEY", "publish", "mc.svc.snapshot", true},
		{"APPLIER_NKEY", "publish", "mc.desired.cc-hello.4f1c", false},
		{"APPLIER_NKEY", "publish", "mc.dlq.desired.cc-hello.4f1c", false},
		{"APPLIER_NKEY", "publish", "$JS.API.CONSUMER.MSG.NEXT.MC_WORK.work-64-p00", false},
		// The oldest desired state of a parent, and older ones deleted as
		// superseded after a takeover (issue 24).
		{"APPLIER_NKEY", "publish", "$JS.API.STREAM.MSG.GET.MC_DESIRED", true},
		{"APPLIER_NKEY", "publish", "$JS.API.STREAM.MSG.DELETE.MC_DESIRED", true},
		{"APPLIER_NKEY", "publish", "$JS.API.STREAM.MSG.DELETE.MC_WORK", false},
		// Handing a partition back resets its consumer (issue 24).
		{"APPLIER_NKEY", "publish", "$JS.API.CONSUMER.RESET.MC_DESIRED.desired-64-p17", true},
		{"APPLIER_NKEY", "publish", "$JS.API.CONSUMER.RESET.MC_WORK.work-64-p17", false},
		{"DISPATCHER_NKEY", "publish", "$JS.API.CONSUMER.RESET.MC_WORK.work-64-p00", true},
		{"DISPATCHER_NKEY", "publish", "$JS.API.CONSUMER.RESET.MC_DESIRED.desired-64-p00", false},
		// revisions: the micro service (its subject, $SRV discovery and
		// replies); callers request it, nobody else serves it.
		{"REVISIONS_NKEY", "subscribe", "mc.svc.revisions", true},
		{"REVISIONS_NKEY", "subscribe", "$SRV.PING.metabus-revisions", true},
		{"REVISIONS_NKEY", "subscribe", "$SRV.INFO.metabus-revisions.8Wq1", true},
		{"REVISIONS_NKEY", "responses", "", true},
		{"REVISIONS_NKEY", "publish", "mc.svc.revisions", false},
		{"REVISIONS_NKEY", "publish", "mc.work.cc-hello.4f1c", false},
		{"REVISIONS_NKEY", "subscribe", "mc.svc.snapshot", false},
		{"DISPATCHER_NKEY", "publish", "mc.svc.revisions", true},
		{"APPLIER_NKEY", "publish", "mc.svc.revisions", true},
		{"DISPATCHER_NKEY", "subscribe", "mc.svc.revisions", false},
		{"APPLIER_NKEY", "subscribe", "mc.svc.revisions", false},
		{"WATCHER_NKEY", "subscribe", "mc.svc.revisions", false},
		// core NATS broadcasts: related-resource rules (dispatcher to
		// watchers) and applied notes (applier to watchers and dispatchers).
		{"DISPATCHER_NKEY", "publish", "mc.related.rules", true},
		{"WATCHER_NKEY", "subscribe", "mc.related.rules", true},
		{"WATCHER_NKEY", "publish", "mc.related.rules", false},
		{"APPLIER_NKEY", "publish", "mc.applied", true},
		{"WATCHER_NKEY", "subscribe", "mc.applied", true},
		{"DISPATCHER_NKEY", "subscribe", "mc.applied", true},
		{"WATCHER_NKEY", "publish", "mc.applied", false},
		{"DISPATCHER_NKEY", "publish", "mc.applied", false},
		{"REVISIONS_NKEY", "subscribe", "mc.applied", false},
		// partition leases: dispatchers and appliers only.
		{"DISPATCHER_NKEY", "publish", "$KV.MC_OWNERS.lease.work.p07", true},
		{"DISPATCHER_NKEY", "publish", "$JS.API.CONSUMER.CREATE.KV_MC_OWNERS.Xy12.$KV.MC_OWNERS.member.work.*", true},
		{"APPLIER_NKEY", "publish", "$KV.MC_OWNERS.member.desired.pod-1", true},
		{"APPLIER_NKEY", "publish", "$JS.FC.KV_MC_OWNERS.Xy12.1", true},
		{"WATCHER_NKEY", "publish", "$KV.MC_OWNERS.lease.work.p07", false},
		{"REVISIONS_NKEY", "publish", "$KV.MC_OWNERS.lease.work.p07", false},
		{"APPLIER_NKEY", "publish", "$JS.API.CONSUMER.DELETE.MC_DESIRED.desired-64-p00", false},
		// Each stage writes its own leases and members only (issue 35).
		{"DISPATCHER_NKEY", "publish", "$KV.MC_OWNERS.member.work.pod-1", true},
		{"DISPATCHER_NKEY", "publish", "$KV.MC_OWNERS.lease.desired.64-p07", false},
		{"DISPATCHER_NKEY", "publish", "$KV.MC_OWNERS.member.desired.pod-1", false},
		{"APPLIER_NKEY", "publish", "$KV.MC_OWNERS.lease.desired.64-p07", true},
		{"APPLIER_NKEY", "publish", "$KV.MC_OWNERS.lease.work.64-p07", false},
		{"APPLIER_NKEY", "publish", "$KV.MC_OWNERS.member.work.pod-1", false},
		{"DISPATCHER_NKEY", "publish", "$KV.MC_OWNERS.other", false},
		// The watcher makes consumers and streams of its own streams only.
		{"WATCHER_NKEY", "publish", "$JS.API.CONSUMER.CREATE.MC_SCHED.due-relay", true},
		{"WATCHER_NKEY", "publish", "$JS.API.CONSUMER.CREATE.MC_DESIRED.desired-64-p00.mc.desired.00.>", true},
		{"WATCHER_NKEY", "publish", "$JS.API.CONSUMER.DURABLE.CREATE.MC_WORK.work-64-p00", true},
		{"WATCHER_NKEY", "publish", "$JS.API.STREAM.CREATE.KV_MC_OWNERS", true},
		{"WATCHER_NKEY", "publish", "$JS.API.STREAM.CREATE.MC_DLQ", true},
		{"WATCHER_NKEY", "publish", "$JS.API.CONSUMER.CREATE.KV_MC_OWNERS.snoop", false},
		{"WATCHER_NKEY", "publish", "$JS.API.CONSUMER.CREATE.MC_EVENTS.snoop.metabus.events.>", false},
		{"WATCHER_NKEY", "publish", "$JS.API.CONSUMER.CREATE.MC_DLQ.snoop", false},
		{"WATCHER_NKEY", "publish", "$JS.API.CONSUMER.DURABLE.CREATE.KV_MC_OWNERS.snoop", false},
		{"WATCHER_NKEY", "publish", "$JS.API.STREAM.CREATE.MC_EVENTS", false},
		{"WATCHER_NKEY", "publish", "$JS.API.STREAM.CREATE.SNOOP", false},
		// Operator CLI: every dispatcher and applier answers inspect
		// requests of its stage and publishes trace records while tailed.
		{"DISPATCHER_NKEY", "subscribe", "mc.inspect.work", true},
		{"DISPATCHER_NKEY", "subscribe", "mc.inspect.tail", true},
		{"DISPATCHER_NKEY", "publish", "mc.trace.work.cc-hello.4f1c", true},
		{"DISPATCHER_NKEY", "publish", "mc.trace.desired.cc-hello.4f1c", false},
		{"APPLIER_NKEY", "subscribe", "mc.inspect.desired", true},
		{"APPLIER_NKEY", "subscribe", "mc.inspect.tail", true},
		{"APPLIER_NKEY", "publish", "mc.trace.desired.cc-hello.4f1c", true},
		{"APPLIER_NKEY", "responses", "", true},
		{"WATCHER_NKEY", "subscribe", "mc.inspect.work", false},
		// operator: reads, never writes, deletes or consumes.
		{"OPERATOR_NKEY", "publish", "$JS.API.STREAM.NAMES", true},
		{"OPERATOR_NKEY", "publish", "$JS.API.STREAM.LIST", true},
		{"OPERATOR_NKEY", "publish", "$JS.API.CONSUMER.LIST.MC_WORK", true},
		{"OPERATOR_NKEY", "publish", "$JS.API.STREAM.MSG.GET.MC_WORK", true},
		{"OPERATOR_NKEY", "publish", "$JS.API.STREAM.MSG.GET.MC_DLQ", true},
		{"OPERATOR_NKEY", "publish", "$JS.API.DIRECT.GET.KV_MC_OWNERS.$KV.MC_OWNERS.lease.work.64-p00", true},
		{"OPERATOR_NKEY", "publish", "$JS.API.CONSUMER.CREATE.KV_MC_OWNERS.Xy12.$KV.MC_OWNERS.>", true},
		{"OPERATOR_NKEY", "publish", "$JS.API.CONSUMER.CREATE.MC_DLQ.Xy12.mc.dlq.work.cc-hello.*", true},
		{"OPERATOR_NKEY", "publish", "$JS.API.CONSUMER.MSG.NEXT.MC_DLQ.Xy12", true},
		{"OPERATOR_NKEY", "publish", "$SRV.PING.metabus-revisions", true},
		{"OPERATOR_NKEY", "publish", "mc.inspect.work", true},
		{"OPERATOR_NKEY", "publish", "mc.inspect.tail", true},
		{"OPERATOR_NKEY", "subscribe", "mc.work.cc-hello.4f1c", true},
		{"OPERATOR_NKEY", "subscribe", "mc.desired.cc-hello.4f1c", true},
		{"OPERATOR_NKEY", "subscribe", "mc.trace.work.cc-hello.4f1c", true},
		{"OPERATOR_NKEY", "publish", "$JS.API.CONSUMER.CREATE.MC_WORK.Xy12.mc.work.>", false},
		{"OPERATOR_NKEY", "publish", "$JS.API.CONSUMER.CREATE.MC_DESIRED.Xy12", false},
		{"OPERATOR_NKEY", "publish", "$JS.API.CONSUMER.MSG.NEXT.MC_WORK.work-64-p00", false},
		{"OPERATOR_NKEY", "publish", "$JS.ACK.MC_WORK.work-64-p00.1.20.3.1700000000000000000.0", false},
		{"OPERATOR_NKEY", "publish", "$JS.API.STREAM.MSG.DELETE.MC_DLQ", false},
		{"OPERATOR_NKEY", "publish", "$JS.API.STREAM.PURGE.MC_DLQ", false},
		{"OPERATOR_NKEY", "publish", "mc.work.cc-hello.4f1c", false},
		{"OPERATOR_NKEY", "publish", "$KV.MC_OWNERS.lease.work.64-p00", false},
		{"OPERATOR_NKEY", "publish", "mc.svc.snapshot", false},
		{"OPERATOR_NKEY", "subscribe", "mc.svc.snapshot", false},
		{"OPERATOR_NKEY", "responses", "", false},
		// events: MC_EVENTS and metabus.events.> only; the applier publishes them.
		{"EVENTS_NKEY", "publish", "$JS.API.CONSUMER.CREATE.MC_EVENTS.c1.metabus.events.applied.>", true},
		{"EVENTS_NKEY", "publish", "$JS.API.CONSUMER.MSG.NEXT.MC_EVENTS.c1", true},
		{"EVENTS_NKEY", "subscribe", "metabus.events.applied.cc-hello.default.a", true},
		{"EVENTS_NKEY", "publish", "metabus.events.applied.cc-hello.default.a", false},
		{"EVENTS_NKEY", "subscribe", "mc.desired.cc-hello.4f1c", false},
		{"EVENTS_NKEY", "subscribe", "mc.applied", false},
		{"EVENTS_NKEY", "publish", "$JS.API.CONSUMER.CREATE.MC_DESIRED.c1", false},
		{"EVENTS_NKEY", "publish", "$JS.API.DIRECT.GET.MC_DESIRED", false},
		{"EVENTS_NKEY", "publish", "$JS.API.STREAM.PURGE.MC_EVENTS", false},
		{"APPLIER_NKEY", "publish", "metabus.events.applied.cc-hello.default.a", true},
		{"APPLIER_NKEY", "publish", "$JS.API.STREAM.CREATE.MC_EVENTS", true},
		{"DISPATCHER_NKEY", "publish", "metabus.events.applied.cc-hello.default.a", false},
		// operator-admin: also replays (a fresh work item) and purges the DLQ.
		{"OPERATOR_ADMIN_NKEY", "publish", "$JS.API.STREAM.MSG.GET.MC_DLQ", true},
		{"OPERATOR_ADMIN_NKEY", "publish", "mc.work.cc-hello.4f1c", true},
		{"OPERATOR_ADMIN_NKEY", "publish", "$JS.API.STREAM.MSG.DELETE.MC_DLQ", true},
		{"OPERATOR_ADMIN_NKEY", "publish", "$JS.API.STREAM.PURGE.MC_DLQ", true},
		{"OPERATOR_ADMIN_NKEY", "publish", "$JS.API.STREAM.PURGE.MC_WORK", false},
		{"OPERATOR_ADMIN_NKEY", "publish", "$JS.API.STREAM.MSG.DELETE.MC_WORK", false},
		{"OPERATOR_ADMIN_NKEY", "publish", "mc.desired.cc-hello.4f1c", false},
		{"OPERATOR_ADMIN_NKEY", "publish", "$JS.API.CONSUMER.MSG.NEXT.MC_WORK.work-64-p00", false},
	}
	// The inbox prefix of a user's replies: a service's own; the two
	// operator users share the operators' (opscli.InboxPrefix).
	inboxOwner := func(u string) string {
		if strings.HasPrefix(u, "OPERATOR") {
			return "operator"
		}
		return strings.ToLower(strings.TrimSuffix(u, "_NKEY"))
	}
	for _, u := range users {
		// Each service's replies on its own inbox prefix (issue 26): its
		// own, never the shared _INBOX nor another service's.
		own := inboxOwner(u)
		for _, other := range users {
			svc := inboxOwner(other)
			cases = append(cases, tc{u, "subscribe", natsx.ServiceInboxPrefix(svc) + ".q8Zy3.1", svc == own})
		}
		// The events user sees MC_EVENTS only (docs/events.md).
		metabusUser := u != "EVENTS_NKEY"
		cases = append(cases,
			tc{u, "publish", "$JS.API.INFO", true},
			tc{u, "publish", "$JS.API.STREAM.INFO.MC_WORK", metabusUser},
			tc{u, "publish", "$JS.API.CONSUMER.INFO.MC_WORK.work-64-p00", metabusUser},
			tc{u, "subscribe", "_INBOX.q8Zy3.1", false},
			tc{u, "subscribe", "_INBOX.>", false},
			tc{u, "subscribe", ">", false},
			tc{u, "publish", natsx.ServiceInboxPrefix(own) + ".q8Zy3.1", false},
			tc{u, "publish", "$JS.API.STREAM.DELETE.MC_WORK", false},
			tc{u, "publish", "$JS.API.CONSUMER.DELETE.MC_SCHED.due-relay", false},
			tc{u, "publish", "$SYS.REQ.SERVER.PING", false},
		)
	}
	for _, c := range cases {
		got := false
		if c.op == "responses" {
			got = len(perms[c.user]["responses"]) > 0
		} else {
			got = allowed(c.user, c.op, c.subject)
		}
		if got != c.want {
			t.Errorf("%s %s %q: allowed=%v, want %v", c.user, c.op, c.subject, got, c.want)
		}
	}
}

// ---------------------------------------------------------------------------
// Every service ships everywhere

// TestEveryServiceShips checks that each service has all of its installation
// pieces: a command, an image binary, a Deployment in the kustomization and
// the chart, RBAC, a NATS user and Secret, and a docker-compose service. A
// new service missing one of them would be installable but not runnable.
func TestEveryServiceShips(t *testing.T) {
	kustomized := func(dir string) []string {
		return stringList(slice(readDocs(t, filepath.Join(dir, "Kustomization"))[0], "resources"))
	}
	apps, rbac := kustomized("apps"), kustomized("rbac")
	values := readDocs(t, filepath.Join(chartDir, "values.yaml"))[0]
	compose := mapping(readDocs(t, filepath.Join("..", "docker-compose.yaml"))[0], "services")
	users := natsPermissions(t, readFile(t, filepath.Join("nats", "nats-server.conf")))
	binaries := dockerBinaries(t)
	helm, err := renderChart(nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, svc := range services {
		t.Run(svc, func(t *testing.T) {
			if _, err := os.Stat(filepath.Join("..", "cmd", svc, "main.go")); err != nil {
				t.Errorf("no command: %v", err)
			}
			if binaries["metabus-"+svc] != "./cmd/"+svc {
				t.Errorf("the Dockerfile does not build metabus-%s from ./cmd/%s", svc, svc)
			}
			if !slices.Contains(apps, svc+".yaml") {
				t.Errorf("apps/Kustomization does not list %s.yaml", svc)
			}
			if !slices.Contains(rbac, svc+".yaml") {
				t.Errorf("rbac/Kustomization does not list %s.yaml", svc)
			}
			if _, err := os.Stat(filepath.Join(chartDir, "templates", svc+".yaml")); err != nil {
				t.Errorf("no chart template: %v", err)
			}
			if helm["Deployment/metabus-"+svc] == nil || helm["ClusterRole/metabus-"+svc] == nil {
				t.Error("the chart renders no Deployment or ClusterRole for it")
			}
			if mapping(values, svc) == nil {
				t.Errorf("values.yaml has no %s section", svc)
			}
			if _, ok := users[strings.ToUpper(svc)+"_NKEY"]; !ok {
				t.Errorf("nats-server.conf has no user $%s_NKEY", strings.ToUpper(svc))
			}
			if !slices.Contains(natscreds.Services, svc) {
				t.Error("the credential generator makes no NATS user for it")
			}
			if compose[svc] == nil {
				t.Error("docker-compose.yaml has no service for it")
			}
		})
	}
}

// ---------------------------------------------------------------------------
// kustomize

// TestKustomize renders deploy/ with kustomize's own library, as `kubectl
// apply -k deploy/` does, and checks what it installs.
func TestKustomize(t *testing.T) {
	docs, err := kustomizeBuild(kustomizeDefault)
	if err != nil {
		t.Fatal(err)
	}
	clusterScoped := map[string]bool{"Namespace": true, "CustomResourceDefinition": true, "ClusterRole": true, "ClusterRoleBinding": true}
	byKey := map[string]map[string]any{}
	for _, o := range docs {
		kind, name := str(o, "kind"), str(o, "metadata", "name")
		byKey[kind+"/"+name] = o
		ns := str(o, "metadata", "namespace")
		if clusterScoped[kind] != (ns == "") || (ns != "" && ns != "metabus") {
			t.Errorf("%s/%s in namespace %q", kind, name, ns)
		}
		if got := str(o, "metadata", "labels", "app.kubernetes.io/part-of"); got != "metabus" {
			t.Errorf("%s/%s lacks label app.kubernetes.io/part-of=metabus", kind, name)
		}
	}
	want := []string{
		"Namespace/metabus",
		"CustomResourceDefinition/compositecontrollers.metacontroller.k8s.io",
		"CustomResourceDefinition/decoratorcontrollers.metacontroller.k8s.io",
		"CustomResourceDefinition/mapcontrollers.metacontroller.k8s.io",
		"CustomResourceDefinition/controllerrevisions.metacontroller.k8s.io",
		"StatefulSet/nats", "Service/nats", "Service/nats-headless",
		"Role/metabus-watcher-leader-election", "RoleBinding/metabus-watcher-leader-election",
		"Role/metabus-dispatcher-secrets", "RoleBinding/metabus-dispatcher-secrets",
		"ClusterRole/metabus-dispatcher-secrets-all-namespaces", "ClusterRoleBinding/metabus-dispatcher-secrets-all-namespaces",
		"ClusterRole/metabus-applier-events", "ClusterRole/metabus-applier-all-resources",
		"ServiceAccount/metabus-credentials", "Role/metabus-credentials", "RoleBinding/metabus-credentials",
	}
	for _, svc := range services {
		want = append(want, "Deployment/metabus-"+svc, "ServiceAccount/metabus-"+svc, "ClusterRole/metabus-"+svc, "ClusterRoleBinding/metabus-"+svc)
	}
	for _, k := range want {
		if byKey[k] == nil {
			t.Errorf("kustomize output lacks %s", k)
		}
	}
	binaries := dockerBinaries(t)
	app := str(readDocs(t, filepath.Join(chartDir, "Chart.yaml"))[0], "appVersion")
	for _, svc := range services {
		if o := byKey["Deployment/metabus-"+svc]; o != nil {
			t.Run(svc, func(t *testing.T) {
				checkServiceDeployment(t, o, svc, binaries, deployed{image: "ghcr.io/metabus/metabus:" + app, natsURL: "tls://nats.metabus:4222"})
			})
		}
	}
	// The dispatcher learns its own namespace (always readable) from POD_NAMESPACE.
	if o := byKey["Deployment/metabus-dispatcher"]; o != nil {
		if !slices.ContainsFunc(slice(podContainer(t, o).obj, "env"), func(e any) bool {
			em, _ := e.(map[string]any)
			return em["name"] == "POD_NAMESPACE" && str(em, "valueFrom", "fieldRef", "fieldPath") == "metadata.namespace"
		}) {
			t.Error("dispatcher: no POD_NAMESPACE from metadata.namespace (its Secret namespace)")
		}
	}
	// The generated (hash-suffixed) ConfigMap is the one the StatefulSet mounts.
	if sts := byKey["StatefulSet/nats"]; sts != nil {
		for _, v := range slice(sts, "spec", "template", "spec", "volumes") {
			vm := v.(map[string]any)
			if vm["name"] != "config" {
				continue
			}
			cm := byKey["ConfigMap/"+str(vm, "configMap", "name")]
			if cm == nil || !strings.HasPrefix(str(cm, "metadata", "name"), "nats-config-") {
				t.Errorf("StatefulSet mounts ConfigMap %q, which kustomize did not generate", str(vm, "configMap", "name"))
				continue
			}
			data := mapping(cm, "data")
			if data["nats-server.conf"] != readFile(t, filepath.Join("nats", "nats-server.conf")) || data["cluster.conf"] == nil {
				t.Error("generated ConfigMap does not hold nats-server.conf and cluster.conf")
			}
		}
	}
	// The hardened overlay's copy of the Namespace is deploy/namespace.yaml.
	if readFile(t, filepath.Join(kustomizeHardened, "namespace.yaml")) != readFile(t, "namespace.yaml") {
		t.Error("overlays/hardened/namespace.yaml differs from namespace.yaml; copy it")
	}
}

// ---------------------------------------------------------------------------
// Helm chart

const chartDir = "helm/metabus"

func TestHelmChart(t *testing.T) {
	chart := readDocs(t, filepath.Join(chartDir, "Chart.yaml"))[0]
	if chart["apiVersion"] != "v2" || chart["name"] != "metabus" {
		t.Errorf("Chart.yaml apiVersion %v name %v", chart["apiVersion"], chart["name"])
	}
	if !regexp.MustCompile(`^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`).MatchString(str(chart, "version")) {
		t.Errorf("Chart.yaml version %q is not SemVer", str(chart, "version"))
	}
	values := readDocs(t, filepath.Join(chartDir, "values.yaml"))[0]
	if r, _, _ := unstructured.NestedInt64(values, "replicas"); r != 2 {
		t.Errorf("values replicas = %d, want 2 (as deploy/apps)", r)
	}
	if str(values, "image", "repository") != "ghcr.io/metabus/metabus" || str(values, "nats", "image") != natsx.ServerImage {
		t.Error("values: unexpected images")
	}
	if str(values, "profile") != "upstream" {
		t.Errorf("values profile = %q, want upstream (the default runs what upstream runs)", str(values, "profile"))
	}

	t.Run("per-setting values override the profile", func(t *testing.T) {
		// Empty by default: the profile decides (TestProfiles).
		for _, path := range [][]string{{"dispatcher", "secretNamespaces"}, {"dispatcher", "relatedResources"}, {"watcher", "controllerResources"}} {
			if v, found, _ := unstructured.NestedSlice(values, path...); !found || len(v) != 0 {
				t.Errorf("values %s = %v, want []", strings.Join(path, "."), v)
			}
		}
		if v, found, _ := unstructured.NestedFieldNoCopy(values, "applier", "rbac", "allResources"); !found || v != nil {
			t.Errorf("values applier.rbac.allResources = %v, want null", v)
		}
		tests := []struct {
			reason string
			values string
			check  func(t *testing.T, objs []map[string]any)
		}{
			{
				reason: "listed Secret namespaces: a Role in each, no cluster-wide grant",
				values: "dispatcher: {secretNamespaces: [tenant-a, tenant-b, metabus]}",
				check: func(t *testing.T, objs []map[string]any) {
					if find(objs, "ClusterRole", "metabus-dispatcher-secrets-all-namespaces") != nil {
						t.Error("cluster-wide Secret reads rendered")
					}
					rules, _ := rbacSet{objs: objs}.rulesFor(t, "metabus", "metabus-dispatcher")
					for ns, want := range map[string]bool{"metabus": true, "tenant-a": true, "tenant-b": true, "tenant-c": false} {
						if got := canIn(rules, ns, "/secrets", "get"); got != want {
							t.Errorf("Secrets in %s readable: %v, want %v", ns, got, want)
						}
					}
					if got := flagValues(containerArgs(t, objs, "metabus-dispatcher"), "secret-namespaces"); !slices.Equal(got, []string{"tenant-a,tenant-b,metabus"}) {
						t.Errorf("--secret-namespaces %q", got)
					}
				},
			},
			{
				reason: "the upstream profile with the applier narrowed",
				values: "applier: {rbac: {allResources: false}}",
				check: func(t *testing.T, objs []map[string]any) {
					if find(objs, "ClusterRole", "metabus-applier-all-resources") != nil {
						t.Error("metabus-applier-all-resources rendered")
					}
					if find(objs, "ClusterRole", "metabus-dispatcher-secrets-all-namespaces") == nil {
						t.Error("the rest of the upstream profile changed")
					}
				},
			},
			{
				reason: "the hardened profile with the applier widened",
				values: "{profile: hardened, applier: {rbac: {allResources: true}}}",
				check: func(t *testing.T, objs []map[string]any) {
					if find(objs, "ClusterRole", "metabus-applier-all-resources") == nil {
						t.Error("metabus-applier-all-resources not rendered")
					}
					if got := flagValues(containerArgs(t, objs, "metabus-dispatcher"), "secret-namespaces"); !slices.Equal(got, []string{""}) {
						t.Errorf("--secret-namespaces %q, want the hardened profile's", got)
					}
				},
			},
		}
		for _, tt := range tests {
			t.Run(tt.reason, func(t *testing.T) {
				docs, err := parseDocs([]byte(tt.values))
				if err != nil {
					t.Fatal(err)
				}
				objs, err := helmRender(docs[0], defaultRelease)
				if err != nil {
					t.Fatal(err)
				}
				tt.check(t, objs)
			})
		}
	})

	t.Run("services", func(t *testing.T) {
		objs, err := renderChart(nil)
		if err != nil {
			t.Fatal(err)
		}
		binaries := dockerBinaries(t)
		app := str(readDocs(t, filepath.Join(chartDir, "Chart.yaml"))[0], "appVersion")
		for _, svc := range services {
			t.Run(svc, func(t *testing.T) {
				checkServiceDeployment(t, objs["Deployment/metabus-"+svc], svc, binaries,
					deployed{image: "ghcr.io/metabus/metabus:" + app, natsURL: "tls://metabus-nats.metabus:4222"})
			})
		}
	})

	t.Run("copies are identical", func(t *testing.T) {
		pairs := map[string]string{filepath.Join(chartDir, "files", "nats-server.conf"): filepath.Join("nats", "nats-server.conf")}
		for _, dir := range []string{"crds"} {
			srcs, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
			dst := filepath.Join(chartDir, dir)
			copies, _ := filepath.Glob(filepath.Join(dst, "*.yaml"))
			if len(srcs) == 0 || len(srcs) != len(copies) {
				t.Errorf("%s has %d files, %s has %d", dir, len(srcs), dst, len(copies))
			}
			for _, s := range srcs {
				pairs[filepath.Join(dst, filepath.Base(s))] = s
			}
		}
		for cp, src := range pairs {
			a, b := readFile(t, src), ""
			if data, err := os.ReadFile(cp); err == nil {
				b = string(data)
			}
			if a != b {
				t.Errorf("%s differs from %s; copy it: cp %s %s", cp, src, filepath.Join("deploy", src), filepath.Join("deploy", cp))
			}
		}
	})

	t.Run("templates", func(t *testing.T) {
		tpls, _ := filepath.Glob(filepath.Join(chartDir, "templates", "*"))
		if len(tpls) < 6 {
			t.Fatalf("only %d templates", len(tpls))
		}
		defined := map[string]bool{}
		texts := map[string]string{}
		comment := regexp.MustCompile(`(?s)\{\{-?\s*/\*.*?\*/\s*-?\}\}`)
		for _, p := range tpls {
			text := comment.ReplaceAllString(readFile(t, p), "")
			texts[p] = text
			for _, m := range regexp.MustCompile(`\{\{-?\s*define\s+"([^"]+)"`).FindAllStringSubmatch(text, -1) {
				defined[m[1]] = true
			}
		}
		open := regexp.MustCompile(`\{\{-?\s*(if|range|with|define|block)\b`)
		end := regexp.MustCompile(`\{\{-?\s*end\s*-?\}\}`)
		valuesRef := regexp.MustCompile(`\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)`)
		for p, text := range texts {
			if strings.Count(text, "{{") != strings.Count(text, "}}") {
				t.Errorf("%s: unbalanced {{ }}", p)
			}
			if o, e := len(open.FindAllString(text, -1)), len(end.FindAllString(text, -1)); o != e {
				t.Errorf("%s: %d blocks opened, %d ended", p, o, e)
			}
			for _, m := range valuesRef.FindAllStringSubmatch(text, -1) {
				path := strings.Split(strings.TrimPrefix(m[1], "."), ".")
				if _, found, err := unstructured.NestedFieldNoCopy(values, path...); !found || err != nil {
					t.Errorf("%s: .Values%s is not in values.yaml", p, m[1])
				}
			}
			for _, m := range regexp.MustCompile(`(?:include|template)\s+"([^"]+)"`).FindAllStringSubmatch(text, -1) {
				if !defined[m[1]] {
					t.Errorf("%s: template %q is not defined", p, m[1])
				}
			}
			for _, m := range regexp.MustCompile(`\.Files\.Get\s+(?:\(printf\s+)?"([^"]+)"`).FindAllStringSubmatch(text, -1) {
				pattern := strings.ReplaceAll(m[1], "%s", "*")
				if got, _ := filepath.Glob(filepath.Join(chartDir, pattern)); len(got) == 0 {
					t.Errorf("%s: .Files.Get %q matches no chart file", p, m[1])
				}
			}
			if strings.HasSuffix(p, ".yaml") && (!strings.Contains(text, "apiVersion:") || !strings.Contains(text, "kind:")) &&
				!strings.Contains(text, ".Files.Get") && !strings.Contains(text, `include "metabus.deployment"`) {
				t.Errorf("%s: renders no Kubernetes object", p)
			}
		}
	})
}

// ---------------------------------------------------------------------------
// Dockerfile and docker-compose.yaml

func TestDockerfile(t *testing.T) {
	text := dockerfileText(t)
	froms := regexp.MustCompile(`(?m)^FROM\s+(.+)$`).FindAllStringSubmatch(text, -1)
	if len(froms) != 2 {
		t.Fatalf("want a two-stage build, got %d FROM lines", len(froms))
	}
	if got := strings.TrimSpace(froms[0][1]); got != "golang:1.26 AS build" {
		t.Errorf("build stage %q", got)
	}
	if got := strings.TrimSpace(froms[1][1]); !regexp.MustCompile(`^gcr\.io/distroless/static(-debian\d+)?:nonroot$`).MatchString(got) {
		t.Errorf("runtime stage %q, want distroless static nonroot", got)
	}
	if !strings.Contains(text, "CGO_ENABLED=0") || regexp.MustCompile(`CGO_ENABLED=[^0]`).MatchString(text) {
		t.Error("CGO_ENABLED=0 is not set (static binaries for distroless/static)")
	}
	bins := dockerBinaries(t)
	want := map[string]string{
		"metabus-watcher": "./cmd/watcher", "metabus-dispatcher": "./cmd/dispatcher",
		"metabus-applier": "./cmd/applier", "metabus-revisions": "./cmd/revisions", "metabus": "./cmd/metabus",
	}
	for b, pkg := range want {
		if bins[b] != pkg {
			t.Errorf("Dockerfile builds %s from %q, want %s", b, bins[b], pkg)
		}
	}
	// docker-compose and Kubernetes name the binary in their command; an
	// entrypoint would turn it into an argument.
	if m := regexp.MustCompile(`(?m)^ENTRYPOINT\s+(.+)$`).FindStringSubmatch(text); m != nil && strings.TrimSpace(m[1]) != "[]" {
		t.Errorf("ENTRYPOINT %s would swallow the compose/Kubernetes command", m[1])
	}
	if !regexp.MustCompile(`(?m)^USER\s+(65532|nonroot)`).MatchString(text) {
		t.Error("runtime stage does not run as the nonroot user")
	}
	for _, pkg := range bins {
		// Informational only: the commands may be written after the
		// Dockerfile, but `docker build` fails until they exist.
		if goFiles, _ := filepath.Glob(filepath.Join("..", pkg, "*.go")); len(goFiles) == 0 {
			t.Logf("note: %s has no Go files yet; the image build needs it", pkg)
		}
	}

	ignore := strings.Fields(readFile(t, filepath.Join("..", ".dockerignore")))
	for _, must := range []string{".git"} {
		if !slices.Contains(ignore, must) {
			t.Errorf(".dockerignore does not exclude %s", must)
		}
	}
	for _, keep := range []string{"go.mod", "go.sum", "cmd", "pkg", "services", "internal", "*", "**"} {
		if slices.Contains(ignore, keep) {
			t.Errorf(".dockerignore excludes %s, which the build needs", keep)
		}
	}
}
