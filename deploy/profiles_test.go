package deploy

import (
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"

	"github.com/metabus/metabus/pkg/natscreds"
)

// render is one way of installing metabus, rendered.
type render struct {
	name string
	objs []map[string]any
}

// renders returns the four shipped installs: kustomize and Helm, each in
// the upstream (default) and the hardened profile.
func renders(t *testing.T) (def, hardened []render) {
	t.Helper()
	must := func(objs []map[string]any, err error) []map[string]any {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return objs
	}
	def = []render{
		{"kustomize deploy/", must(kustomizeBuild(kustomizeDefault))},
		{"helm defaults", must(helmRender(nil, defaultRelease))},
	}
	hardened = []render{
		{"kustomize deploy/overlays/hardened", must(kustomizeBuild(kustomizeHardened))},
		{"helm profile=hardened", must(helmRender(map[string]any{"profile": "hardened"}, defaultRelease))},
	}
	return def, hardened
}

// find returns the object of kind and name in objs (any namespace).
func find(objs []map[string]any, kind, name string) map[string]any {
	for _, o := range objs {
		if str(o, "kind") == kind && str(o, "metadata", "name") == name {
			return o
		}
	}
	return nil
}

// containerArgs returns the arguments of a rendered Deployment's container.
func containerArgs(t *testing.T, objs []map[string]any, name string) []string {
	t.Helper()
	o := find(objs, "Deployment", name)
	if o == nil {
		t.Fatalf("no Deployment %s", name)
	}
	return podContainer(t, o).args()
}

// flagValues returns the values a flag is given in args, in order.
func flagValues(args []string, flag string) []string {
	var out []string
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+flag+"="); ok {
			out = append(out, v)
		}
	}
	return out
}

// canIn reports whether rules let their subject do verb on target in
// namespace ns: a ClusterRole's rules apply everywhere, a Role's in its
// namespace only.
func canIn(rules []policyRule, ns, target, verb string) bool {
	var in []policyRule
	for _, r := range rules {
		if strings.HasPrefix(r.role, "ClusterRole/") || strings.HasSuffix(r.role, "("+ns+")") {
			in = append(in, r)
		}
	}
	return hasGrant(in, target, verb)
}

