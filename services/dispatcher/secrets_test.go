package dispatcher

import (
	"context"
	"encoding/pem"
	"errors"
	"flag"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/hooks"
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
		{reason: "unset: only the own namespace (nil list)", want: result{}},
		{reason: "a comma-separated list", args: []string{"--secret-namespaces=team-a, team-b"}, want: result{Namespaces: []string{"team-a", "team-b"}}},
		{reason: "repeated flags add up", args: []string{"--secret-namespaces=team-a", "--secret-namespaces=team-b"}, want: result{Namespaces: []string{"team-a", "team-b"}}},
		{reason: "* for all", args: []string{"--secret-namespaces=*"}, want: result{Namespaces: []string{"*"}}},
		{reason: "an empty value allows nothing more", args: []string{"--secret-namespaces="}, want: result{}},
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
		reason    string
		own       string
		flag      []string
		secretNS  string
		want      result
		errSubstr []string
	}{
		{
			reason: "by default a Secret in another namespace is refused, never read",
			own:    "metabus", secretNS: "team-b",
			want:      result{Refused: true},
			errSubstr: []string{`Secret team-b/hook-token`, `namespace "team-b"`, "(metabus)", "--secret-namespaces=team-b", "dispatcher.secretNamespaces"},
		},
		{
			reason: "by default a Secret in the own namespace is read and sent",
			own:    "metabus", secretNS: "metabus",
			want: result{Reads: []string{"get secrets metabus/hook-token"}, HookRequests: 1},
		},
		{
			reason: "the own namespace follows POD_NAMESPACE, not the literal metabus",
			own:    "platform", secretNS: "metabus",
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
			kube := fake.NewClientset(secret("metabus"), secret("team-b"))
			scope := newSecretScope(tt.own, tt.flag)
			c := hooks.New(hooks.Options{Secrets: kubeSecrets{kube: kube, scope: scope}, SecretNamespaceAllowed: scope.check})
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
			for _, a := range kube.Actions() {
				if g, ok := a.(interface{ GetName() string }); ok {
					got.Reads = append(got.Reads, a.GetVerb()+" "+a.GetResource().Resource+" "+a.GetNamespace()+"/"+g.GetName())
				}
			}
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
	kube := fake.NewClientset(
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "s"}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "c"}},
	)
	k := kubeSecrets{kube: kube, scope: newSecretScope("metabus", nil)}
	if _, err := k.Secret(context.Background(), "team-b", "s"); err == nil {
		t.Error("Secret outside the scope: no error")
	}
	if _, err := k.ConfigMap(context.Background(), "team-b", "c"); err == nil {
		t.Error("ConfigMap outside the scope: no error")
	}
	if n := len(kube.Actions()); n != 0 {
		t.Errorf("%d API calls, want none", n)
	}
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
