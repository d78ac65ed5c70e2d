package deploy

import (
	"bufio"
	"crypto/tls"
	"flag"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/internal/testing/testnats"
	"github.com/metabus/metabus/internal/testing/testpki"
	"github.com/metabus/metabus/pkg/cli"
	"github.com/metabus/metabus/pkg/natscreds"
	"github.com/metabus/metabus/pkg/natsx"
)

// issue writes <dir>/<name>.crt and .key, a certificate of ca, and returns
// their paths.
func issue(t *testing.T, ca *testpki.CA, dir, name string, ips ...net.IP) (certFile, keyFile string) {
	t.Helper()
	cert, key := ca.Issue(t, name, ips...)
	certFile, keyFile = filepath.Join(dir, name+".crt"), filepath.Join(dir, name+".key")
	writeTestFile(t, certFile, cert)
	writeTestFile(t, keyFile, key)
	return certFile, keyFile
}

func writeTestFile(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestNATSTLS (issue #14): a nats-server loaded with the shipped
// nats/tls.conf (what the Helm chart's nats.tls.enabled includes) rejects a
// client without TLS, without a client certificate of its CA, or without its
// nkey, and accepts a service connecting with the flags the chart passes
// (--nats-url tls://..., --nats-ca, --nats-cert, --nats-key, --nats-nkey).
func TestNATSTLS(t *testing.T) {
	dir := t.TempDir()
	ca := testpki.NewCA(t, "metabus-nats-ca")
	caFile := filepath.Join(dir, "ca.crt")
	writeTestFile(t, caFile, ca.PEM)
	serverCert, serverKey := issue(t, ca, dir, "tls", net.ParseIP("127.0.0.1"))
	if serverCert != filepath.Join(dir, "tls.crt") || serverKey != filepath.Join(dir, "tls.key") {
		t.Fatal("unexpected certificate paths")
	}
	clientCert, clientKey := issue(t, ca, dir, "metabus-watcher")
	strangerCert, strangerKey := issue(t, testpki.NewCA(t, "another-ca"), dir, "stranger")

	// The shipped tls.conf, with the Secret's mount point moved to dir.
	conf := readFile(t, filepath.Join("nats", "tls.conf"))
	if !strings.Contains(conf, `"/etc/nats/tls/`) {
		t.Fatal("nats/tls.conf no longer reads /etc/nats/tls/ (the chart's mount of Secret nats-tls)")
	}
	confPath := filepath.Join(dir, "tls.conf")
	writeTestFile(t, confPath, []byte(strings.ReplaceAll(conf, `"/etc/nats/tls/`, `"`+dir+"/")))
	opts, err := server.ProcessConfigFile(confPath)
	if err != nil {
		t.Fatalf("load nats/tls.conf: %v", err)
	}
	if opts.TLSConfig == nil || opts.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert {
		t.Fatalf("nats/tls.conf: TLS %v, client certificates required: %v; want both", opts.TLSConfig != nil, opts.TLSConfig != nil && opts.TLSConfig.ClientAuth == tls.RequireAndVerifyClientCert)
	}
	pub, seedFile := testnats.NewUser(t, dir, "watcher")
	addr := startTLSServer(t, confPath, func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: pub}} })
	nkey, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}

	// A client that does not speak TLS: the server announces tls_required
	// and answers a plaintext CONNECT by closing, never with a PONG.
	t.Run("rejects a plaintext client", func(t *testing.T) {
		conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
		r := bufio.NewReader(conn)
		info, err := r.ReadString('\n')
		if err != nil || !strings.Contains(info, `"tls_required":true`) {
			t.Fatalf("INFO %q (%v), want tls_required", info, err)
		}
		if _, err := conn.Write([]byte("CONNECT {\"verbose\":false}\r\nPING\r\n")); err != nil {
			t.Fatal(err)
		}
		rest, _ := io.ReadAll(r)
		if strings.Contains(string(rest), "PONG") {
			t.Fatalf("the server answered a plaintext client: %q", rest)
		}
	})

	rejected := []struct {
		reason string
		opts   []nats.Option
		want   string
	}{
		// The handshake fails on the server's side ("certificate required",
		// or the connection closed under the client's next write).
		{reason: "TLS without a client certificate, with the nkey", opts: []nats.Option{nkey, nats.RootCAs(caFile)}, want: "tls"},
		{reason: "a client certificate of another CA, with the nkey", opts: []nats.Option{nkey, nats.RootCAs(caFile), nats.ClientCert(strangerCert, strangerKey)}, want: "tls"},
		{reason: "TLS and the client certificate, without the nkey", opts: []nats.Option{nats.RootCAs(caFile), nats.ClientCert(clientCert, clientKey)}, want: "Authorization Violation"},
	}
	for _, tt := range rejected {
		t.Run("rejects "+tt.reason, func(t *testing.T) {
			nc, err := nats.Connect("tls://"+addr, append(tt.opts, nats.Timeout(5*time.Second), nats.NoReconnect())...)
			if err == nil {
				nc.Close()
				t.Fatal("connected")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("refused with %q, want %q", err, tt.want)
			}
		})
	}

	t.Run("accepts a service with its flags", func(t *testing.T) {
		var f cli.NATSFlags
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		f.Register(fs)
		if err := fs.Parse([]string{
			"--nats-url=tls://" + addr, "--nats-nkey=" + seedFile,
			"--nats-ca=" + caFile, "--nats-cert=" + clientCert, "--nats-key=" + clientKey,
		}); err != nil {
			t.Fatal(err)
		}
		nc, js, err := natsx.Connect(f.Options("metabus-watcher"))
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		defer nc.Close()
		state, err := nc.TLSConnectionState()
		if err != nil || !state.HandshakeComplete {
			t.Errorf("connection is not TLS: %v", err)
		}
		if js == nil || nc.Flush() != nil {
			t.Error("the connection does not work")
		}
	})
}

