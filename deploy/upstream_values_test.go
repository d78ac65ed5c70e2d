package deploy

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// upstreamValuesFile is upstream Metacontroller's chart values, unchanged:
// deploy/helm/metacontroller/values.yaml of
// github.com/metacontroller/metacontroller at tag v4.17.2 (testdata/README.md).
var upstreamValuesFile = filepath.Join("testdata", "upstream-v4.17.2-values.yaml")

// renderWithNotes renders the chart as `helm install metabus -n metabus`
// does, returning the objects by "Kind/name" and what `helm install` prints
// (NOTES.txt).
func renderWithNotes(t *testing.T, values map[string]any) (map[string]map[string]any, string) {
	t.Helper()
	files, err := helmRenderFiles(values, defaultRelease)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	objs, err := helmRender(values, defaultRelease)
	if err != nil {
		t.Fatal(err)
	}
	byName, err := byKindName(objs)
	if err != nil {
		t.Fatal(err)
	}
	return byName, files["metabus/templates/NOTES.txt"]
}

// ignoredLines returns the "ignored: <key> (" lines of NOTES, by key.
func ignoredLines(notes string) []string {
	var keys []string
	for _, l := range strings.Split(notes, "\n") {
		if rest, ok := strings.CutPrefix(l, "ignored: "); ok {
			key, _, _ := strings.Cut(rest, " ")
			keys = append(keys, key)
		}
	}
	return keys
}

// setPath sets the dotted key path in values.
func setPath(values map[string]any, path string, v any) {
	keys := strings.Split(path, ".")
	m := values
	for _, k := range keys[:len(keys)-1] {
		next, ok := m[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[k] = next
		}
		m = next
	}
	m[keys[len(keys)-1]] = v
}

func parseValue(t *testing.T, y string) any {
	t.Helper()
	docs, err := parseDocs([]byte("v: " + y))
	if err != nil {
		t.Fatalf("%q: %v", y, err)
	}
	return docs[0]["v"]
}

// TestUpstreamValuesFile (issue #32): `helm install -f` with upstream
// Metacontroller v4.17.2's own values file, unchanged, installs metabus: the
// schema accepts every key, the services run metabus's image with
// upstream's arguments (which every service's flag parser accepts), and
// NOTES.txt names each value it does not use.
func TestUpstreamValuesFile(t *testing.T) {
	values := readDocs(t, upstreamValuesFile)[0]
	objs, notes := renderWithNotes(t, values)
	if diff := slices.Compare([]string{"command", "clusterRole", "image.repository"}, ignoredLines(notes)); diff != 0 {
		t.Errorf("NOTES names as ignored %v, want command, clusterRole, image.repository:\n%s", ignoredLines(notes), notes)
	}
	app := str(readDocs(t, filepath.Join(chartDir, "Chart.yaml"))[0], "appVersion")
	for _, svc := range services {
		o := objs["Deployment/metabus-"+svc]
		if o == nil {
			t.Fatalf("no Deployment metabus-%s", svc)
		}
		c := podContainer(t, o)
		if got := str(c.obj, "image"); got != "ghcr.io/metabus/metabus:"+app {
			t.Errorf("%s image %q, want metabus's, not upstream's", svc, got)
		}
		if n := mapping(o, "spec")["replicas"]; n != int64(1) {
			t.Errorf("%s replicas %d, want upstream's 1", svc, n)
		}
		args := c.args()
		for _, a := range []string{"--zap-log-level=4", "--discovery-interval=20s", "--cache-flush-interval=30m"} {
			if !slices.Contains(args, a) {
				t.Errorf("%s lacks upstream's %s: %v", svc, a, args)
			}
		}
		if _, out, code := parseService(svc, args); code != 0 {
			t.Errorf("metabus-%s refuses the arguments (exit %d): %s", svc, code, out)
		}
	}
}

