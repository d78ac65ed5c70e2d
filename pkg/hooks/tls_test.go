package hooks

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/metabus/metabus/internal/testing/testpki"
	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

var quietLog = log.New(io.Discard, "", 0)

func certPEM(der []byte) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}

// newClientCA returns a CA and a client certificate (PEM) with key signed by it.
func newClientCA(t *testing.T) (pool *x509.CertPool, cert, key []byte) {
	t.Helper()
	ca := testpki.NewCA(t, "test client CA")
	cert, key = ca.Issue(t, "metabus-dispatcher")
	return ca.Pool(), cert, key
}

func TestTLSCABundle(t *testing.T) {
	srv := httptest.NewUnstartedServer(replyJSON(`{}`))
	srv.Config.ErrorLog = quietLog // handshake failures are expected
	srv.StartTLS()
	t.Cleanup(srv.Close)
	ca := certPEM(srv.Certificate().Raw)
	secrets := &fakeSecrets{configMaps: map[string]map[string]string{"tools/ca": {"ca.crt": ca}, "tools/other-key": {"bundle.pem": ca}}}
	secrets.setSecret("tools", "ca", map[string][]byte{"ca.crt": []byte(ca)})
	c := New(Options{Secrets: secrets})

	tests := []struct {
		reason  string
		ca      *v1alpha1.CABundle
		wantErr string
	}{
		{reason: "inline CA", ca: &v1alpha1.CABundle{Inline: &ca}},
		{reason: "CA from a Secret, default key ca.crt", ca: &v1alpha1.CABundle{SecretRef: &v1alpha1.KeySelector{Name: "ca", Namespace: "tools"}}},
		{reason: "CA from a ConfigMap, default key", ca: &v1alpha1.CABundle{ConfigMapRef: &v1alpha1.KeySelector{Name: "ca", Namespace: "tools"}}},
		{reason: "CA from a ConfigMap, explicit key", ca: &v1alpha1.CABundle{ConfigMapRef: &v1alpha1.KeySelector{Name: "other-key", Namespace: "tools", Key: "bundle.pem"}}},
		{reason: "no CA: the test certificate is not trusted", wantErr: "certificate"},
		{reason: "a CA that is not PEM", ca: &v1alpha1.CABundle{Inline: ptr("not a certificate")}, wantErr: "no valid PEM"},
		{reason: "two sources", ca: &v1alpha1.CABundle{Inline: &ca, SecretRef: &v1alpha1.KeySelector{Name: "ca", Namespace: "tools"}}, wantErr: "exactly one"},
		{reason: "no source", ca: &v1alpha1.CABundle{}, wantErr: "exactly one"},
		{reason: "missing key", ca: &v1alpha1.CABundle{SecretRef: &v1alpha1.KeySelector{Name: "ca", Namespace: "tools", Key: "nope"}}, wantErr: `no key "nope"`},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			h := hookAt(srv.URL)
			h.Webhook.CABundle = tt.ca
			err := c.Do(context.Background(), syncCall(h), &syncResponse{})
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Do: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want it to mention %q", err, tt.wantErr)
			}
		})
	}
}

func TestMutualTLS(t *testing.T) {
	pool, cert, key := newClientCA(t)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cn := ""
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			cn = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":{"client":"` + cn + `"}}`))
	}))
	srv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool}
	srv.Config.ErrorLog = quietLog
	srv.StartTLS()
	t.Cleanup(srv.Close)

	secrets := &fakeSecrets{}
	secrets.setSecret("tools", "client", map[string][]byte{"tls.crt": cert, "tls.key": key})
	secrets.setSecret("tools", "client-custom", map[string][]byte{"cert.pem": cert, "key.pem": key})
	secrets.setSecret("tools", "client-broken", map[string][]byte{"tls.crt": cert, "tls.key": []byte("garbage")})
	c := New(Options{Secrets: secrets})
	ca := certPEM(srv.Certificate().Raw)

	tests := []struct {
		reason  string
		tls     *v1alpha1.ClientTLS
		wantErr string
	}{
		{reason: "client certificate from a kubernetes.io/tls Secret", tls: &v1alpha1.ClientTLS{SecretRef: v1alpha1.ObjectRef{Name: "client", Namespace: "tools"}}},
		{reason: "custom keys", tls: &v1alpha1.ClientTLS{SecretRef: v1alpha1.ObjectRef{Name: "client-custom", Namespace: "tools"}, CertKey: "cert.pem", PrivateKeyKey: "key.pem"}},
		{reason: "no client certificate: the server refuses", wantErr: "certificate"},
		{reason: "a broken key", tls: &v1alpha1.ClientTLS{SecretRef: v1alpha1.ObjectRef{Name: "client-broken", Namespace: "tools"}}, wantErr: "clientTLS"},
		{reason: "a missing Secret", tls: &v1alpha1.ClientTLS{SecretRef: v1alpha1.ObjectRef{Name: "absent", Namespace: "tools"}}, wantErr: "cannot read Secret tools/absent"},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			h := hookAt(srv.URL)
			h.Webhook.CABundle = &v1alpha1.CABundle{Inline: &ca}
			h.Webhook.ClientTLS = tt.tls
			var resp syncResponse
			err := c.Do(context.Background(), syncCall(h), &resp)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Do: %v", err)
				}
				if resp.Status["client"] != "metabus-dispatcher" {
					t.Errorf("server saw client %v, want metabus-dispatcher", resp.Status["client"])
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want it to mention %q", err, tt.wantErr)
			}
		})
	}
}