// startTLSServer runs a nats-server on a loopback port loaded from the
// configuration file conf (TLS paths already pointing at test files), with
// adjust applied to its options, and returns its address.
func startTLSServer(t *testing.T, conf string, adjust func(*server.Options)) string {
	t.Helper()
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("load %s: %v", conf, err)
	}
	opts.Host, opts.Port = "127.0.0.1", -1
	if adjust != nil {
		adjust(opts)
	}
	return testnats.Serve(t, opts).Addr().String()
}

// kustomizePlaintext is the overlay that turns NATS TLS off.
const kustomizePlaintext = "overlays/plaintext"

// loadRenderedNATSConfig writes the files of the NATS ConfigMap of a
// kustomize build into a directory, with the server certificate's mount
// point moved to certificates the generator made there, and loads them as
// nats-server would (the users' public keys and the pod name from the
// environment, as the StatefulSet passes them).
func loadRenderedNATSConfig(t *testing.T, objs []map[string]any) *server.Options {
	t.Helper()
	var data map[string]any
	for _, o := range objs {
		if str(o, "kind") == "ConfigMap" && strings.HasPrefix(str(o, "metadata", "name"), "nats-config") {
			data = mapping(o, "data")
		}
	}
	if data == nil {
		t.Fatal("no NATS ConfigMap")
	}
	dir := t.TempDir()
	plan, err := natscreds.EnsureTLS(natscreds.TLSSpec{Users: natscreds.Users, ServerDNS: natscreds.ServerDNSNames("nats", "nats-headless", "metabus"),
		Validity: time.Hour, Now: time.Now()}, map[string]natscreds.Secret{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range plan {
		if a.Secret.Name != natscreds.ServerTLSSecret {
			continue
		}
		if err := os.MkdirAll(filepath.Join(dir, "tls"), 0o700); err != nil {
			t.Fatal(err)
		}
		for k, v := range a.Secret.Data {
			writeTestFile(t, filepath.Join(dir, "tls", k), v)
		}
	}
	for name, text := range data {
		writeTestFile(t, filepath.Join(dir, name), []byte(strings.ReplaceAll(text.(string), `"/etc/nats/tls/`, `"`+filepath.Join(dir, "tls")+"/")))
	}
	t.Setenv("POD_NAME", "nats-0")
	for _, u := range natscreds.Users {
		pub, _ := testnats.NewUser(t, dir, u)
		t.Setenv(natscreds.UserKey(u), pub)
	}
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "nats-server.conf"))
	if err != nil {
		t.Fatalf("load the rendered nats-server.conf: %v", err)
	}
	return opts
}