// TestUpstreamValueKeys (issue #32): each value upstream's chart documents
// (its README's table and values.yaml), set on its own, renders: those
// metabus honours do what they do upstream, those it cannot are named in
// NOTES.txt with the reason, never refused.
func TestUpstreamValueKeys(t *testing.T) {
	type check func(t *testing.T, objs map[string]map[string]any)
	watcher := func(objs map[string]map[string]any) map[string]any { return objs["Deployment/metabus-watcher"] }
	podSpec := func(objs map[string]map[string]any) map[string]any {
		return mapping(watcher(objs), "spec", "template", "spec")
	}
	field := func(want any, get func(objs map[string]map[string]any) any) check {
		return func(t *testing.T, objs map[string]map[string]any) {
			if got := get(objs); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("got %v, want %v", got, want)
			}
		}
	}
	container := func(objs map[string]map[string]any) map[string]any { return podContainer(t, watcher(objs)).obj }
	tests := []struct {
		key, value string // value in YAML
		ignored    bool   // NOTES names it
		check      check  // what an honoured value does (nil for ignored ones)
	}{
		{key: "command", value: "/usr/bin/metacontroller", ignored: true, check: field("[/usr/local/bin/metabus-watcher]", func(o map[string]map[string]any) any { return podContainer(t, watcher(o)).command() })},
		{key: "commandArgs", value: "[--discovery-interval=20s]", check: func(t *testing.T, objs map[string]map[string]any) {
			for _, svc := range services {
				if a := args(objs, "Deployment/metabus-"+svc); !slices.Contains(a, "--discovery-interval=20s") {
					t.Errorf("%s args %v", svc, a)
				}
			}
		}},
		{key: "env", value: "[{name: HTTPS_PROXY, value: 'http://proxy:3128'}]", check: field("[map[name:HTTPS_PROXY value:http://proxy:3128]]", func(o map[string]map[string]any) any {
			var out []any
			for _, e := range slice(container(o), "env") {
				if str(e.(map[string]any), "name") == "HTTPS_PROXY" {
					out = append(out, e)
				}
			}
			return out
		})},
		{key: "probes.port", value: "9090", check: func(t *testing.T, objs map[string]map[string]any) {
			c := podContainer(t, watcher(objs))
			if !slices.Contains(c.args(), "--health-probe-bind-address=:9090") || portNumber(c, "health") != 9090 {
				t.Errorf("args %v, health port %d; want 9090", c.args(), portNumber(c, "health"))
			}
		}},
		{key: "rbac.create", value: "false", check: field("[]", func(o map[string]map[string]any) any { return kinds(o, "ClusterRole") })},
		{key: "image.repository", value: "registry.example.com/mirror/metabus", check: func(t *testing.T, objs map[string]map[string]any) {
			if got := str(container(objs), "image"); !strings.HasPrefix(got, "registry.example.com/mirror/metabus:") {
				t.Errorf("image %q", got)
			}
		}},
		{key: "image.repository", value: "ghcr.io/metacontroller/metacontroller", ignored: true, check: func(t *testing.T, objs map[string]map[string]any) {
			if got := str(container(objs), "image"); !strings.HasPrefix(got, "ghcr.io/metabus/metabus:") {
				t.Errorf("image %q, want metabus's", got)
			}
		}},
		{key: "image.repository", value: "metacontrollerio/metacontroller", ignored: true},
		{key: "image.pullPolicy", value: "Always", check: field("Always", func(o map[string]map[string]any) any { return str(container(o), "imagePullPolicy") })},
		{key: "image.tag", value: "9.9.9", check: field("ghcr.io/metabus/metabus:9.9.9", func(o map[string]map[string]any) any { return str(container(o), "image") })},
		{key: "imagePullSecrets", value: "[{name: registry}]", check: field("[map[name:registry]]", func(o map[string]map[string]any) any { return slice(podSpec(o), "imagePullSecrets") })},
		{key: "nameOverride", value: "mc", check: func(t *testing.T, objs map[string]map[string]any) {
			if objs["Deployment/metabus-mc-watcher"] == nil {
				t.Errorf("Deployments %v", kinds(objs, "Deployment"))
			}
		}},
		{key: "namespaceOverride", value: "other", check: field("other", func(o map[string]map[string]any) any { return str(watcher(o), "metadata", "namespace") })},
		{key: "fullnameOverride", value: "mc", check: func(t *testing.T, objs map[string]map[string]any) {
			if objs["Deployment/mc-watcher"] == nil {
				t.Errorf("Deployments %v", kinds(objs, "Deployment"))
			}
		}},
		{key: "serviceAccount.create", value: "false", check: field("default", func(o map[string]map[string]any) any { return str(podSpec(o), "serviceAccountName") })},
		{key: "serviceAccount.annotations", value: "{eks.amazonaws.com/role-arn: arn}", check: field("arn", func(o map[string]map[string]any) any {
			return str(o["ServiceAccount/metabus-watcher"], "metadata", "annotations", "eks.amazonaws.com/role-arn")
		})},
		{key: "serviceAccount.name", value: "metacontroller", ignored: true, check: field("metabus-watcher", func(o map[string]map[string]any) any { return str(podSpec(o), "serviceAccountName") })},
		{key: "podAnnotations", value: "{team: platform}", check: field("platform", func(o map[string]map[string]any) any {
			return str(watcher(o), "spec", "template", "metadata", "annotations", "team")
		})},
		{key: "podSecurityContext", value: "{fsGroup: 2000}", check: field("2000", func(o map[string]map[string]any) any { return mapping(podSpec(o), "securityContext")["fsGroup"] })},
		{key: "securityContext", value: "{runAsUser: 1000}", check: field("1000", func(o map[string]map[string]any) any { return mapping(container(o), "securityContext")["runAsUser"] })},
		// Each service sets its own resources (values.yaml), which apply.
		{key: "resources", value: "{limits: {cpu: 100m}}", ignored: true},
		{key: "nodeSelector", value: "{disk: ssd}", check: field("map[disk:ssd]", func(o map[string]map[string]any) any { return mapping(podSpec(o), "nodeSelector") })},
		{key: "tolerations", value: "[{key: dedicated, operator: Exists}]", check: field("[map[key:dedicated operator:Exists]]", func(o map[string]map[string]any) any { return slice(podSpec(o), "tolerations") })},
		{key: "affinity", value: "{podAntiAffinity: {}}", check: field("map[podAntiAffinity:map[]]", func(o map[string]map[string]any) any { return mapping(podSpec(o), "affinity") })},
		{key: "priorityClassName", value: "system-cluster-critical", check: field("system-cluster-critical", func(o map[string]map[string]any) any { return str(podSpec(o), "priorityClassName") })},
		{key: "clusterRole.aggregationRule", value: "{clusterRoleSelectors: [{matchLabels: {rbac.example.com/aggregate-to-mc: 'true'}}]}", ignored: true},
		{key: "clusterRole.rules", value: "[{apiGroups: [apps], resources: [statefulsets], verbs: [get]}]", ignored: true, check: func(t *testing.T, objs map[string]map[string]any) {
			// metabus's own RBAC applies: the applier keeps its grants.
			if objs["ClusterRole/metabus-applier-all-resources"] == nil {
				t.Error("metabus's own ClusterRoles changed")
			}
		}},
		{key: "replicas", value: "3", check: field("3", func(o map[string]map[string]any) any { return watcher(o)["spec"].(map[string]any)["replicas"] })},
		{key: "podDisruptionBudget", value: "{minAvailable: 1}", check: field("1", func(o map[string]map[string]any) any {
			return mapping(o["PodDisruptionBudget/metabus-watcher"], "spec")["minAvailable"]
		})},
		// Enabled without ports (upstream's default []) must render too.
		{key: "service.enabled", value: "true"},
		{key: "service", value: "{enabled: true, ports: [{name: metrics, port: 9999, protocol: TCP, targetPort: 9999}]}", check: func(t *testing.T, objs map[string]map[string]any) {
			if objs["Service/metabus-watcher"] == nil {
				t.Errorf("no Service metabus-watcher: %v", kinds(objs, "Service"))
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.key+"="+tt.value, func(t *testing.T) {
			values := map[string]any{}
			setPath(values, tt.key, parseValue(t, tt.value))
			objs, notes := renderWithNotes(t, values)
			key := tt.key
			if strings.HasPrefix(key, "clusterRole.") {
				key = "clusterRole"
			}
			ignored := ignoredLines(notes)
			if tt.ignored && !slices.Equal(ignored, []string{key}) {
				t.Errorf("NOTES names as ignored %v, want exactly %s:\n%s", ignored, key, notes)
			}
			if !tt.ignored && len(ignored) != 0 {
				t.Errorf("NOTES names as ignored %v, want none:\n%s", ignored, notes)
			}
			if tt.ignored && !strings.Contains(notes, "ignored: "+key+" (") {
				t.Errorf("NOTES lacks the reason for %s", key)
			}
			if tt.check != nil {
				tt.check(t, objs)
			}
		})
	}
}

// TestUpstreamKeysAreExplicit (issue #32): upstream's keys are listed in
// values.schema.json one by one, so the schema stays strict: a misspelt key,
// metabus's own or upstream's, is still refused by `helm install`; an empty
// value of an ignored key is not reported.
func TestUpstreamKeysAreExplicit(t *testing.T) {
	for _, tt := range []struct{ reason, values string }{
		{"a misspelt top-level metabus key", "{profil: hardened}"},
		{"a misspelt nested metabus key", "{nats: {tls: {enable: false}}}"},
		{"a misspelt per-service key", "{watcher: {serviceAcount: {name: x}}}"},
		{"a misspelt upstream key", "{probes: {prot: 8081}}"},
		{"a misspelt upstream nested key", "{serviceAccount: {nam: x}}"},
		{"a misspelt upstream clusterRole key", "{clusterRole: {rule: []}}"},
		{"an upstream key of the wrong type", "{command: [/usr/bin/metacontroller]}"},
	} {
		t.Run(tt.reason, func(t *testing.T) {
			if _, err := helmRenderFiles(yamlValues(t, tt.values), defaultRelease); err == nil || !strings.Contains(err.Error(), "values don't meet the specifications of the schema") {
				t.Errorf("rendered (error %v), want the schema to refuse %s", err, tt.values)
			}
		})
	}
	t.Run("empty ignored values are not reported", func(t *testing.T) {
		if _, notes := renderWithNotes(t, yamlValues(t, "{command: '', serviceAccount: {name: ''}, clusterRole: {rules: [], aggregationRule: {}}}")); len(ignoredLines(notes)) != 0 {
			t.Errorf("NOTES names %v", ignoredLines(notes))
		}
	})
}