const (
	testToken    = "s3cr3t-t0ken-value"
	testPassword = "hunter2-password"
)

func authSecrets() *fakeSecrets {
	s := &fakeSecrets{}
	s.setSecret("tools", "token", map[string][]byte{"token": []byte(testToken + "\n"), "alt": []byte("other-token")})
	s.setSecret("tools", "basic", map[string][]byte{"username": []byte("metabus\n"), "password": []byte(testPassword)})
	s.setSecret("tools", "basic-custom", map[string][]byte{"user": []byte("u"), "pass": []byte("p")})
	s.setSecret("tools", "bad-token", map[string][]byte{"token": []byte("line1\n" + testToken)})
	return s
}

func TestAuthorization(t *testing.T) {
	srv, rec := serve(t, replyJSON(`{}`))
	c := New(Options{Secrets: authSecrets()})
	basic := func(user, pass string) string {
		return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
	}
	tests := []struct {
		reason string
		auth   v1alpha1.WebhookAuth
		want   string
	}{
		{reason: "Bearer token from a Secret, trimmed", want: "Bearer " + testToken,
			auth: v1alpha1.WebhookAuth{Authorization: &v1alpha1.Authorization{SecretRef: v1alpha1.KeySelector{Name: "token", Namespace: "tools", Key: "token"}}}},
		{reason: "the key defaults to token", want: "Bearer " + testToken,
			auth: v1alpha1.WebhookAuth{Authorization: &v1alpha1.Authorization{SecretRef: v1alpha1.KeySelector{Name: "token", Namespace: "tools"}}}},
		{reason: "a custom type and key", want: "Token other-token",
			auth: v1alpha1.WebhookAuth{Authorization: &v1alpha1.Authorization{Type: "Token", SecretRef: v1alpha1.KeySelector{Name: "token", Namespace: "tools", Key: "alt"}}}},
		{reason: "basic auth with default keys, trimmed", want: basic("metabus", testPassword),
			auth: v1alpha1.WebhookAuth{BasicAuth: &v1alpha1.BasicAuth{SecretRef: v1alpha1.ObjectRef{Name: "basic", Namespace: "tools"}}}},
		{reason: "basic auth with custom keys", want: basic("u", "p"),
			auth: v1alpha1.WebhookAuth{BasicAuth: &v1alpha1.BasicAuth{SecretRef: v1alpha1.ObjectRef{Name: "basic-custom", Namespace: "tools"}, UsernameKey: "user", PasswordKey: "pass"}}},
		{reason: "no options, no header", want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			h := hookAt(srv.URL)
			h.Webhook.WebhookAuth = tt.auth
			h.Webhook.AllowInsecureCredentials = ptr(true) // the test server is plain http
			if err := c.Do(context.Background(), syncCall(h), &syncResponse{}); err != nil {
				t.Fatalf("Do: %v", err)
			}
			if got := rec.last(t).Header.Get("Authorization"); got != tt.want {
				t.Errorf("Authorization = %q, want %q", got, tt.want)
			}
		})
	}
}

