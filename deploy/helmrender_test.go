package deploy

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"

	"github.com/metabus/metabus/pkg/natscreds"
	"github.com/metabus/metabus/pkg/natsx"
)

// renderChart renders the chart for `helm install metabus -n metabus`
// (helmRender) and returns the objects by "Kind/name".
func renderChart(values map[string]any) (map[string]map[string]any, error) {
	objs, err := helmRender(values, defaultRelease)
	if err != nil {
		return nil, err
	}
	return byKindName(objs)
}

// args returns the container arguments of a rendered workload.
func args(objs map[string]map[string]any, key string) []string {
	c, _ := slice(objs[key], "spec", "template", "spec", "containers")[0].(map[string]any)
	return stringList(slice(c, "args"))
}

// secretVolumes lists the Secret names a rendered workload mounts.
func secretVolumes(objs map[string]map[string]any, key string) []string {
	var out []string
	for _, v := range slice(objs[key], "spec", "template", "spec", "volumes") {
		if name := str(v.(map[string]any), "secret", "secretName"); name != "" {
			out = append(out, name)
		}
	}
	return out
}

// monitoringPeers returns the "from" peers of the rules of the NATS
// NetworkPolicy that open 8222.
func monitoringPeers(objs map[string]map[string]any) []any {
	var peers []any
	for _, r := range slice(objs["NetworkPolicy/metabus-nats"], "spec", "ingress") {
		for _, p := range slice(r.(map[string]any), "ports") {
			if fmt.Sprint(p.(map[string]any)["port"]) == "8222" {
				peers = append(peers, slice(r.(map[string]any), "from")...)
				if len(slice(r.(map[string]any), "from")) == 0 {
					peers = append(peers, "everyone")
				}
			}
		}
	}
	return peers
}

func kinds(objs map[string]map[string]any, kind string) []string {
	var out []string
	for k := range objs {
		if strings.HasPrefix(k, kind+"/") {
			out = append(out, strings.TrimPrefix(k, kind+"/"))
		}
	}
	sort.Strings(out)
	return out
}