// TestProfiles (issue #22): the default install of either tool sets and
// grants what upstream Metacontroller allows, so upstream's examples run
// unchanged; the hardened profile sets every narrowing setting and drops
// the wide grants.
func TestProfiles(t *testing.T) {
	def, hardened := renders(t)
	type want struct {
		secretNamespaces, relatedResources, controllerResources string
		hookDestinations, refuseInsecureCredentials             string
		maxControllerWeight, resyncAfterBacklog                 string
		maxHeldPerController                                    string
		// What the dispatcher may read in a tenant's namespace, the applier
		// write anywhere.
		tenantSecrets, anyWrite bool
	}
	check := func(t *testing.T, r render, w want) {
		t.Helper()
		d := containerArgs(t, r.objs, "metabus-dispatcher")
		if got := flagValues(d, "secret-namespaces"); !slices.Equal(got, []string{w.secretNamespaces}) {
			t.Errorf("dispatcher --secret-namespaces %q, want [%q]", got, w.secretNamespaces)
		}
		if got := flagValues(d, "related-resources"); !slices.Equal(got, []string{w.relatedResources}) {
			t.Errorf("dispatcher --related-resources %q, want [%q]", got, w.relatedResources)
		}
		if got := flagValues(d, "hook-destinations"); !slices.Equal(got, []string{w.hookDestinations}) {
			t.Errorf("dispatcher --hook-destinations %q, want [%q]", got, w.hookDestinations)
		}
		if got := flagValues(d, "refuse-insecure-credentials"); !slices.Equal(got, []string{w.refuseInsecureCredentials}) {
			t.Errorf("dispatcher --refuse-insecure-credentials %q, want [%q]", got, w.refuseInsecureCredentials)
		}
		if got := flagValues(d, "resync-after-backlog"); !slices.Equal(got, []string{w.resyncAfterBacklog}) {
			t.Errorf("dispatcher --resync-after-backlog %q, want [%q]", got, w.resyncAfterBacklog)
		}
		if got := flagValues(d, "max-held-per-controller"); !slices.Equal(got, []string{w.maxHeldPerController}) {
			t.Errorf("dispatcher --max-held-per-controller %q, want [%q]", got, w.maxHeldPerController)
		}
		if got := flagValues(containerArgs(t, r.objs, "metabus-watcher"), "max-controller-weight"); !slices.Equal(got, []string{w.maxControllerWeight}) {
			t.Errorf("watcher --max-controller-weight %q, want [%q]", got, w.maxControllerWeight)
		}
		if got := flagValues(containerArgs(t, r.objs, "metabus-watcher"), "controller-resources"); !slices.Equal(got, []string{w.controllerResources}) {
			t.Errorf("watcher --controller-resources %q, want [%q]", got, w.controllerResources)
		}
		set := rbacSet{objs: r.objs}
		disp, _ := set.rulesFor(t, "metabus", "metabus-dispatcher")
		if got := canIn(disp, "tenant", "/secrets", "get"); got != w.tenantSecrets {
			t.Errorf("dispatcher may get Secrets in another namespace: %v, want %v", got, w.tenantSecrets)
		}
		if !canIn(disp, "metabus", "/secrets", "get") {
			t.Error("dispatcher may not get Secrets in its own namespace")
		}
		app, _ := set.rulesFor(t, "metabus", "metabus-applier")
		for _, target := range []string{"apps/deployments", "/secrets", "example.com/things/status"} {
			verb := "create"
			if strings.HasSuffix(target, "/status") {
				verb = "update"
			}
			if got := hasGrant(app, target, verb); got != w.anyWrite {
				t.Errorf("applier may %s %s: %v, want %v", verb, target, got, w.anyWrite)
			}
		}
		if !hasGrant(app, "/events", "create") {
			t.Error("applier may not create Events (ApplyForbidden must get through)")
		}
	}
	for _, r := range def {
		t.Run(r.name, func(t *testing.T) {
			check(t, r, want{secretNamespaces: "*", relatedResources: "*", controllerResources: "*",
				hookDestinations: "*", refuseInsecureCredentials: "false", tenantSecrets: true, anyWrite: true,
				maxControllerWeight: "100", resyncAfterBacklog: "0", maxHeldPerController: "256"})
		})
	}
	for _, r := range hardened {
		t.Run(r.name, func(t *testing.T) {
			check(t, r, want{secretNamespaces: "", relatedResources: "*,-core/secrets", controllerResources: "*,-core/secrets",
				hookDestinations: "-apiserver,-loopback,-link-local,*", refuseInsecureCredentials: "true",
				maxControllerWeight: "1", resyncAfterBacklog: "32", maxHeldPerController: "64"})
			for _, kind := range []string{"ClusterRole", "ClusterRoleBinding"} {
				if o := find(r.objs, kind, "metabus-dispatcher-secrets-all-namespaces"); o != nil {
					t.Errorf("%s metabus-dispatcher-secrets-all-namespaces is rendered", kind)
				}
			}
			if find(r.objs, "ClusterRole", "metabus-applier-all-resources") != nil {
				t.Error("ClusterRole metabus-applier-all-resources is rendered")
			}
		})
	}
}

// TestHelmMatchesKustomize: `helm install metabus -n metabus` renders the
// same RBAC, rule for rule and role name for role name, and the same
// service arguments (but for the NATS Service's name) as kustomize, in both
// profiles. This replaces keeping byte-identical copies of deploy/rbac in
// the chart.
func TestHelmMatchesKustomize(t *testing.T) {
	def, hardened := renders(t)
	accounts := append([]string{"metabus-credentials"}, func() []string {
		var out []string
		for _, svc := range services {
			out = append(out, "metabus-"+svc)
		}
		return out
	}()...)
	for _, pair := range [][]render{def, hardened} {
		k, h := pair[0], pair[1]
		t.Run(k.name+" vs "+h.name, func(t *testing.T) {
			for _, sa := range accounts {
				kr, kb := rbacSet{objs: k.objs}.rulesFor(t, "metabus", sa)
				hr, hb := rbacSet{objs: h.objs}.rulesFor(t, "metabus", sa)
				if !kb || !hb {
					t.Errorf("%s bound: kustomize %v, helm %v", sa, kb, hb)
				}
				if diff := cmp.Diff(ruleLines(kr), ruleLines(hr)); diff != "" {
					t.Errorf("%s rules (-kustomize +helm):\n%s", sa, diff)
				}
			}
			for _, svc := range services {
				name := "metabus-" + svc
				ka, ha := containerArgs(t, k.objs, name), containerArgs(t, h.objs, name)
				norm := func(args []string) []string {
					out := slices.Clone(args)
					for i, a := range out {
						if strings.HasPrefix(a, "--nats-url=") {
							out[i] = "--nats-url"
						}
					}
					sort.Strings(out)
					return out
				}
				if diff := cmp.Diff(norm(ka), norm(ha)); diff != "" {
					t.Errorf("%s args (-kustomize +helm):\n%s", svc, diff)
				}
			}
		})
	}
}

