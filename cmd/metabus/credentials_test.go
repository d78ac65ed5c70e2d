package main

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/internal/testing/kubeenv"
	"github.com/metabus/metabus/pkg/kubeapi"
	"github.com/metabus/metabus/pkg/natscreds"
	"github.com/metabus/metabus/pkg/natsx"
)

// runCredentials runs `metabus credentials args...` as the binary would and
// returns what it printed.
func runCredentials(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := credentialsCommand()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

// TestCredentialsArguments: what the command refuses before it talks to any
// cluster.
func TestCredentialsArguments(t *testing.T) {
	tests := []struct {
		reason string
		args   []string
		want   string
	}{
		{reason: "no subcommand", args: nil, want: "missing subcommand: want ensure or rotate"},
		{reason: "an unknown subcommand", args: []string{"make"}, want: `unknown command "make"`},
		{reason: "a stray argument", args: []string{"ensure", "now"}, want: `unknown command "now"`},
		{reason: "rotate without a service", args: []string{"rotate"}, want: "--service is required: one of watcher, dispatcher, applier, revisions"},
		{reason: "rotate of a service and a hook user at once", args: []string{"rotate", "--service", "applier", "--hook-user", "hello"}, want: "--service and --hook-user: give one"},
		{reason: "rotate of a hook user that is not a DNS label", args: []string{"rotate", "--hook-user", "Team_B"}, want: `--hook-user: hook user name "Team_B"`},
		{reason: "an unknown flag", args: []string{"ensure", "--force"}, want: "unknown flag: --force"},
		{reason: "a hook user that is not a DNS label", args: []string{"ensure", "--hook-user", "Team_B"}, want: `--hook-user: hook user name "Team_B"`},
		{reason: "a hook user twice", args: []string{"ensure", "--hook-user", "a", "--hook-user", "a"}, want: "--hook-user: hook user a is listed twice"},
		{reason: "hook-users without a user", args: []string{"hook-users", "--conf", "c", "--out", "o"}, want: "requires at least 1 arg"},
		{reason: "hook-users without --conf", args: []string{"hook-users", "--out", "o", "hello"}, want: "--conf and --out are required"},
		{reason: "hook-users with another hook's subject", args: []string{"hook-users", "--conf", "c", "--out", "o", "b:hooks.c.sync"}, want: `subject "hooks.c.sync" is not under hooks.b.`},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			out, err := runCredentials(t, tt.args...)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %v (output %q), want one containing %q", err, out, tt.want)
			}
		})
	}
}