// TestHelmRender renders the chart with Helm's engine for the issue #14
// values and checks what each one changes.
func TestHelmRender(t *testing.T) {
	tests := []struct {
		reason  string
		values  string // YAML
		wantErr string
		check   func(t *testing.T, objs map[string]map[string]any)
	}{
		{
			reason: "defaults: profile upstream, TLS from the generator, monitoring closed",
			check: func(t *testing.T, objs map[string]map[string]any) {
				want := []string{"metabus-applier", "metabus-applier-all-resources", "metabus-applier-events", "metabus-dispatcher",
					"metabus-dispatcher-secrets-all-namespaces", "metabus-revisions", "metabus-watcher"}
				if diff := cmp.Diff(want, kinds(objs, "ClusterRole")); diff != "" {
					t.Errorf("ClusterRoles (-want +got):\n%s", diff)
				}
				// The certificates are made in the cluster, never rendered.
				if got := append(kinds(objs, "Secret"), kinds(objs, "Certificate")...); len(got) != 0 {
					t.Errorf("Secrets or Certificates rendered: %v", got)
				}
				if p := monitoringPeers(objs); len(p) != 0 {
					t.Errorf("8222 open to %v", p)
				}
				checkTLSWiring(t, objs)
				checkGeneratedCertificates(t, objs)
				// TestProfiles checks the profile's settings.
			},
		},
		{
			reason: "plaintext only when asked: nats.tls.enabled=false",
			values: "nats: {tls: {enabled: false}}",
			check: func(t *testing.T, objs map[string]map[string]any) {
				for _, svc := range services {
					a := args(objs, "Deployment/metabus-"+svc)
					if !slices.Contains(a, "--nats-url=nats://metabus-nats.metabus:4222") || slices.ContainsFunc(a, func(s string) bool { return strings.HasPrefix(s, "--nats-ca") }) {
						t.Errorf("%s args %v: want a nats:// URL and no TLS flags", svc, a)
					}
					if v := secretVolumes(objs, "Deployment/metabus-"+svc); slices.Contains(v, natscreds.ClientTLSSecret(svc)) {
						t.Errorf("%s mounts its certificate without TLS", svc)
					}
				}
				if got := initArgs(objs); !slices.Equal(got, []string{"--tls=false"}) {
					t.Errorf("generator args %v, want --tls=false", got)
				}
				cm := mapping(objs["ConfigMap/metabus-nats-config"], "data")
				if cluster, _ := cm["cluster.conf"].(string); strings.Contains(cluster, "tls") || cm["tls.conf"] != nil {
					t.Errorf("NATS configured for TLS:\n%s", cluster)
				}
			},
		},
		{
			reason: `certificates "helm" (earlier versions' install-time generation) means the generator`,
			values: "nats: {tls: {certificates: helm}}",
			check: func(t *testing.T, objs map[string]map[string]any) {
				if got := append(kinds(objs, "Secret"), kinds(objs, "Certificate")...); len(got) != 0 {
					t.Errorf("Secrets or Certificates rendered: %v", got)
				}
				checkTLSWiring(t, objs)
			},
		},
		{
			reason: "applier narrowed to extra rules",
			values: "applier: {rbac: {allResources: false, extraRules: [{apiGroups: [''], resources: [configmaps], verbs: [create]}]}}",
			check: func(t *testing.T, objs map[string]map[string]any) {
				if objs["ClusterRole/metabus-applier-all-resources"] != nil {
					t.Error("the all-resources role is still rendered")
				}
				extra := objs["ClusterRole/metabus-applier-extra"]
				if str(extra, "metadata", "labels", "metabus.dev/aggregate-to-applier") != "true" {
					t.Fatalf("metabus-applier-extra missing or not aggregated: %v", extra)
				}
				want := []any{map[string]any{"apiGroups": []any{""}, "resources": []any{"configmaps"}, "verbs": []any{"create"}}}
				if diff := cmp.Diff(want, slice(extra, "rules")); diff != "" {
					t.Errorf("extra rules (-want +got):\n%s", diff)
				}
			},
		},
		{
			reason: "related resources passed to the dispatcher",
			values: "dispatcher: {relatedResources: ['*', '-core/events']}",
			check: func(t *testing.T, objs map[string]map[string]any) {
				if a := args(objs, "Deployment/metabus-dispatcher"); !slices.Contains(a, "--related-resources=*,-core/events") {
					t.Errorf("dispatcher args %v", a)
				}
			},
		},
		{
			reason: "controller resources passed to the watcher",
			values: "watcher: {controllerResources: [core/configmaps, 'apps/*']}",
			check: func(t *testing.T, objs map[string]map[string]any) {
				if a := args(objs, "Deployment/metabus-watcher"); !slices.Contains(a, "--controller-resources=core/configmaps,apps/*") {
					t.Errorf("watcher args %v", a)
				}
			},
		},
		{
			reason: "monitoring opened to the listed peers only",
			values: "nats: {monitoring: {allowFrom: [{namespaceSelector: {matchLabels: {team: monitoring}}}]}}",
			check: func(t *testing.T, objs map[string]map[string]any) {
				want := []any{map[string]any{"namespaceSelector": map[string]any{"matchLabels": map[string]any{"team": "monitoring"}}}}
				if diff := cmp.Diff(want, monitoringPeers(objs)); diff != "" {
					t.Errorf("8222 peers (-want +got):\n%s", diff)
				}
			},
		},
		{
			reason: "TLS from cert-manager",
			values: "nats: {tls: {enabled: true, certificates: cert-manager, certManager: {issuerRef: {name: ca-issuer}}}}",
			check: func(t *testing.T, objs map[string]map[string]any) {
				if got := kinds(objs, "Secret"); len(got) != 0 {
					t.Errorf("Secrets rendered though cert-manager issues them: %v", got)
				}
				want := natscreds.TLSNames(natscreds.Users)[1:]
				sort.Strings(want)
				if diff := cmp.Diff(want, kinds(objs, "Certificate")); diff != "" {
					t.Errorf("Certificates (-want +got):\n%s", diff)
				}
				for _, name := range want {
					c := objs["Certificate/"+name]
					if str(c, "spec", "secretName") != name || str(c, "spec", "issuerRef", "name") != "ca-issuer" {
						t.Errorf("Certificate %s: secretName %q issuer %q", name, str(c, "spec", "secretName"), str(c, "spec", "issuerRef", "name"))
					}
					// Refused as hook credentials like the seeds.
					if str(c, "spec", "secretTemplate", "labels", natsx.CredentialsLabel) != "true" {
						t.Errorf("Certificate %s: its Secret is not labelled %s", name, natsx.CredentialsLabel)
					}
				}
				dns := stringList(slice(objs["Certificate/"+natscreds.ServerTLSSecret], "spec", "dnsNames"))
				if diff := cmp.Diff(natscreds.ServerDNSNames("metabus-nats", "metabus-nats-headless", "metabus"), dns); diff != "" {
					t.Errorf("server certificate names, not the generator's (-generator +cert-manager):\n%s", diff)
				}
				if got := initArgs(objs); !slices.Equal(got, []string{"--tls=false"}) {
					t.Errorf("generator args %v, want --tls=false (cert-manager owns the Secrets)", got)
				}
				checkTLSWiring(t, objs)
			},
		},
		{
			reason:  "cert-manager without an issuer is refused",
			values:  "nats: {tls: {enabled: true, certificates: cert-manager}}",
			wantErr: "nats.tls.certificates=cert-manager needs nats.tls.certManager.issuerRef.name",
		},
		{
			reason:  "an unknown certificate source is refused",
			values:  "nats: {tls: {enabled: true, certificates: vault}}",
			wantErr: `nats.tls.certificates: "vault", want generate or cert-manager`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			values := yamlValues(t, tt.values)
			objs, err := renderChart(values)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("render error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, objs)
		})
	}
}

