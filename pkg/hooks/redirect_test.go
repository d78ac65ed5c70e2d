package hooks

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

func basicHeader(user, pass string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user+":"+pass))
}

// redirecting serves a hook that answers ?to=<url> with a 307 to that URL and anything else
// with an empty JSON object, recording what it receives.
func redirecting(w http.ResponseWriter, r *http.Request) {
	if to := r.URL.Query().Get("to"); to != "" {
		http.Redirect(w, r, to, http.StatusTemporaryRedirect)
		return
	}
	replyJSON(`{}`)(w, r)
}

// serveTLS is serve over https (the httptest certificate, valid for 127.0.0.1).
func serveTLS(t *testing.T, h http.HandlerFunc) (*httptest.Server, *recorder) {
	t.Helper()
	rec := &recorder{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.record(r)
		h(w, r)
	}))
	srv.Config.ErrorLog = quietLog
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv, rec
}

// Credentials never follow a redirect into clear text (issue 26): net/http copies the
// Authorization header to a redirect on the same host name, whatever its scheme and port, so an
// https hook answering 307 to http://<its host>:<port> would receive the token in clear. A call
// with credentials follows redirects to https only, and keeps its credentials only on the same
// host and port; a call without credentials follows redirects as upstream does.
func TestRedirectsKeepCredentialsSafe(t *testing.T) {
	origin, originRec := serveTLS(t, redirecting)
	otherPort, otherRec := serveTLS(t, redirecting) // same host, another port (service)
	plain, plainRec := serve(t, redirecting)        // same host, plain http
	ca := certPEM(origin.Certificate().Raw)
	c := New(Options{Secrets: authSecrets()})
	token := &v1alpha1.Authorization{SecretRef: v1alpha1.KeySelector{Name: "token", Namespace: "tools"}}
	basic := &v1alpha1.BasicAuth{SecretRef: v1alpha1.ObjectRef{Name: "basic", Namespace: "tools"}}
	to := func(base, target string) string { return base + "/sync?to=" + url.QueryEscape(target) }

	type result struct {
		Refused bool
		// The Authorization header of the last request each server saw ("-": none).
		Origin, Other, Plain string
	}
	tests := []struct {
		reason   string
		url      string
		auth     v1alpha1.WebhookAuth
		insecure bool
		want     result
	}{
		{
			reason: "bearer token, redirected to plain http on the same host: refused, nothing sent there",
			url:    to(origin.URL, plain.URL+"/sync"), auth: v1alpha1.WebhookAuth{Authorization: token},
			want: result{Refused: true, Origin: "Bearer " + testToken, Other: "-", Plain: "-"},
		},
		{
			reason: "basic auth, redirected to plain http on the same host: refused",
			url:    to(origin.URL, plain.URL+"/sync"), auth: v1alpha1.WebhookAuth{BasicAuth: basic},
			want: result{Refused: true, Origin: basicHeader("metabus", testPassword), Other: "-", Plain: "-"},
		},
		{
			reason: "a user:password in the URL, redirected to plain http: refused",
			url:    strings.Replace(to(origin.URL, plain.URL+"/sync"), "https://", "https://user:"+testPassword+"@", 1),
			want:   result{Refused: true, Origin: basicHeader("user", testPassword), Other: "-", Plain: "-"},
		},
		{
			reason: "bearer token, redirected to https on another port: followed without the token",
			url:    to(origin.URL, otherPort.URL+"/sync"), auth: v1alpha1.WebhookAuth{Authorization: token},
			want: result{Origin: "Bearer " + testToken, Other: "", Plain: "-"},
		},
		{
			reason: "bearer token, redirected within the same origin: followed with the token",
			url:    to(origin.URL, origin.URL+"/moved"), auth: v1alpha1.WebhookAuth{Authorization: token},
			want: result{Origin: "Bearer " + testToken, Other: "-", Plain: "-"},
		},
		{
			reason: "no credentials: a redirect to plain http is followed, as upstream",
			url:    to(origin.URL, plain.URL+"/sync"),
			want:   result{Origin: "", Other: "-", Plain: ""},
		},
		{
			reason: "allowInsecureCredentials on a plain http hook: a redirect to plain http on the same host keeps the token",
			url:    to(plain.URL, plain.URL+"/moved"), auth: v1alpha1.WebhookAuth{Authorization: token}, insecure: true,
			want: result{Origin: "-", Other: "-", Plain: "Bearer " + testToken},
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			before := map[*recorder]int{originRec: originRec.count(), otherRec: otherRec.count(), plainRec: plainRec.count()}
			h := hookAt(tt.url)
			h.Webhook.WebhookAuth = tt.auth
			if strings.HasPrefix(tt.url, "https://") {
				h.Webhook.CABundle = &v1alpha1.CABundle{Inline: &ca}
			}
			if tt.insecure {
				h.Webhook.AllowInsecureCredentials = ptr(true)
			}
			err := c.Do(context.Background(), syncCall(h), &syncResponse{})
			var refused *RefusedError
			got := result{Refused: errors.As(err, &refused), Origin: "-", Other: "-", Plain: "-"}
			last := func(r *recorder) string {
				if r.count() == before[r] {
					return "-"
				}
				return r.last(t).Header.Get("Authorization")
			}
			got.Origin, got.Other, got.Plain = last(originRec), last(otherRec), last(plainRec)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s\nerr: %v", diff, err)
			}
			if tt.want.Refused {
				if refused == nil || refused.Redirect == "" || !strings.Contains(err.Error(), "refused to follow the hook's redirect to "+plain.URL) {
					t.Errorf("err = %v, want a refused redirect naming its target", err)
				}
			} else if err != nil {
				t.Errorf("Do: %v", err)
			}
			if err != nil && (strings.Contains(err.Error(), testPassword) || strings.Contains(err.Error(), testToken)) {
				t.Errorf("the error leaks a credential: %v", err)
			}
		})
	}
}