// Configuration errors are reported clearly, before anything is sent, and never leak secrets.
func TestAuthErrors(t *testing.T) {
	srv, rec := serve(t, replyJSON(`{}`))
	tokenRef := v1alpha1.KeySelector{Name: "token", Namespace: "tools"}
	tests := []struct {
		reason  string
		secrets Secrets
		auth    v1alpha1.WebhookAuth
		want    string
	}{
		{reason: "authorization type Basic is rejected", secrets: authSecrets(), want: "use basicAuth",
			auth: v1alpha1.WebhookAuth{Authorization: &v1alpha1.Authorization{Type: "basic", SecretRef: tokenRef}}},
		{reason: "authorization and basicAuth are mutually exclusive", secrets: authSecrets(), want: "mutually exclusive",
			auth: v1alpha1.WebhookAuth{Authorization: &v1alpha1.Authorization{SecretRef: tokenRef}, BasicAuth: &v1alpha1.BasicAuth{SecretRef: v1alpha1.ObjectRef{Name: "basic", Namespace: "tools"}}}},
		{reason: "an auth type with a space", secrets: authSecrets(), want: "not a valid HTTP auth scheme",
			auth: v1alpha1.WebhookAuth{Authorization: &v1alpha1.Authorization{Type: "Bearer x", SecretRef: tokenRef}}},
		{reason: "a token with a newline inside", secrets: authSecrets(), want: "control characters",
			auth: v1alpha1.WebhookAuth{Authorization: &v1alpha1.Authorization{SecretRef: v1alpha1.KeySelector{Name: "bad-token", Namespace: "tools"}}}},
		{reason: "a missing username key", secrets: authSecrets(), want: `no key "username"`,
			auth: v1alpha1.WebhookAuth{BasicAuth: &v1alpha1.BasicAuth{SecretRef: v1alpha1.ObjectRef{Name: "token", Namespace: "tools"}}}},
		{reason: "a secretRef without namespace", secrets: authSecrets(), want: "name and namespace are required",
			auth: v1alpha1.WebhookAuth{Authorization: &v1alpha1.Authorization{SecretRef: v1alpha1.KeySelector{Name: "token"}}}},
		{reason: "no Secrets resolver", want: "no Secrets resolver configured",
			auth: v1alpha1.WebhookAuth{Authorization: &v1alpha1.Authorization{SecretRef: tokenRef}}},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			h := hookAt(srv.URL)
			h.Webhook.WebhookAuth = tt.auth
			h.Webhook.AllowInsecureCredentials = ptr(true) // the test server is plain http
			before := rec.count()
			err := New(Options{Secrets: tt.secrets}).Do(context.Background(), syncCall(h), &syncResponse{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tt.want)
			}
			if strings.Contains(err.Error(), testToken) || strings.Contains(err.Error(), testPassword) {
				t.Errorf("the error leaks a secret: %v", err)
			}
			if rec.count() != before {
				t.Errorf("a misconfigured call reached the hook")
			}
		})
	}
}

// Errors of calls that carry credentials never contain them.
func TestSecretsNotInErrors(t *testing.T) {
	unauthorized := func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
	}
	srv, _ := serve(t, unauthorized)
	slow, _ := serve(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	withUserinfo := func(raw string) string { return strings.Replace(raw, "http://", "http://metabus:"+testPassword+"@", 1) }
	c := New(Options{Secrets: authSecrets()})
	tests := []struct {
		reason string
		hook   *v1alpha1.Hook
	}{
		{reason: "401 with a Bearer token", hook: func() *v1alpha1.Hook {
			h := hookAt(srv.URL)
			h.Webhook.Authorization = &v1alpha1.Authorization{SecretRef: v1alpha1.KeySelector{Name: "token", Namespace: "tools"}}
			return h
		}()},
		{reason: "401 with basic auth", hook: func() *v1alpha1.Hook {
			h := hookAt(srv.URL)
			h.Webhook.BasicAuth = &v1alpha1.BasicAuth{SecretRef: v1alpha1.ObjectRef{Name: "basic", Namespace: "tools"}}
			return h
		}()},
		{reason: "401 with a password in the url", hook: hookAt(withUserinfo(srv.URL))},
		{reason: "timeout with a password in the url", hook: withTimeout(hookAt(withUserinfo(slow.URL)), 50*time.Millisecond)},
		{reason: "connection refused with a password in the url", hook: hookAt("http://metabus:" + testPassword + "@127.0.0.1:1/")},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			// The test servers are plain http; without this every call would be refused
			// before reaching them (TestInsecureCredentials).
			tt.hook.Webhook.AllowInsecureCredentials = ptr(true)
			err := c.Do(context.Background(), syncCall(tt.hook), &syncResponse{})
			if err == nil {
				t.Fatal("Do succeeded, want an error")
			}
			msg := err.Error()
			for _, s := range []string{testToken, testPassword, base64.StdEncoding.EncodeToString([]byte("metabus:" + testPassword))} {
				if strings.Contains(msg, s) {
					t.Errorf("the error leaks a secret: %s", msg)
				}
			}
		})
	}
}

