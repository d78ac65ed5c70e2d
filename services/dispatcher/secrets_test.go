package dispatcher

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/hooks"
	"github.com/metabus/metabus/pkg/kubeapi"
	"github.com/metabus/metabus/pkg/natscreds"
	"github.com/metabus/metabus/pkg/natsx"
)

func TestSecretNamespacesFlag(t *testing.T) {
	type result struct {
		Namespaces []string
		Err        bool
	}
	tests := []struct {
		reason string
		args   []string
		want   result
	}{
		{reason: "unset: every namespace, as upstream (nil list)", want: result{}},
		{reason: "a comma-separated list", args: []string{"--secret-namespaces=team-a, team-b"}, want: result{Namespaces: []string{"team-a", "team-b"}}},
		{reason: "repeated flags add up", args: []string{"--secret-namespaces=team-a", "--secret-namespaces=team-b"}, want: result{Namespaces: []string{"team-a", "team-b"}}},
		{reason: "* for all", args: []string{"--secret-namespaces=*"}, want: result{Namespaces: []string{"*"}}},
		{reason: "an empty value: the own namespace only (the hardened profile)", args: []string{"--secret-namespaces="}, want: result{Namespaces: []string{}}},
		{reason: "an invalid namespace name is rejected", args: []string{"--secret-namespaces=Team_A"}, want: result{Err: true}},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			cfg, err := parseFlags(tt.args)
			got := result{Namespaces: cfg.SecretNamespaces, Err: err != nil}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestHookCredentialSecretsFlag(t *testing.T) {
	type result struct {
		Names []string
		Err   string
	}
	tests := []struct {
		reason string
		args   []string
		want   result
	}{
		{reason: "unset: no Secret of the own namespace", want: result{}},
		{reason: "a comma-separated list, repeatable", args: []string{"--hook-credential-secrets=hook-token, hook-tls", "--hook-credential-secrets=hook-basic"},
			want: result{Names: []string{"hook-token", "hook-tls", "hook-basic"}}},
		{reason: "a NATS seed is never allowed", args: []string{"--hook-credential-secrets=metabus-nats-dispatcher"},
			want: result{Err: "holds metabus's own NATS credentials"}},
		{reason: "the NATS TLS material is never allowed", args: []string{"--hook-credential-secrets=" + natscreds.ServerTLSSecret},
			want: result{Err: "holds metabus's own NATS credentials"}},
		{reason: "the NATS CA is never allowed", args: []string{"--hook-credential-secrets=" + natscreds.CASecret},
			want: result{Err: "holds metabus's own NATS credentials"}},
		{reason: "a Helm release is never allowed", args: []string{"--hook-credential-secrets=sh.helm.release.v1.metabus.v1"},
			want: result{Err: "is a Helm release"}},
		{reason: "an invalid name is rejected", args: []string{"--hook-credential-secrets=Hook_Token"}, want: result{Err: "invalid Secret name"}},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			cfg, err := parseFlags(tt.args)
			got := result{Names: cfg.HookCredentialSecrets}
			if err != nil {
				got = result{Err: tt.want.Err}
				if !strings.Contains(err.Error(), tt.want.Err) || tt.want.Err == "" {
					got.Err = err.Error()
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestOwnNamespace(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "")
	if got := ownNamespace(); got != "metabus" {
		t.Errorf("without POD_NAMESPACE: %q, want metabus", got)
	}
	t.Setenv("POD_NAMESPACE", "platform")
	if got := ownNamespace(); got != "platform" {
		t.Errorf("with POD_NAMESPACE=platform: %q, want platform", got)
	}
	var cfg Config
	cfg.Defaults()
	if cfg.Namespace != "platform" {
		t.Errorf("Config.Defaults: Namespace %q, want platform", cfg.Namespace)
	}
}

// The dispatcher's hook client, wired as New wires it, against a fake API server: a webhook
// referencing a Secret outside the allowed namespaces is refused with an error naming the
// namespace and the flag, the Secret is never read from the API, and the hook receives nothing.
func TestSecretScopeRefusesBeforeReading(t *testing.T) {
	var hookRequests atomic.Int64
	hook := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hookRequests.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	}))
	t.Cleanup(hook.Close)
	ca := string(certPEM(hook))

	secret := func(ns string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hook-token"}, Data: map[string][]byte{"token": []byte("tok-" + ns)}}
	}
	type result struct {
		// Reads are the API reads ("get secrets team-b/hook-token").
		Reads        []string
		HookRequests int64
		Refused      bool
	}
	tests := []struct {
		reason     string
		own        string
		flag       []string
		ownSecrets []string
		secretNS   string
		want       result
		errSubstr  []string
	}{
		{
			reason: "by default a Secret in another namespace is read and sent, as upstream",
			own:    "metabus", secretNS: "team-b",
			want: result{Reads: []string{"get secrets team-b/hook-token"}, HookRequests: 1},
		},
		{
			reason: "own namespace only: a Secret in another namespace is refused, never read",
			own:    "metabus", flag: []string{}, secretNS: "team-b",
			want:      result{Refused: true},
			errSubstr: []string{`Secret team-b/hook-token`, `namespace "team-b"`, "(metabus)", "--secret-namespaces=team-b", "dispatcher.secretNamespaces"},
		},
		{
			reason: "own namespace only: a Secret of the own namespace the operator did not list is refused, never read",
			own:    "metabus", flag: []string{}, secretNS: "metabus",
			want:      result{Refused: true},
			errSubstr: []string{"Secret metabus/hook-token is in metabus's own namespace", "--hook-credential-secrets", "dispatcher.hookCredentialSecrets"},
		},
		{
			reason: "all namespaces (upstream's default): the own namespace's unlisted Secrets are refused all the same",
			own:    "metabus", secretNS: "metabus",
			want:      result{Refused: true},
			errSubstr: []string{"--hook-credential-secrets"},
		},
		{
			reason: "own namespace only: a Secret of the own namespace the operator listed is read and sent",
			own:    "metabus", flag: []string{}, ownSecrets: []string{"hook-token"}, secretNS: "metabus",
			want: result{Reads: []string{"get secrets metabus/hook-token"}, HookRequests: 1},
		},
		{
			reason: "the own namespace follows POD_NAMESPACE, not the literal metabus",
			own:    "platform", flag: []string{}, secretNS: "metabus",
			want:      result{Refused: true},
			errSubstr: []string{`namespace "metabus"`, "(platform)"},
		},
		{
			reason: "a namespace listed in --secret-namespaces is read",
			own:    "metabus", flag: []string{"team-a", "team-b"}, secretNS: "team-b",
			want: result{Reads: []string{"get secrets team-b/hook-token"}, HookRequests: 1},
		},
		{
			reason: "a namespace not listed in --secret-namespaces is refused, the list is named",
			own:    "metabus", flag: []string{"team-a"}, secretNS: "team-b",
			want:      result{Refused: true},
			errSubstr: []string{"(metabus, team-a)"},
		},
		{
			reason: "* allows every namespace",
			own:    "metabus", flag: []string{"*"}, secretNS: "team-b",
			want: result{Reads: []string{"get secrets team-b/hook-token"}, HookRequests: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			kube := newFakeCore(t, secret("metabus"), secret("team-b"))
			scope := newSecretScope(tt.own, tt.flag)
			scope.ownSecrets = tt.ownSecrets
			c := hooks.New(hooks.Options{Secrets: kubeSecrets{kube: kube.api, scope: scope}, SecretNamespaceAllowed: scope.check, SecretAllowed: scope.checkSecretName})
			before := hookRequests.Load()
			err := c.Do(context.Background(), hooks.Call{
				Hook: &v1alpha1.Hook{Webhook: &v1alpha1.Webhook{URL: &hook.URL, WebhookAuth: v1alpha1.WebhookAuth{
					CABundle:      &v1alpha1.CABundle{Inline: &ca},
					Authorization: &v1alpha1.Authorization{SecretRef: v1alpha1.KeySelector{Namespace: tt.secretNS, Name: "hook-token"}},
				}}},
				Kind: "sync", ControllerType: "CompositeController", ControllerName: "demo",
				Request: map[string]any{},
			}, nil)
			var refused *hooks.RefusedError
			got := result{HookRequests: hookRequests.Load() - before, Refused: errors.As(err, &refused)}
			got.Reads = kube.requests()
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s\nerr: %v", diff, err)
			}
			if !got.Refused && err != nil {
				t.Errorf("Do: %v", err)
			}
			for _, s := range tt.errSubstr {
				if err == nil || !strings.Contains(err.Error(), s) {
					t.Errorf("err = %v, want it to contain %q", err, s)
				}
			}
		})
	}
}

// kubeSecrets enforces the scope itself too, should anything call it directly.
func TestKubeSecretsEnforcesScope(t *testing.T) {
	kube := newFakeCore(t,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "s"}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "c"}},
	)
	k := kubeSecrets{kube: kube.api, scope: newSecretScope("metabus", []string{})}
	if _, err := k.Secret(context.Background(), "team-b", "s"); err == nil {
		t.Error("Secret outside the scope: no error")
	}
	if _, err := k.ConfigMap(context.Background(), "team-b", "c"); err == nil {
		t.Error("ConfigMap outside the scope: no error")
	}
	if n := len(kube.requests()); n != 0 {
		t.Errorf("%d API calls, want none", n)
	}
}