// TestCredentialsAgainstAPIServer: ensure creates the five Secrets on a
// fresh namespace, a second run changes nothing, rotate replaces exactly one
// service's seed and public key.
func TestCredentialsAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a real kube-apiserver")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	env, err := kubeenv.Start(ctx, kubeenv.Options{NoControllerManager: true, Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	kube, err := kubeapi.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	const ns = "mb-creds"
	if err := kube.Create(ctx, kubeapi.Path(corev1.SchemeGroupVersion.WithResource("namespaces"), "", "", ""),
		&corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"}, ObjectMeta: metav1.ObjectMeta{Name: ns}}, nil); err != nil {
		t.Fatal(err)
	}
	store := natscreds.Store{Kube: kube, Namespace: ns}
	read := func() map[string]natscreds.Secret {
		t.Helper()
		have, err := store.Read(ctx, natscreds.Names(natscreds.Services))
		if err != nil {
			t.Fatal(err)
		}
		return have
	}

	out, err := runCredentials(t, "ensure", "--kubeconfig", env.Kubeconfig, "-n", ns, "--tls-service=mb-nats", "--tls-peers=mb-nats-headless")
	if err != nil {
		t.Fatalf("ensure: %v\n%s", err, out)
	}
	first := read()
	if len(first) != 5 {
		t.Fatalf("ensure made %d Secrets, want 5:\n%s", len(first), out)
	}
	certs, err := store.Read(ctx, natscreds.TLSNames(natscreds.Users))
	if err != nil {
		t.Fatal(err)
	}
	if len(certs) != len(natscreds.TLSNames(natscreds.Users)) {
		t.Fatalf("ensure made %d TLS Secrets, want %d:\n%s", len(certs), len(natscreds.TLSNames(natscreds.Users)), out)
	}
	serverCert := certs[natscreds.ServerTLSSecret].Data[natscreds.CertKey]
	if block, _ := pem.Decode(serverCert); block == nil {
		t.Errorf("server certificate is not PEM")
	} else if c, err := x509.ParseCertificate(block.Bytes); err != nil || c.VerifyHostname("mb-nats."+ns+".svc") != nil ||
		c.VerifyHostname("mb-nats-1.mb-nats-headless."+ns+".svc") != nil || c.VerifyHostname("127.0.0.1") != nil {
		t.Errorf("server certificate (%v) is not valid for the flags' Services: %v", err, c.DNSNames)
	}
	for name, s := range certs {
		if s.Labels[natsx.CredentialsLabel] != "true" {
			t.Errorf("%s lacks %s", name, natsx.CredentialsLabel)
		}
	}
	if strings.Contains(out, "PRIVATE KEY") {
		t.Errorf("ensure printed a private key")
	}
	for name, s := range first {
		if s.Labels[natsx.CredentialsLabel] != "true" {
			t.Errorf("%s lacks %s", name, natsx.CredentialsLabel)
		}
		if strings.Contains(out, string(s.Data[natscreds.SeedKey])) && len(s.Data[natscreds.SeedKey]) > 0 {
			t.Errorf("ensure printed the seed of %s", name)
		}
	}

	out, err = runCredentials(t, "ensure", "--kubeconfig", env.Kubeconfig, "-n", ns)
	if err != nil || !strings.Contains(out, "NATS credentials in namespace "+ns+" are complete: nothing to do") ||
		!strings.Contains(out, "NATS TLS certificates in namespace "+ns+" are complete: nothing to do") {
		t.Fatalf("second ensure: %v\n%s", err, out)
	}
	for name, s := range read() {
		if s.ResourceVersion != first[name].ResourceVersion {
			t.Errorf("second ensure wrote %s", name)
		}
	}
	if again, err := store.Read(ctx, natscreds.TLSNames(natscreds.Users)); err != nil || !maps.EqualFunc(again, certs, func(a, b natscreds.Secret) bool {
		return a.ResourceVersion == b.ResourceVersion
	}) {
		t.Errorf("second ensure rewrote TLS Secrets (%v)", err)
	}

	// A hook user declared later: its seed, public key and certificate are
	// added, nothing else is written, and a second run changes nothing.
	hook := natscreds.HookUserID("hello")
	out, err = runCredentials(t, "ensure", "--kubeconfig", env.Kubeconfig, "-n", ns, "--hook-user", "hello",
		"--tls-service=mb-nats", "--tls-peers=mb-nats-headless")
	if err != nil {
		t.Fatalf("ensure --hook-user: %v\n%s", err, out)
	}
	withHook, err := store.Read(ctx, natscreds.Names(append(append([]string(nil), natscreds.Services...), hook)))
	if err != nil {
		t.Fatal(err)
	}
	hookPub, err := natscreds.PublicKey(withHook[natscreds.HookSecret("hello")].Data[natscreds.SeedKey])
	if err != nil {
		t.Fatalf("the hook's seed Secret %s: %v\n%s", natscreds.HookSecret("hello"), err, out)
	}
	if got := string(withHook[natscreds.UsersSecret].Data["HOOK_HELLO_NKEY"]); got != hookPub {
		t.Errorf("users Secret's HOOK_HELLO_NKEY = %q, want the hook seed's %q", got, hookPub)
	}
	for _, svc := range natscreds.Services {
		if withHook[natscreds.SeedSecret(svc)].ResourceVersion != first[natscreds.SeedSecret(svc)].ResourceVersion {
			t.Errorf("ensure --hook-user rewrote %s", natscreds.SeedSecret(svc))
		}
	}
	if hookCert, err := store.Read(ctx, []string{natscreds.ClientTLSSecret(hook)}); err != nil || len(hookCert) != 1 {
		t.Errorf("the hook's client certificate %s: %v (%d Secrets)", natscreds.ClientTLSSecret(hook), err, len(hookCert))
	}
	out, err = runCredentials(t, "ensure", "--kubeconfig", env.Kubeconfig, "-n", ns, "--hook-user", "hello")
	if err != nil || !strings.Contains(out, "NATS credentials in namespace "+ns+" are complete: nothing to do") {
		t.Fatalf("second ensure --hook-user: %v\n%s", err, out)
	}
	if again, err := store.Read(ctx, []string{natscreds.HookSecret("hello")}); err != nil ||
		again[natscreds.HookSecret("hello")].ResourceVersion != withHook[natscreds.HookSecret("hello")].ResourceVersion {
		t.Errorf("second ensure --hook-user rewrote the hook's seed (%v)", err)
	}
	first = read() // the users Secret now holds the hook's key too

	// --tls=false (Helm with cert-manager, or TLS off): seeds only.
	const plain = "mb-creds-plain"
	if err := kube.Create(ctx, kubeapi.Path(corev1.SchemeGroupVersion.WithResource("namespaces"), "", "", ""),
		&corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"}, ObjectMeta: metav1.ObjectMeta{Name: plain}}, nil); err != nil {
		t.Fatal(err)
	}
	if out, err := runCredentials(t, "ensure", "--kubeconfig", env.Kubeconfig, "-n", plain, "--tls=false"); err != nil {
		t.Fatalf("ensure --tls=false: %v\n%s", err, out)
	}
	if made, err := (natscreds.Store{Kube: kube, Namespace: plain}).Read(ctx, natscreds.TLSNames(natscreds.Users)); err != nil || len(made) != 0 {
		t.Errorf("ensure --tls=false made TLS Secrets %v (%v)", made, err)
	}

	out, err = runCredentials(t, "rotate", "--service", "applier", "--kubeconfig", env.Kubeconfig, "-n", ns)
	if err != nil {
		t.Fatalf("rotate: %v\n%s", err, out)
	}
	if !strings.Contains(out, "rollout restart deployment -l app.kubernetes.io/component=applier") {
		t.Errorf("rotate does not say what to restart:\n%s", out)
	}
	after := read()
	for _, svc := range natscreds.Services {
		seedChanged := string(after[natscreds.SeedSecret(svc)].Data[natscreds.SeedKey]) != string(first[natscreds.SeedSecret(svc)].Data[natscreds.SeedKey])
		if seedChanged != (svc == "applier") {
			t.Errorf("%s seed changed: %v", svc, seedChanged)
		}
		pub, err := natscreds.PublicKey(after[natscreds.SeedSecret(svc)].Data[natscreds.SeedKey])
		if err != nil || string(after[natscreds.UsersSecret].Data[natscreds.UserKey(svc)]) != pub {
			t.Errorf("%s: users Secret key %q, seed's %q (%v)", svc, after[natscreds.UsersSecret].Data[natscreds.UserKey(svc)], pub, err)
		}
	}

	// A hook user's seed is rotated the same way; the services' seeds and
	// keys stay as they are.
	hookBefore, err := store.Read(ctx, []string{natscreds.HookSecret("hello")})
	if err != nil {
		t.Fatal(err)
	}
	out, err = runCredentials(t, "rotate", "--hook-user", "hello", "--kubeconfig", env.Kubeconfig, "-n", ns)
	if err != nil || !strings.Contains(out, natscreds.HookSecret("hello")) {
		t.Fatalf("rotate --hook-user: %v\n%s", err, out)
	}
	hookAfter, err := store.Read(ctx, []string{natscreds.HookSecret("hello")})
	if err != nil {
		t.Fatal(err)
	}
	newSeed := hookAfter[natscreds.HookSecret("hello")].Data[natscreds.SeedKey]
	if string(newSeed) == string(hookBefore[natscreds.HookSecret("hello")].Data[natscreds.SeedKey]) {
		t.Errorf("rotate --hook-user kept the hook's seed")
	}
	rotated := read()
	if pub, err := natscreds.PublicKey(newSeed); err != nil || string(rotated[natscreds.UsersSecret].Data["HOOK_HELLO_NKEY"]) != pub {
		t.Errorf("users Secret's HOOK_HELLO_NKEY = %q, want the new seed's %q (%v)", rotated[natscreds.UsersSecret].Data["HOOK_HELLO_NKEY"], pub, err)
	}
	for _, svc := range natscreds.Services {
		if string(rotated[natscreds.SeedSecret(svc)].Data[natscreds.SeedKey]) != string(after[natscreds.SeedSecret(svc)].Data[natscreds.SeedKey]) ||
			string(rotated[natscreds.UsersSecret].Data[natscreds.UserKey(svc)]) != string(after[natscreds.UsersSecret].Data[natscreds.UserKey(svc)]) {
			t.Errorf("rotate --hook-user changed %s's seed or key", svc)
		}
	}
}

