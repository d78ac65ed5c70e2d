package hooks

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// recordingSecrets records every Secret and ConfigMap read ("Secret ns/name").
type recordingSecrets struct {
	Secrets
	mu    sync.Mutex
	reads []string
}

func (r *recordingSecrets) Secret(ctx context.Context, ns, name string) (map[string][]byte, error) {
	r.mu.Lock()
	r.reads = append(r.reads, "Secret "+ns+"/"+name)
	r.mu.Unlock()
	return r.Secrets.Secret(ctx, ns, name)
}

func (r *recordingSecrets) ConfigMap(ctx context.Context, ns, name string) (map[string]string, error) {
	r.mu.Lock()
	r.reads = append(r.reads, "ConfigMap "+ns+"/"+name)
	r.mu.Unlock()
	return r.Secrets.ConfigMap(ctx, ns, name)
}

func (r *recordingSecrets) read() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.reads...)
}

// onlyTools is a namespace policy allowing the "tools" namespace only.
func onlyTools(ns string) error {
	if ns == "tools" {
		return nil
	}
	return fmt.Errorf("namespace %q is not allowed (--secret-namespaces)", ns)
}

// A reference outside the allowed namespaces is refused before anything is read or sent, even
// when the other references of the config are allowed.
func TestSecretNamespaces(t *testing.T) {
	srv, rec := serve(t, replyJSON(`{}`))
	host := strings.TrimPrefix(srv.URL, "http://")
	_, clientCert, clientKey := newClientCA(t)
	tokenIn := func(ns string) *v1alpha1.Authorization {
		return &v1alpha1.Authorization{SecretRef: v1alpha1.KeySelector{Name: "token", Namespace: ns}}
	}
	type result struct {
		Reads     []string
		Requests  int
		Refused   bool
		ErrSubstr string // "" when the call succeeds
	}
	tests := []struct {
		reason  string
		policy  func(string) error
		auth    v1alpha1.WebhookAuth
		configs []v1alpha1.EndpointConfig
		want    result
	}{
		{
			reason: "a Secret in an allowed namespace is read and the call is sent",
			policy: onlyTools, auth: v1alpha1.WebhookAuth{Authorization: tokenIn("tools")},
			want: result{Reads: []string{"Secret tools/token"}, Requests: 1},
		},
		{
			reason: "authorization from a Secret in another namespace is refused, nothing read, nothing sent",
			policy: onlyTools, auth: v1alpha1.WebhookAuth{Authorization: tokenIn("kube-system")},
			want: result{Refused: true, ErrSubstr: `webhook.authorization.secretRef: Secret kube-system/token: namespace "kube-system" is not allowed (--secret-namespaces)`},
		},
		{
			reason: "basicAuth from a Secret in another namespace is refused",
			policy: onlyTools, auth: v1alpha1.WebhookAuth{BasicAuth: &v1alpha1.BasicAuth{SecretRef: v1alpha1.ObjectRef{Name: "basic", Namespace: "team-b"}}},
			want: result{Refused: true, ErrSubstr: `webhook.basicAuth.secretRef: Secret team-b/basic: namespace "team-b"`},
		},
		{
			reason: "clientTLS from a Secret in another namespace is refused",
			policy: onlyTools, auth: v1alpha1.WebhookAuth{ClientTLS: &v1alpha1.ClientTLS{SecretRef: v1alpha1.ObjectRef{Name: "client", Namespace: "team-b"}}},
			want: result{Refused: true, ErrSubstr: `webhook.clientTLS.secretRef: Secret team-b/client`},
		},
		{
			reason: "a caBundle ConfigMap in another namespace is refused",
			policy: onlyTools, auth: v1alpha1.WebhookAuth{CABundle: &v1alpha1.CABundle{ConfigMapRef: &v1alpha1.KeySelector{Name: "ca", Namespace: "team-b"}}},
			want: result{Refused: true, ErrSubstr: `webhook.caBundle.configMapRef: ConfigMap team-b/ca`},
		},
		{
			reason: "one reference outside refuses the call before the allowed ones are read",
			policy: onlyTools,
			auth: v1alpha1.WebhookAuth{
				ClientTLS:     &v1alpha1.ClientTLS{SecretRef: v1alpha1.ObjectRef{Name: "client", Namespace: "tools"}},
				Authorization: tokenIn("team-b"),
			},
			want: result{Refused: true, ErrSubstr: `Secret team-b/token`},
		},
		{
			reason:  "an endpointConfigs entry is checked too, and named in the error",
			policy:  onlyTools,
			configs: []v1alpha1.EndpointConfig{{Host: host, WebhookAuth: v1alpha1.WebhookAuth{Authorization: tokenIn("team-b")}}},
			want:    result{Refused: true, ErrSubstr: fmt.Sprintf(`endpointConfigs[host=%q].authorization.secretRef: Secret team-b/token`, host)},
		},
		{
			reason: "without a policy every namespace may be read",
			auth:   v1alpha1.WebhookAuth{Authorization: tokenIn("team-b")},
			want:   result{Reads: []string{"Secret team-b/token"}, Requests: 1},
		},
		{
			reason: "a hook without TLS/auth options is not affected by the policy",
			policy: func(string) error { return errors.New("nothing is allowed") },
			want:   result{Requests: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			fake := authSecrets()
			fake.setSecret("team-b", "token", map[string][]byte{"token": []byte("team-b-token")})
			fake.setSecret("tools", "client", map[string][]byte{"tls.crt": clientCert, "tls.key": clientKey})
			secrets := &recordingSecrets{Secrets: fake}
			c := New(Options{Secrets: secrets, SecretNamespaceAllowed: tt.policy})
			h := hookAt(srv.URL)
			h.Webhook.WebhookAuth = tt.auth
			h.Webhook.AllowInsecureCredentials = ptr(true) // this test is about namespaces only
			call := syncCall(h)
			call.EndpointConfigs = tt.configs
			before := rec.count()
			err := c.Do(context.Background(), call, &syncResponse{})

			var refused *RefusedError
			got := result{Reads: secrets.read(), Requests: rec.count() - before, Refused: errors.As(err, &refused)}
			if err != nil {
				got.ErrSubstr = tt.want.ErrSubstr
				if !strings.Contains(err.Error(), tt.want.ErrSubstr) || tt.want.ErrSubstr == "" {
					t.Errorf("err = %v, want it to contain %q", err, tt.want.ErrSubstr)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s\nerr: %v", diff, err)
			}
		})
	}
}

// Credentials are never sent over plain http unless the webhook (or the endpointConfigs entry
// that carries them) sets allowInsecureCredentials.
func TestInsecureCredentials(t *testing.T) {
	srv, rec := serve(t, replyJSON(`{}`))
	host := strings.TrimPrefix(srv.URL, "http://")
	tlsRec := &recorder{}
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tlsRec.record(r)
		replyJSON(`{}`)(w, r)
	}))
	t.Cleanup(tlsSrv.Close)
	tlsCA := certPEM(tlsSrv.Certificate().Raw)
	_, clientCert, clientKey := newClientCA(t)

	token := &v1alpha1.Authorization{SecretRef: v1alpha1.KeySelector{Name: "token", Namespace: "tools"}}
	basic := &v1alpha1.BasicAuth{SecretRef: v1alpha1.ObjectRef{Name: "basic", Namespace: "tools"}}
	withUserinfo := strings.Replace(srv.URL, "http://", "http://metabus:"+testPassword+"@", 1)
	type result struct {
		Refused bool
		Reads   []string
		// Authorization is the header the hook server received; "-" when it received nothing.
		Authorization string
	}
	tests := []struct {
		reason  string
		url     string // srv.URL when empty
		auth    v1alpha1.WebhookAuth
		configs []v1alpha1.EndpointConfig
		want    result
		errWant string
	}{
		{
			reason: "a Bearer token to an http url is refused before the Secret is read",
			auth:   v1alpha1.WebhookAuth{Authorization: token},
			want:   result{Refused: true, Authorization: "-"}, errWant: "webhook.authorization would be sent in clear over plain http",
		},
		{
			reason: "basic auth to an http url is refused",
			auth:   v1alpha1.WebhookAuth{BasicAuth: basic},
			want:   result{Refused: true, Authorization: "-"}, errWant: "webhook.basicAuth would be sent in clear",
		},
		{
			reason: "a user:password in an http url is refused",
			url:    withUserinfo,
			want:   result{Refused: true, Authorization: "-"}, errWant: "the user:password in the url would be sent in clear",
		},
		{
			reason:  "credentials of a matching endpointConfigs entry are refused too",
			configs: []v1alpha1.EndpointConfig{{Host: host, WebhookAuth: v1alpha1.WebhookAuth{Authorization: token}}},
			want:    result{Refused: true, Authorization: "-"}, errWant: fmt.Sprintf("endpointConfigs[host=%q].authorization would be sent in clear", host),
		},
		{
			reason: "allowInsecureCredentials on the webhook lets the token go over http",
			auth:   v1alpha1.WebhookAuth{Authorization: token, AllowInsecureCredentials: ptr(true)},
			want:   result{Reads: []string{"Secret tools/token"}, Authorization: "Bearer " + testToken},
		},
		{
			reason:  "allowInsecureCredentials on the endpointConfigs entry lets its token go over http",
			configs: []v1alpha1.EndpointConfig{{Host: host, WebhookAuth: v1alpha1.WebhookAuth{Authorization: token, AllowInsecureCredentials: ptr(true)}}},
			want:    result{Reads: []string{"Secret tools/token"}, Authorization: "Bearer " + testToken},
		},
		{
			reason:  "allowInsecureCredentials alone on the webhook keeps the endpointConfigs entry and allows it",
			auth:    v1alpha1.WebhookAuth{AllowInsecureCredentials: ptr(true)},
			configs: []v1alpha1.EndpointConfig{{Host: host, WebhookAuth: v1alpha1.WebhookAuth{Authorization: token}}},
			want:    result{Reads: []string{"Secret tools/token"}, Authorization: "Bearer " + testToken},
		},
		{
			reason: "allowInsecureCredentials: false is the default: refused",
			auth:   v1alpha1.WebhookAuth{BasicAuth: basic, AllowInsecureCredentials: ptr(false)},
			want:   result{Refused: true, Authorization: "-"}, errWant: "webhook.basicAuth would be sent in clear",
		},
		{
			reason: "a user:password in an http url with allowInsecureCredentials is sent",
			url:    withUserinfo, auth: v1alpha1.WebhookAuth{AllowInsecureCredentials: ptr(true)},
			want: result{Authorization: "Basic bWV0YWJ1czpodW50ZXIyLXBhc3N3b3Jk"},
		},
		{
			reason: "a Bearer token to an https url is sent",
			url:    tlsSrv.URL, auth: v1alpha1.WebhookAuth{Authorization: token, CABundle: &v1alpha1.CABundle{Inline: &tlsCA}},
			want: result{Reads: []string{"Secret tools/token"}, Authorization: "Bearer " + testToken},
		},
		{
			reason: "clientTLS on an http url is not a credential sent in clear (it only applies to https)",
			auth:   v1alpha1.WebhookAuth{ClientTLS: &v1alpha1.ClientTLS{SecretRef: v1alpha1.ObjectRef{Name: "client", Namespace: "tools"}}},
			want:   result{Reads: []string{"Secret tools/client"}, Authorization: ""},
		},
		{
			reason: "a caBundle on an http url is no credential",
			auth:   v1alpha1.WebhookAuth{CABundle: &v1alpha1.CABundle{Inline: &tlsCA}},
			want:   result{Authorization: ""},
		},
		{
			reason: "no options at all",
			want:   result{Authorization: ""},
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			fake := authSecrets()
			fake.setSecret("tools", "client", map[string][]byte{"tls.crt": clientCert, "tls.key": clientKey})
			secrets := &recordingSecrets{Secrets: fake}
			c := New(Options{Secrets: secrets})
			url, r := srv.URL, rec
			if tt.url != "" {
				url = tt.url
			}
			if url == tlsSrv.URL {
				r = tlsRec
			}
			h := hookAt(url)
			h.Webhook.WebhookAuth = tt.auth
			call := syncCall(h)
			call.EndpointConfigs = tt.configs
			before := r.count()
			err := c.Do(context.Background(), call, &syncResponse{})
			var refused *RefusedError
			got := result{Refused: errors.As(err, &refused), Reads: secrets.read(), Authorization: "-"}
			if r.count() > before {
				got.Authorization = r.last(t).Header.Get("Authorization")
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s\nerr: %v", diff, err)
			}
			switch {
			case tt.errWant == "" && err != nil:
				t.Errorf("Do: %v", err)
			case tt.errWant != "" && (err == nil || !strings.Contains(err.Error(), tt.errWant)):
				t.Errorf("err = %v, want it to contain %q", err, tt.errWant)
			}
			if err != nil && strings.Contains(err.Error(), testPassword) {
				t.Errorf("the error leaks the password: %v", err)
			}
		})
	}
}