func ruleLines(rules []policyRule) []string {
	var out []string
	for _, r := range rules {
		out = append(out, r.String())
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// TestCredentialsRBAC: the credential generator may create Secrets, get and
// update the seed and public key Secrets by name, and get the NATS CA and
// certificate Secrets by name, in metabus's namespace
// only, and nothing else; the NATS pods run as it, with its token mounted
// into the init container only.
func TestCredentialsRBAC(t *testing.T) {
	def, hardened := renders(t)
	for _, r := range append(def, hardened...) {
		t.Run(r.name, func(t *testing.T) {
			rules, bound := rbacSet{objs: r.objs}.rulesFor(t, "metabus", "metabus-credentials")
			if !bound {
				t.Fatal("metabus-credentials is not bound")
			}
			var named, readOnly []string
			for _, rule := range rules {
				if !strings.HasPrefix(rule.role, "Role/") || !strings.HasSuffix(rule.role, "(metabus)") {
					t.Errorf("granted by %s; want a Role in metabus only", rule.role)
				}
				if !slices.Equal(rule.groups, []string{""}) || !slices.Equal(rule.resources, []string{"secrets"}) {
					t.Errorf("%s: access beyond Secrets", rule)
				}
				switch {
				case len(rule.names) == 0 && slices.Equal(rule.verbs, []string{"create"}):
				case len(rule.names) > 0 && slices.Equal(rule.verbs, []string{"get", "update"}):
					named = append(named, rule.names...)
				case len(rule.names) > 0 && slices.Equal(rule.verbs, []string{"get"}):
					readOnly = append(readOnly, rule.names...)
				default:
					t.Errorf("%s: want create, or get (and update) on named Secrets", rule)
				}
			}
			if diff := cmp.Diff(natscreds.Names(natscreds.Users), named); diff != "" {
				t.Errorf("Secrets it may get and update (-want +got):\n%s", diff)
			}
			// The TLS material is only ever created and read (EnsureTLS
			// never updates).
			if diff := cmp.Diff(natscreds.TLSNames(natscreds.Users), readOnly); diff != "" {
				t.Errorf("Secrets it may only get (-want +got):\n%s", diff)
			}

			var sts map[string]any
			for _, o := range r.objs {
				if str(o, "kind") == "StatefulSet" {
					sts = o
				}
			}
			spec := mapping(sts, "spec", "template", "spec")
			if str(spec, "serviceAccountName") != "metabus-credentials" || spec["automountServiceAccountToken"] != false {
				t.Errorf("NATS pods: serviceAccountName %q, automountServiceAccountToken %v", str(spec, "serviceAccountName"), spec["automountServiceAccountToken"])
			}
			inits := slice(spec, "initContainers")
			if len(inits) != 1 {
				t.Fatalf("NATS pods: %d init containers, want the credential generator", len(inits))
			}
			gen := inits[0].(map[string]any)
			if got := stringList(slice(gen, "command")); !slices.Equal(got, []string{"/usr/local/bin/metabus", "credentials", "ensure"}) {
				t.Errorf("init container command %v", got)
			}
			tokenMounted := func(c map[string]any) bool {
				for _, m := range slice(c, "volumeMounts") {
					if str(m.(map[string]any), "mountPath") == "/var/run/secrets/kubernetes.io/serviceaccount" {
						return true
					}
				}
				return false
			}
			if !tokenMounted(gen) {
				t.Error("the init container has no API token")
			}
			// The server certificate it makes is for the Services the
			// services and the routes dial, and is what nats-server mounts.
			wantArgs := []string{"--tls-service=" + str(sts, "metadata", "name"), "--tls-peers=" + str(sts, "spec", "serviceName")}
			if got := stringList(slice(gen, "args")); len(got) < 2 || !slices.Equal(got[:2], wantArgs) {
				t.Errorf("init container args %v, want %v first", got, wantArgs)
			}
			if v := volumeSecretAt(spec, "nats", "/etc/nats/tls"); v != natscreds.ServerTLSSecret {
				t.Errorf("nats-server mounts %q at /etc/nats/tls, want %s", v, natscreds.ServerTLSSecret)
			}
			for _, c := range slice(spec, "containers") {
				if tokenMounted(c.(map[string]any)) {
					t.Errorf("container %s gets the generator's token", str(c.(map[string]any), "name"))
				}
			}
		})
	}
}

// TestVersioned (issue #23): no :latest anywhere; the metabus image is set
// in one place per tool (kustomize images:, Helm image.tag defaulting to
// the chart's appVersion), and both give the same semver version.
func TestVersioned(t *testing.T) {
	chart := readDocs(t, chartDir+"/Chart.yaml")[0]
	semver := `^\d+\.\d+\.\d+$`
	for _, f := range []string{"version", "appVersion"} {
		if v := str(chart, f); !matches(semver, v) {
			t.Errorf("Chart.yaml %s %q is not a release semver", f, v)
		}
	}
	app := str(chart, "appVersion")
	images := slice(readDocs(t, "kustomization.yaml")[0], "images")
	if len(images) != 1 || str(images[0].(map[string]any), "name") != "ghcr.io/metabus/metabus" || str(images[0].(map[string]any), "newTag") != app {
		t.Errorf("kustomization.yaml images %v, want ghcr.io/metabus/metabus at %s (the chart's appVersion)", images, app)
	}
	if got := slice(readDocs(t, kustomizeHardened+"/kustomization.yaml")[0], "images"); !cmp.Equal(got, images) {
		t.Errorf("the hardened overlay's images %v differ from deploy/'s %v", got, images)
	}
	def, hardened := renders(t)
	tagged, _ := helmRender(map[string]any{"image": map[string]any{"tag": "9.9.9"}}, defaultRelease)
	for _, r := range append(append(def, hardened...), render{"helm image.tag=9.9.9", tagged}) {
		want := "ghcr.io/metabus/metabus:" + app
		if r.name == "helm image.tag=9.9.9" {
			want = "ghcr.io/metabus/metabus:9.9.9"
		}
		n := 0
		for _, o := range r.objs {
			spec := mapping(o, "spec", "template", "spec")
			for _, c := range append(slice(spec, "initContainers"), slice(spec, "containers")...) {
				img := str(c.(map[string]any), "image")
				if strings.HasSuffix(img, ":latest") || !strings.Contains(img, ":") {
					t.Errorf("%s: %s/%s image %q is not pinned", r.name, str(o, "kind"), str(o, "metadata", "name"), img)
				}
				if strings.HasPrefix(img, "ghcr.io/metabus/metabus") {
					n++
					if img != want {
						t.Errorf("%s: image %q, want %q", r.name, img, want)
					}
				}
			}
		}
		if n != 5 { // four services and the credential generator
			t.Errorf("%s: %d containers run metabus, want 5", r.name, n)
		}
	}
}

// TestHelmLint lints the chart with Helm's own lint package (what `helm
// lint` runs: Chart.yaml, values against values.schema.json, templates
// rendered and parsed), with the default values and with every kind of
// non-default value the chart supports.
func TestHelmLint(t *testing.T) {
	for name, values := range lintValues(t) {
		t.Run(name, func(t *testing.T) {
			l := lint.AllWithKubeVersion(chartDir, values, "metabus", &chartutil.KubeVersion{Version: "v1.36.3", Major: "1", Minor: "36"})
			for _, m := range l.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("%s", m)
				}
			}
		})
	}
	t.Run("a value of the wrong type is refused", func(t *testing.T) {
		l := lint.AllWithKubeVersion(chartDir, map[string]any{"replicas": "two"}, "metabus", nil)
		if l.HighestSeverity < support.ErrorSev {
			t.Errorf("lint accepted replicas: two: %v", l.Messages)
		}
	})
	t.Run("an unknown profile is refused", func(t *testing.T) {
		_, err := helmRender(map[string]any{"profile": "paranoid"}, defaultRelease)
		if err == nil || !strings.Contains(err.Error(), "profile") {
			t.Errorf("render error %v, want one naming the profile", err)
		}
	})
}