// TestCredentialsHookUsers: hook-users writes the component
// natscreds.HookUsersComponent makes of the given nats-server.conf (which
// deploy's TestKustomizeHookUsers builds with kustomize), and refuses a
// configuration without the hook users' line, writing nothing.
func TestCredentialsHookUsers(t *testing.T) {
	conf := filepath.Join("..", "..", "deploy", "nats", "nats-server.conf")
	out := filepath.Join(t.TempDir(), "hook-users")
	if msg, err := runCredentials(t, "hook-users", "--conf", conf, "--out", out, "hello", "team-b:hooks.team-b.sync,hooks.team-b.finalize"); err != nil {
		t.Fatalf("hook-users: %v\n%s", err, msg)
	}
	data, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	want, err := natscreds.HookUsersComponent(string(data), []natscreds.HookUser{{Name: "hello"},
		{Name: "team-b", Subjects: []string{"hooks.team-b.sync", "hooks.team-b.finalize"}}})
	if err != nil {
		t.Fatal(err)
	}
	for name, w := range want {
		got, err := os.ReadFile(filepath.Join(out, name))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(string(w), string(got)); diff != "" {
			t.Errorf("%s (-want +got):\n%s", name, diff)
		}
	}
	bad := filepath.Join(t.TempDir(), "no-marker.conf")
	if err := os.WriteFile(bad, []byte("authorization { users = [\n] }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(t.TempDir(), "out")
	if _, err := runCredentials(t, "hook-users", "--conf", bad, "--out", empty, "hello"); err == nil || !strings.Contains(err.Error(), "@hook-users") {
		t.Errorf("a configuration without the marker: err %v", err)
	}
	if _, err := os.Stat(empty); !os.IsNotExist(err) {
		t.Errorf("a refused run wrote %s (%v)", empty, err)
	}
}