// TestKustomizeNATSTLS (issue #32): `kubectl apply -k deploy/` runs NATS with
// TLS and client certificates on clients and routes, with the certificates
// the init container makes, and every service connects with them
// (TestKustomize checks each service's flags and mounts);
// deploy/overlays/plaintext turns it off, and changes nothing else.
func TestKustomizeNATSTLS(t *testing.T) {
	def, err := kustomizeBuild(kustomizeDefault)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := kustomizeBuild(kustomizePlaintext)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("default: TLS on clients and routes, client certificates required", func(t *testing.T) {
		opts := loadRenderedNATSConfig(t, def)
		if opts.TLSConfig == nil || opts.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert {
			t.Errorf("clients: TLS %v, want TLS with verified client certificates", opts.TLSConfig != nil)
		}
		if opts.Cluster.TLSConfig == nil || opts.Cluster.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert {
			t.Errorf("routes: TLS %v, want TLS with verified certificates", opts.Cluster.TLSConfig != nil)
		}
		if len(opts.Routes) != 3 {
			t.Errorf("%d routes, want 3", len(opts.Routes))
		}
		sts := find(def, "StatefulSet", "nats")
		if v := volumeSecretAt(mapping(sts, "spec", "template", "spec"), "nats", "/etc/nats/tls"); v != natscreds.ServerTLSSecret {
			t.Errorf("nats-server mounts %q at /etc/nats/tls, want %s", v, natscreds.ServerTLSSecret)
		}
	})

	t.Run("plaintext overlay: no TLS anywhere", func(t *testing.T) {
		opts := loadRenderedNATSConfig(t, plain)
		if opts.TLSConfig != nil || opts.Cluster.TLSConfig != nil {
			t.Errorf("TLS on clients %v, routes %v; want neither", opts.TLSConfig != nil, opts.Cluster.TLSConfig != nil)
		}
		if len(opts.Routes) != 3 {
			t.Errorf("%d routes, want 3", len(opts.Routes))
		}
		for _, svc := range services {
			a := containerArgs(t, plain, "metabus-"+svc)
			if !slices.Contains(a, "--nats-url=nats://nats.metabus:4222") || slices.ContainsFunc(a, func(s string) bool { return strings.HasPrefix(s, "--nats-c") || strings.HasPrefix(s, "--nats-key") }) {
				t.Errorf("%s args %v: want nats:// and no TLS flags", svc, a)
			}
		}
	})

	// Last: it rewrites the objects it compares.
	t.Run("plaintext overlay changes only the NATS URL, the TLS flags and config", func(t *testing.T) {
		normalize := func(objs []map[string]any) map[string]map[string]any {
			out := map[string]map[string]any{}
			for _, o := range objs {
				name := str(o, "metadata", "name")
				switch str(o, "kind") {
				case "ConfigMap":
					if strings.HasPrefix(name, "nats-config") {
						name = "nats-config"
						o["metadata"].(map[string]any)["name"] = name
						delete(o, "data")
					}
				case "StatefulSet":
					vols, _, _ := unstructured.NestedFieldNoCopy(o, "spec", "template", "spec", "volumes")
					for _, v := range vols.([]any) {
						if cm, ok := v.(map[string]any)["configMap"].(map[string]any); ok {
							cm["name"] = "nats-config"
						}
					}
				case "Deployment":
					cs, _, _ := unstructured.NestedFieldNoCopy(o, "spec", "template", "spec", "containers")
					c := cs.([]any)[0].(map[string]any)
					var kept []any
					for _, a := range slice(c, "args") {
						s := strings.Replace(a.(string), "--nats-url=tls://", "--nats-url=nats://", 1)
						if !strings.HasPrefix(s, "--nats-ca=") && !strings.HasPrefix(s, "--nats-cert=") && !strings.HasPrefix(s, "--nats-key=") {
							kept = append(kept, s)
						}
					}
					c["args"] = kept
				}
				out[str(o, "kind")+"/"+name] = o
			}
			return out
		}
		if diff := cmp.Diff(normalize(def), normalize(plain)); diff != "" {
			t.Errorf("deploy/ and overlays/plaintext differ beyond TLS (-default +plaintext):\n%s", diff)
		}
	})
}