// yamlValues parses Helm values written as YAML; "" is no values.
func yamlValues(t *testing.T, y string) map[string]any {
	t.Helper()
	if y == "" {
		return map[string]any{}
	}
	docs, err := parseDocs([]byte(y))
	if err != nil {
		t.Fatalf("values %q: %v", y, err)
	}
	return docs[0]
}

// initArgs returns the arguments of the NATS pods' init container (the
// credential generator).
func initArgs(objs map[string]map[string]any) []string {
	for k, o := range objs {
		if strings.HasPrefix(k, "StatefulSet/") {
			c, _ := slice(o, "spec", "template", "spec", "initContainers")[0].(map[string]any)
			return stringList(slice(c, "args"))
		}
	}
	return nil
}

// checkTLSWiring: every service connects with tls:// and its own client
// certificate Secret (checkServiceDeployment), nats-server mounts the
// server's, and its configuration turns TLS on for clients and routes.
func checkTLSWiring(t *testing.T, objs map[string]map[string]any) {
	t.Helper()
	for _, svc := range services {
		key := "Deployment/metabus-" + svc
		for _, w := range []string{"--nats-url=tls://metabus-nats.metabus:4222", "--nats-ca=/etc/metabus/nats-tls/ca.crt", "--nats-cert=/etc/metabus/nats-tls/tls.crt", "--nats-key=/etc/metabus/nats-tls/tls.key"} {
			if !slices.Contains(args(objs, key), w) {
				t.Errorf("%s lacks %s", svc, w)
			}
		}
		if !slices.Contains(secretVolumes(objs, key), natscreds.ClientTLSSecret(svc)) {
			t.Errorf("%s does not mount %s: %v", svc, natscreds.ClientTLSSecret(svc), secretVolumes(objs, key))
		}
	}
	if v := volumeSecretAt(mapping(objs["StatefulSet/metabus-nats"], "spec", "template", "spec"), "nats", "/etc/nats/tls"); v != natscreds.ServerTLSSecret {
		t.Errorf("the NATS StatefulSet mounts %q at /etc/nats/tls, want %s", v, natscreds.ServerTLSSecret)
	}
	cm := mapping(objs["ConfigMap/metabus-nats-config"], "data")
	if cm["tls.conf"] != readFile(t, filepath.Join("nats", "tls.conf")) {
		t.Error("ConfigMap tls.conf is not nats/tls.conf")
	}
	cluster, _ := cm["cluster.conf"].(string)
	if !strings.HasPrefix(cluster, "include ./tls.conf") || !strings.Contains(cluster, `ca_file: "/etc/nats/tls/ca.crt"`) {
		t.Errorf("cluster.conf does not enable TLS for clients and routes:\n%s", cluster)
	}
}