// lintValues are the values sets the lint and the server-side dry-run
// check: the defaults and every option set to something else.
func lintValues(t *testing.T) map[string]map[string]any {
	t.Helper()
	parse := func(y string) map[string]any {
		docs, err := parseDocs([]byte(y))
		if err != nil {
			t.Fatal(err)
		}
		return docs[0]
	}
	return map[string]map[string]any{
		"defaults": {},
		"hardened": {"profile": "hardened"},
		"everything": parse(`
profile: hardened
image: {repository: registry.example.com/metabus, tag: 0.1.0-rc.1, pullPolicy: Always}
imagePullSecrets: [{name: regcred}]
nameOverride: mb
fullnameOverride: platform-metabus
serviceAccount: {create: true, annotations: {team: platform}}
podAnnotations: {prometheus.io/scrape: "true"}
podSecurityContext: {runAsNonRoot: true, runAsUser: 1001, fsGroup: 1001, seccompProfile: {type: RuntimeDefault}}
securityContext: {allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, runAsNonRoot: true, capabilities: {drop: [ALL]}, seccompProfile: {type: RuntimeDefault}}
resources: {requests: {cpu: 50m, memory: 64Mi}, limits: {memory: 512Mi}}
nodeSelector: {kubernetes.io/os: linux}
tolerations: [{key: dedicated, operator: Equal, value: platform, effect: NoSchedule}]
affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/arch, operator: In, values: [amd64]}]}]}}}
priorityClassName: system-cluster-critical
env: [{name: GODEBUG, value: "madvdontneed=1"}]
commandArgs: [--zap-log-level=4, --discovery-interval=20s]
replicas: 3
podDisruptionBudget: {minAvailable: 1}
service: {enabled: true, ports: [{name: metrics, port: 9999, protocol: TCP, targetPort: metrics}]}
metrics: {serviceMonitor: {enabled: true, labels: {release: prometheus}}}
watcher: {replicas: 2, controllerResources: [core/configmaps, 'apps/*'], commandArgs: [--workers=8], serviceAccount: {name: mb-watch}}
dispatcher: {secretNamespaces: [tenant-a], relatedResources: ['*', '-core/events'], resources: {limits: {memory: 2Gi}}}
applier: {rbac: {allResources: false, extraRules: [{apiGroups: [''], resources: [configmaps], verbs: [get, create, update, patch, delete]}]}, podDisruptionBudget: {}}
revisions: {replicas: 1, clusterRole: {rules: [{apiGroups: [metacontroller.k8s.io], resources: [controllerrevisions], verbs: ['*']}]}}
nats: {replicas: 1, streamReplicas: 1, partitions: 16, tls: {enabled: true}, monitoring: {allowFrom: [{namespaceSelector: {matchLabels: {team: monitoring}}}]}, nodeSelector: {disk: ssd}}
`),
	}
}

func matches(pattern, s string) bool { return regexp.MustCompile(pattern).MatchString(s) }

// volumeSecretAt returns the Secret that container name of pod spec mounts
// at path, or "".
func volumeSecretAt(spec map[string]any, name, path string) string {
	for _, c := range slice(spec, "containers") {
		if str(c.(map[string]any), "name") != name {
			continue
		}
		for _, m := range slice(c.(map[string]any), "volumeMounts") {
			if str(m.(map[string]any), "mountPath") != path {
				continue
			}
			for _, v := range slice(spec, "volumes") {
				if str(v.(map[string]any), "name") == str(m.(map[string]any), "name") {
					return str(v.(map[string]any), "secret", "secretName")
				}
			}
		}
	}
	return ""
}