func TestEndpointConfigs(t *testing.T) {
	srv, rec := serve(t, replyJSON(`{}`))
	host := strings.TrimPrefix(srv.URL, "http://")
	secrets := authSecrets()
	byHost := func(h string, key string) v1alpha1.EndpointConfig {
		return v1alpha1.EndpointConfig{Host: h, WebhookAuth: v1alpha1.WebhookAuth{
			Authorization: &v1alpha1.Authorization{SecretRef: v1alpha1.KeySelector{Name: "token", Namespace: "tools", Key: key}}}}
	}
	tests := []struct {
		reason  string
		own     *v1alpha1.Authorization
		configs []v1alpha1.EndpointConfig
		want    string
	}{
		{reason: "the first entry matching host:port applies", want: "Bearer other-token",
			configs: []v1alpha1.EndpointConfig{byHost("other.example", "token"), byHost(host, "alt"), byHost(host, "token")}},
		{reason: "a port-less host means the default port, not the test port", want: "",
			configs: []v1alpha1.EndpointConfig{byHost("127.0.0.1", "token")}},
		{reason: "the webhook's own options win and are not merged", want: "Bearer " + testToken,
			own:     &v1alpha1.Authorization{SecretRef: v1alpha1.KeySelector{Name: "token", Namespace: "tools"}},
			configs: []v1alpha1.EndpointConfig{byHost(host, "alt")}},
		{reason: "a matching entry without options changes nothing", want: "",
			configs: []v1alpha1.EndpointConfig{{Host: host}}},
	}
	c := New(Options{Secrets: secrets})
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			h := hookAt(srv.URL)
			h.Webhook.Authorization = tt.own
			h.Webhook.AllowInsecureCredentials = ptr(true) // the test server is plain http
			call := syncCall(h)
			call.EndpointConfigs = tt.configs
			if err := c.Do(context.Background(), call, &syncResponse{}); err != nil {
				t.Fatalf("Do: %v", err)
			}
			if got := rec.last(t).Header.Get("Authorization"); got != tt.want {
				t.Errorf("Authorization = %q, want %q", got, tt.want)
			}
		})
	}
}

// Rotated credentials are picked up within 30s, without reading Secrets on every call.
func TestSecretRotation(t *testing.T) {
	srv, rec := serve(t, replyJSON(`{}`))
	clock := newFakeClock()
	secrets := &fakeSecrets{}
	secrets.setSecret("tools", "token", map[string][]byte{"token": []byte("first")})
	c := New(Options{Secrets: secrets, Now: clock.Now})
	h := hookAt(srv.URL)
	h.Webhook.Authorization = &v1alpha1.Authorization{SecretRef: v1alpha1.KeySelector{Name: "token", Namespace: "tools"}}
	h.Webhook.AllowInsecureCredentials = ptr(true) // the test server is plain http

	call := func(want string) {
		t.Helper()
		if err := c.Do(context.Background(), syncCall(h), &syncResponse{}); err != nil {
			t.Fatalf("Do: %v", err)
		}
		if got := rec.last(t).Header.Get("Authorization"); got != want {
			t.Errorf("Authorization = %q, want %q", got, want)
		}
	}
	call("Bearer first")
	call("Bearer first")
	if n := secrets.readCount(); n != 1 {
		t.Errorf("Secrets read %d times for 2 calls, want 1", n)
	}
	secrets.setSecret("tools", "token", map[string][]byte{"token": []byte("second")})
	clock.Add(10 * time.Second)
	call("Bearer first") // still cached
	clock.Add(21 * time.Second)
	call("Bearer second")

	// A failed refresh keeps the last good material instead of failing every call.
	secrets.setSecret("tools", "token", map[string][]byte{})
	clock.Add(31 * time.Second)
	call("Bearer second")
}

func TestCheckHeaderValue(t *testing.T) {
	for _, v := range []string{"", "a\nb", "a\rb", "a\x00b", "a\x7fb"} {
		if err := checkHeaderValue(v); err == nil {
			t.Errorf("checkHeaderValue(%q) = nil, want an error", v)
		} else if v != "" && strings.Contains(err.Error(), v) {
			t.Errorf("the error repeats the value: %v", err)
		}
	}
	if err := checkHeaderValue("abc.DEF-123_~+/=\t"); err != nil {
		t.Errorf("checkHeaderValue of a valid token: %v", err)
	}
}
