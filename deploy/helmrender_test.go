package deploy

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
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
	clientSecrets := []string{"metabus-nats-applier-tls", "metabus-nats-dispatcher-tls", "metabus-nats-revisions-tls", "metabus-nats-watcher-tls"}
	tests := []struct {
		reason  string
		values  string // YAML
		wantErr string
		check   func(t *testing.T, objs map[string]map[string]any)
	}{
		{
			reason: "defaults: profile upstream, no TLS, monitoring closed",
			check: func(t *testing.T, objs map[string]map[string]any) {
				want := []string{"metabus-applier", "metabus-applier-all-resources", "metabus-applier-events", "metabus-dispatcher",
					"metabus-dispatcher-secrets-all-namespaces", "metabus-revisions", "metabus-watcher"}
				if diff := cmp.Diff(want, kinds(objs, "ClusterRole")); diff != "" {
					t.Errorf("ClusterRoles (-want +got):\n%s", diff)
				}
				if got := kinds(objs, "Secret"); len(got) != 0 {
					t.Errorf("Secrets rendered without TLS: %v", got)
				}
				if p := monitoringPeers(objs); len(p) != 0 {
					t.Errorf("8222 open to %v", p)
				}
				for _, svc := range services {
					a := args(objs, "Deployment/metabus-"+svc)
					if !slices.Contains(a, "--nats-url=nats://metabus-nats.metabus:4222") || slices.ContainsFunc(a, func(s string) bool { return strings.HasPrefix(s, "--nats-ca") }) {
						t.Errorf("%s args %v: want a nats:// URL and no TLS flags", svc, a)
					}
				}
				// TestProfiles checks the profile's settings.
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
			reason: "TLS with generated certificates",
			values: "nats: {tls: {enabled: true}}",
			check: func(t *testing.T, objs map[string]map[string]any) {
				want := append([]string{"metabus-nats-ca", "nats-tls"}, clientSecrets...)
				sort.Strings(want)
				if diff := cmp.Diff(want, kinds(objs, "Secret")); diff != "" {
					t.Errorf("Secrets (-want +got):\n%s", diff)
				}
				for _, svc := range services {
					key := "Deployment/metabus-" + svc
					for _, w := range []string{"--nats-url=tls://metabus-nats.metabus:4222", "--nats-ca=/etc/metabus/nats-tls/ca.crt", "--nats-cert=/etc/metabus/nats-tls/tls.crt", "--nats-key=/etc/metabus/nats-tls/tls.key"} {
						if !slices.Contains(args(objs, key), w) {
							t.Errorf("%s lacks %s", svc, w)
						}
					}
					if !slices.Contains(secretVolumes(objs, key), "metabus-nats-"+svc+"-tls") {
						t.Errorf("%s does not mount metabus-nats-%s-tls: %v", svc, svc, secretVolumes(objs, key))
					}
				}
				if !slices.Contains(secretVolumes(objs, "StatefulSet/metabus-nats"), "nats-tls") {
					t.Error("the NATS StatefulSet does not mount nats-tls")
				}
				cm := mapping(objs["ConfigMap/metabus-nats-config"], "data")
				if cm["tls.conf"] != readFile(t, filepath.Join("nats", "tls.conf")) {
					t.Error("ConfigMap tls.conf is not nats/tls.conf")
				}
				cluster, _ := cm["cluster.conf"].(string)
				if !strings.HasPrefix(cluster, "include ./tls.conf") || !strings.Contains(cluster, `ca_file: "/etc/nats/tls/ca.crt"`) {
					t.Errorf("cluster.conf does not enable TLS for clients and routes:\n%s", cluster)
				}
				checkGeneratedCertificates(t, objs)
			},
		},
		{
			reason: "TLS from cert-manager",
			values: "nats: {tls: {enabled: true, certificates: cert-manager, certManager: {issuerRef: {name: ca-issuer}}}}",
			check: func(t *testing.T, objs map[string]map[string]any) {
				if got := kinds(objs, "Secret"); len(got) != 0 {
					t.Errorf("Secrets rendered though cert-manager issues them: %v", got)
				}
				want := append(slices.Clone(clientSecrets), "nats-tls")
				if diff := cmp.Diff(want, kinds(objs, "Certificate")); diff != "" {
					t.Errorf("Certificates (-want +got):\n%s", diff)
				}
				for _, name := range want {
					c := objs["Certificate/"+name]
					if str(c, "spec", "secretName") != name || str(c, "spec", "issuerRef", "name") != "ca-issuer" {
						t.Errorf("Certificate %s: secretName %q issuer %q", name, str(c, "spec", "secretName"), str(c, "spec", "issuerRef", "name"))
					}
				}
				if dns := stringList(slice(objs["Certificate/nats-tls"], "spec", "dnsNames")); !slices.Contains(dns, "*.metabus-nats-headless.metabus.svc") {
					t.Errorf("server certificate names %v lack the route addresses", dns)
				}
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
			wantErr: `nats.tls.certificates: "vault", want helm or cert-manager`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			values := map[string]any{}
			if tt.values != "" {
				docs, err := parseDocs([]byte(tt.values))
				if err != nil {
					t.Fatal(err)
				}
				values = docs[0]
			}
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

// checkGeneratedCertificates: the certificates Helm generates chain to the
// CA, name the client Service and every pod's route address, and work
// against a nats-server configured with the rendered tls.conf: the
// watcher's certificate connects, the CA the services get verifies the
// server.
func checkGeneratedCertificates(t *testing.T, objs map[string]map[string]any) {
	t.Helper()
	dir := t.TempDir()
	files := map[string][]byte{}
	for _, name := range []string{"nats-tls", "metabus-nats-watcher-tls"} {
		for k, v := range mapping(objs["Secret/"+name], "data") {
			data, err := base64.StdEncoding.DecodeString(v.(string))
			if err != nil {
				t.Fatalf("Secret %s %s: %v", name, k, err)
			}
			files[name+"/"+k] = data
			if err := os.MkdirAll(filepath.Join(dir, name), 0o700); err != nil {
				t.Fatal(err)
			}
			writeTestFile(t, filepath.Join(dir, name, k), data)
		}
	}
	block, _ := pem.Decode(files["nats-tls/tls.crt"])
	if block == nil {
		t.Fatal("nats-tls tls.crt is not PEM")
	}
	serverCert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(files["metabus-nats-watcher-tls/ca.crt"]) {
		t.Fatal("the watcher's ca.crt holds no certificate")
	}
	for _, host := range []string{"metabus-nats.metabus", "metabus-nats.metabus.svc", "metabus-nats-2.metabus-nats-headless.metabus.svc"} {
		if _, err := serverCert.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("server certificate for %s: %v", host, err)
		}
	}

	conf, _ := mapping(objs["ConfigMap/metabus-nats-config"], "data")["tls.conf"].(string)
	confPath := filepath.Join(dir, "tls.conf")
	writeTestFile(t, confPath, []byte(strings.ReplaceAll(conf, `"/etc/nats/tls/`, `"`+filepath.Join(dir, "nats-tls")+"/")))
	addr := startTLSServer(t, confPath, nil)
	// The Service's name, as the services dial it, instead of 127.0.0.1.
	nc, err := nats.Connect("tls://"+addr, nats.Secure(&tls.Config{ServerName: "metabus-nats.metabus", MinVersion: tls.VersionTLS12}),
		nats.RootCAs(filepath.Join(dir, "metabus-nats-watcher-tls", "ca.crt")),
		nats.ClientCert(filepath.Join(dir, "metabus-nats-watcher-tls", "tls.crt"), filepath.Join(dir, "metabus-nats-watcher-tls", "tls.key")),
		nats.Timeout(5*time.Second), nats.NoReconnect())
	if err != nil {
		t.Fatalf("the watcher's generated certificate against the generated server: %v", err)
	}
	nc.Close()
}