// A service reference is plain http unless its protocol says https: traffic inside the
// cluster is not encrypted by itself.
func TestInsecureCredentialsServiceReference(t *testing.T) {
	token := &v1alpha1.Authorization{SecretRef: v1alpha1.KeySelector{Name: "token", Namespace: "tools"}}
	svc := func(protocol string, port int32) *v1alpha1.Webhook {
		w := &v1alpha1.Webhook{Service: &v1alpha1.ServiceReference{Name: "hook", Namespace: "team-a", Port: ptr(port)}, Path: ptr("/sync")}
		if protocol != "" {
			w.Service.Protocol = ptr(protocol)
		}
		w.Authorization = token
		return w
	}
	insecure := func(w *v1alpha1.Webhook) *v1alpha1.Webhook {
		w.AllowInsecureCredentials = ptr(true)
		return w
	}
	tests := []struct {
		reason  string
		webhook *v1alpha1.Webhook
		// noInsecure is Options.InsecureCredentialsRefused.
		noInsecure string
		refused    bool
	}{
		{reason: "no protocol means http: refused", webhook: svc("", 80), refused: true},
		{reason: "protocol http: refused", webhook: svc("http", 8080), refused: true},
		{reason: "port 443 without protocol https is still http: refused", webhook: svc("", 443), refused: true},
		{reason: "protocol https: allowed", webhook: svc("https", 443), refused: false},
		{reason: "protocol HTTPS (any case): allowed", webhook: svc("HTTPS", 8443), refused: false},
		{reason: "protocol http with allowInsecureCredentials: allowed", webhook: insecure(svc("http", 80)), refused: false},
		{reason: "allowInsecureCredentials, but the caller's policy does not honour it: refused",
			webhook: insecure(svc("http", 80)), noInsecure: "--allow-insecure-credentials=false", refused: true},
		{reason: "protocol https, the caller refusing insecure credentials: allowed",
			webhook: insecure(svc("https", 443)), noInsecure: "--allow-insecure-credentials=false", refused: false},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			u, err := parseWebhookURL(tt.webhook)
			if err != nil {
				t.Fatal(err)
			}
			a, where := effectiveAuth(tt.webhook, nil, u)
			c := New(Options{InsecureCredentialsRefused: tt.noInsecure})
			err = c.checkInsecureCredentials(u, tt.webhook, a, where, u.Redacted())
			var refused *RefusedError
			if got := errors.As(err, &refused); got != tt.refused {
				t.Errorf("%s: refused = %v, want %v (err %v)", u, got, tt.refused, err)
			}
			if tt.refused && tt.noInsecure != "" && !strings.Contains(err.Error(), tt.noInsecure) {
				t.Errorf("the refusal %q does not name the setting %q", err, tt.noInsecure)
			}
		})
	}
}