// checkGeneratedCertificates: the certificates the generator makes for the
// rendered init container's arguments work with the rendered NATS
// configuration: the server's is valid for the client Service and every
// pod's route address, and the watcher's certificate connects to a
// nats-server loaded with the rendered tls.conf and the server's Secret,
// verifying it with the CA of its own Secret.
func checkGeneratedCertificates(t *testing.T, objs map[string]map[string]any) {
	t.Helper()
	flags := map[string]string{}
	for _, a := range initArgs(objs) {
		k, v, _ := strings.Cut(a, "=")
		flags[k] = v
	}
	validity, err := time.ParseDuration(flags["--tls-validity"])
	if err != nil {
		t.Fatalf("--tls-validity: %v", err)
	}
	if validity != natscreds.DefaultValidity {
		t.Errorf("--tls-validity %s, want the default %s", validity, natscreds.DefaultValidity)
	}
	plan, err := natscreds.EnsureTLS(natscreds.TLSSpec{
		Users:     natscreds.Users,
		ServerDNS: natscreds.ServerDNSNames(flags["--tls-service"], flags["--tls-peers"], "metabus"),
		Validity:  validity, Now: time.Now(),
	}, map[string]natscreds.Secret{})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	files := map[string][]byte{}
	for _, a := range plan {
		for k, data := range a.Secret.Data {
			files[a.Secret.Name+"/"+k] = data
			if err := os.MkdirAll(filepath.Join(dir, a.Secret.Name), 0o700); err != nil {
				t.Fatal(err)
			}
			writeTestFile(t, filepath.Join(dir, a.Secret.Name, k), data)
		}
	}
	server := natscreds.ServerTLSSecret
	block, _ := pem.Decode(files[server+"/tls.crt"])
	if block == nil {
		t.Fatal("server tls.crt is not PEM")
	}
	serverCert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	client := natscreds.ClientTLSSecret("watcher")
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(files[client+"/ca.crt"]) {
		t.Fatal("the watcher's ca.crt holds no certificate")
	}
	for _, host := range []string{"metabus-nats.metabus", "metabus-nats.metabus.svc", "metabus-nats-2.metabus-nats-headless.metabus.svc"} {
		if _, err := serverCert.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("server certificate for %s: %v", host, err)
		}
	}

	conf, _ := mapping(objs["ConfigMap/metabus-nats-config"], "data")["tls.conf"].(string)
	confPath := filepath.Join(dir, "tls.conf")
	writeTestFile(t, confPath, []byte(strings.ReplaceAll(conf, `"/etc/nats/tls/`, `"`+filepath.Join(dir, server)+"/")))
	addr := startTLSServer(t, confPath, nil)
	// The Service's name, as the services dial it, instead of 127.0.0.1.
	nc, err := nats.Connect("tls://"+addr, nats.Secure(&tls.Config{ServerName: "metabus-nats.metabus", MinVersion: tls.VersionTLS12}),
		nats.RootCAs(filepath.Join(dir, client, "ca.crt")),
		nats.ClientCert(filepath.Join(dir, client, "tls.crt"), filepath.Join(dir, client, "tls.key")),
		nats.Timeout(5*time.Second), nats.NoReconnect())
	if err != nil {
		t.Fatalf("the watcher's generated certificate against the generated server: %v", err)
	}
	nc.Close()
}

// TestHelmTemplateStable (issue #32): `helm template` gives the same output
// every time, as GitOps tools (Argo CD, Flux) need: no template makes key
// material or reads the cluster (the NATS certificates are made in the
// cluster by the credential generator), and two renders of the same values
// are byte-identical.
func TestHelmTemplateStable(t *testing.T) {
	// Functions whose result changes between renders or depends on the
	// cluster (lookup returns nothing under helm template).
	unstable := regexp.MustCompile(`\b(lookup|genCA|genCAWithKey|genSignedCert|genSignedCertWithKey|genSelfSignedCert|genSelfSignedCertWithKey|genPrivateKey|` +
		`derivePassword|randAlphaNum|randAlpha|randAscii|randNumeric|randBytes|randInt|uuidv4|now|date|dateInZone|htmlDate|unixEpoch)\b`)
	templates, err := filepath.Glob(filepath.Join(chartDir, "templates", "*"))
	if err != nil || len(templates) == 0 {
		t.Fatalf("templates: %v (%d)", err, len(templates))
	}
	for _, path := range templates {
		for _, action := range regexp.MustCompile(`(?s){{.*?}}`).FindAllString(readFile(t, path), -1) {
			if strings.HasPrefix(action, "{{/*") || strings.HasPrefix(action, "{{- /*") {
				continue
			}
			if m := unstable.FindString(action); m != "" {
				t.Errorf("%s calls %s: %s", filepath.Base(path), m, action)
			}
		}
	}

	for _, tt := range []struct {
		reason string
		values string
	}{
		{reason: "defaults (TLS from the generator)"},
		{reason: "plaintext", values: "nats: {tls: {enabled: false}}"},
		{reason: "cert-manager", values: "nats: {tls: {certificates: cert-manager, certManager: {issuerRef: {name: ca}}}}"},
	} {
		t.Run(tt.reason, func(t *testing.T) {
			values := yamlValues(t, tt.values)
			first, err := helmRenderFiles(values, defaultRelease)
			if err != nil {
				t.Fatal(err)
			}
			second, err := helmRenderFiles(values, defaultRelease)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(first, second); diff != "" {
				t.Errorf("two renders differ (-first +second):\n%s", diff)
			}
		})
	}
}