// TestOwnCredentialsRefused: metabus's own NATS credentials are never a hook credential,
// whatever the namespaces allow: a Secret in the own namespace named like them is refused
// without a read, and one labelled as them anywhere is refused after it (its data is dropped).
func TestOwnCredentialsRefused(t *testing.T) {
	seed := map[string][]byte{"nkey.seed": []byte("SUAMSEED")}
	kube := newFakeCore(t,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "metabus", Name: natsx.CredentialsSecretPrefix + "applier"}, Data: seed},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "copied",
			Labels: map[string]string{natsx.CredentialsLabel: "applier"}}, Data: seed},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: natsx.CredentialsSecretPrefix + "mine"}, Data: map[string][]byte{"token": []byte("t")}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "metabus", Name: "listed"}, Data: map[string][]byte{"token": []byte("t")}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "metabus", Name: "listed-labelled", Labels: map[string]string{natsx.CredentialsLabel: "true"}}, Data: seed},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "metabus", Name: "listed-sa-token"}, Type: corev1.SecretTypeServiceAccountToken, Data: seed},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "renamed-release"}, Type: helmReleaseType, Data: seed},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "sa-token"}, Type: corev1.SecretTypeServiceAccountToken, Data: map[string][]byte{"token": []byte("t")}},
	)
	type result struct {
		Data  map[string][]byte
		Err   string
		Reads []string
	}
	type testCase struct {
		reason    string
		scope     []string
		namespace string
		name      string
		want      result
	}
	tests := []testCase{
		{
			reason: "a seed in the own namespace, all namespaces allowed: refused before reading", namespace: "metabus", name: natsx.CredentialsSecretPrefix + "applier",
			want: result{Err: "Secret metabus/metabus-nats-applier holds metabus's own NATS credentials"},
		},
		{
			reason: "the same under the hardened scope", scope: []string{}, namespace: "metabus", name: natsx.CredentialsSecretPrefix + "applier",
			want: result{Err: "Secret metabus/metabus-nats-applier holds metabus's own NATS credentials"},
		},
		{
			reason: "a labelled copy in another namespace: refused, its data dropped", namespace: "team-b", name: "copied",
			want: result{Err: "Secret team-b/copied holds metabus's own NATS credentials", Reads: []string{"get secrets team-b/copied"}},
		},
		{
			reason: "the prefix alone means nothing outside the own namespace", namespace: "team-b", name: natsx.CredentialsSecretPrefix + "mine",
			want: result{Data: map[string][]byte{"token": []byte("t")}, Reads: []string{"get secrets team-b/metabus-nats-mine"}},
		},
		{
			reason: "an unlisted Secret of the own namespace: refused before reading", namespace: "metabus", name: "other",
			want: result{Err: "Secret metabus/other is in metabus's own namespace, whose Secrets are never sent to a hook unless the operator lists them"},
		},
		{
			reason: "a listed Secret of the own namespace: read", namespace: "metabus", name: "listed",
			want: result{Data: map[string][]byte{"token": []byte("t")}, Reads: []string{"get secrets metabus/listed"}},
		},
		{
			reason: "a listed Secret labelled as NATS credentials: refused, its data dropped", namespace: "metabus", name: "listed-labelled",
			want: result{Err: "Secret metabus/listed-labelled holds metabus's own NATS credentials", Reads: []string{"get secrets metabus/listed-labelled"}},
		},
		{
			reason: "a listed ServiceAccount token of the own namespace: refused, its data dropped", namespace: "metabus", name: "listed-sa-token",
			want: result{Err: "Secret metabus/listed-sa-token is a ServiceAccount token of metabus's own namespace and is never sent to a hook",
				Reads: []string{"get secrets metabus/listed-sa-token"}},
		},
		{
			reason: "a ServiceAccount token elsewhere is the tenant's business, as upstream", namespace: "team-b", name: "sa-token",
			want: result{Data: map[string][]byte{"token": []byte("t")}, Reads: []string{"get secrets team-b/sa-token"}},
		},
		{
			reason: "Helm's release Secret of the own namespace: refused before reading", namespace: "metabus", name: "sh.helm.release.v1.metabus.v1",
			want: result{Err: "Secret metabus/sh.helm.release.v1.metabus.v1 is a Helm release"},
		},
		{
			reason: "a Helm release in any namespace: refused before reading", namespace: "team-b", name: "sh.helm.release.v1.app.v3",
			want: result{Err: "Secret team-b/sh.helm.release.v1.app.v3 is a Helm release"},
		},
		{
			reason: "a Helm release by its type under another name: refused, its data dropped", namespace: "team-b", name: "renamed-release",
			want: result{Err: "Secret team-b/renamed-release is a Helm release", Reads: []string{"get secrets team-b/renamed-release"}},
		},
	}
	// The NATS CA (its private key included) and the TLS certificates the
	// credential generator makes are credentials too (issue #32).
	for _, name := range natscreds.TLSNames(natscreds.Users) {
		tests = append(tests, testCase{
			reason: "NATS TLS material " + name + ": refused before reading", namespace: "metabus", name: name,
			want: result{Err: "Secret metabus/" + name + " holds metabus's own NATS credentials"},
		})
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			before := len(kube.requests())
			scope := newSecretScope("metabus", tt.scope)
			scope.ownSecrets = []string{"listed", "listed-labelled", "listed-sa-token"}
			k := kubeSecrets{kube: kube.api, scope: scope}
			data, err := k.Secret(context.Background(), tt.namespace, tt.name)
			got := result{Data: data, Reads: kube.requests()[before:]}
			if err != nil {
				got.Err, _, _ = strings.Cut(err.Error(), " (")
			}
			if len(got.Reads) == 0 {
				got.Reads = nil
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// kubeSecrets reads the data of a Secret or ConfigMap with one GET, and says which object it
// could not read.
func TestKubeSecretsReads(t *testing.T) {
	kube := newFakeCore(t,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "metabus", Name: "s"}, Data: map[string][]byte{"token": []byte("t0k")}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "metabus", Name: "c"}, Data: map[string]string{"ca.crt": "pem"}},
	)
	scope := newSecretScope("metabus", nil)
	scope.ownSecrets = []string{"s", "gone"}
	k := kubeSecrets{kube: kube.api, scope: scope}
	type result struct {
		Secret    map[string][]byte
		ConfigMap map[string]string
		Errs      []string
		NotFound  []bool
		Reads     []string
	}
	var got result
	var err error
	got.Secret, err = k.Secret(context.Background(), "metabus", "s")
	if err != nil {
		t.Fatal(err)
	}
	got.ConfigMap, err = k.ConfigMap(context.Background(), "metabus", "c")
	if err != nil {
		t.Fatal(err)
	}
	for _, read := range []func() error{
		func() error { _, err := k.Secret(context.Background(), "metabus", "gone"); return err },
		func() error { _, err := k.ConfigMap(context.Background(), "metabus", "gone"); return err },
	} {
		err := read()
		got.Errs = append(got.Errs, strings.SplitN(fmt.Sprint(err), ":", 2)[0])
		got.NotFound = append(got.NotFound, apierrors.IsNotFound(err))
	}
	got.Reads = kube.requests()
	want := result{
		Secret:    map[string][]byte{"token": []byte("t0k")},
		ConfigMap: map[string]string{"ca.crt": "pem"},
		Errs:      []string{"read secret metabus/gone", "read configmap metabus/gone"},
		NotFound:  []bool{true, true},
		Reads:     []string{"get secrets metabus/s", "get configmaps metabus/c", "get secrets metabus/gone", "get configmaps metabus/gone"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// fakeCore is an API server holding core objects: it answers GETs of their paths and
// records every request as "<verb> <resource> <namespace>/<name>".
type fakeCore struct {
	api  *kubeapi.Client
	mu   sync.Mutex
	reqs []string
}

func newFakeCore(t *testing.T, objs ...metav1.Object) *fakeCore {
	t.Helper()
	byPath := map[string]metav1.Object{}
	for _, o := range objs {
		gvr := secretsGVR
		if _, ok := o.(*corev1.ConfigMap); ok {
			gvr = configMapsGVR
		}
		byPath[path.Join(kubeapi.Path(gvr, o.GetNamespace(), o.GetName(), "")...)] = o
	}
	f := &fakeCore{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// /api/v1/namespaces/<ns>/<resource>/<name>
		p := strings.Split(strings.TrimPrefix(r.URL.Path, "/api/v1/namespaces/"), "/")
		if len(p) == 3 {
			f.mu.Lock()
			f.reqs = append(f.reqs, strings.ToLower(r.Method)+" "+p[1]+" "+p[0]+"/"+p[2])
			f.mu.Unlock()
		}
		w.Header().Set("Content-Type", "application/json")
		o, ok := byPath[r.URL.Path]
		if r.Method != http.MethodGet || !ok {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status: metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound})
			return
		}
		_ = json.NewEncoder(w).Encode(o)
	}))
	t.Cleanup(srv.Close)
	api, err := kubeapi.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	f.api = api
	return f
}

func (f *fakeCore) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.reqs)
}

func certPEM(s *httptest.Server) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})
}

// parseFlags is the dispatcher's Config after parsing args as its flags.
func parseFlags(args []string) (Config, error) {
	var cfg Config
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(&strings.Builder{})
	cfg.RegisterFlags(fs)
	err := fs.Parse(args)
	return cfg, err
}
