package hooks

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// RefusedError is a call refused by the caller's policy: its TLS/auth options reference a
// namespace the caller may not read (Options.SecretNamespaceAllowed), it would send credentials
// over plain HTTP without allowInsecureCredentials, or its destination is denied
// (Options.Destinations). Nothing was sent to the refused destination, and for a namespace
// refusal nothing was read. Retrying cannot help until the controller or the caller's
// configuration changes.
type RefusedError struct {
	// URL is the webhook URL with any user:password removed. Error() leaves it out: Do wraps
	// every error with it.
	URL string
	// Redirect is set when what was refused is a redirect the hook answered with: its target,
	// with any user:password removed. The hook was called; the redirect was not followed.
	Redirect string
	// Reason says what was refused and how to allow it.
	Reason string
}

func (e *RefusedError) Error() string {
	if e.Redirect != "" {
		return "refused to follow the hook's redirect to " + e.Redirect + ": " + e.Reason
	}
	return "refused, no request sent: " + e.Reason
}

// maxRedirects is how many redirects a call follows, as net/http's default.
const maxRedirects = 10

// callState is what the redirect check needs to know about the call a request belongs to. It
// travels in the request's context, since one http.Client serves every call.
type callState struct {
	// insecureAllowed: the webhook (or the options carrying its credentials) set
	// allowInsecureCredentials and the caller honours it.
	insecureAllowed bool
	// redirect is the last redirect target followed (redacted), for errors.
	redirect string
}

type callStateKey struct{}

func withCallState(ctx context.Context, st *callState) context.Context {
	return context.WithValue(ctx, callStateKey{}, st)
}

// checkRedirect is the CheckRedirect of every hook client. Credentials (an Authorization
// header, or a user:password in the URL) never follow a redirect to plain http, unless the call
// may send them in clear anyway (allowInsecureCredentials); and they only follow one to the
// same host and port: net/http would also send the Authorization header to a subdomain of the
// hook's host, and to another port of it (another service), whose owners need not be the
// hook's. Every redirect target is still subject to the destination policy, which the dialer
// checks.
func checkRedirect(req *http.Request, via []*http.Request) error {
	if len(via) >= maxRedirects {
		return fmt.Errorf("stopped after %d redirects", maxRedirects)
	}
	first := via[0]
	st, _ := first.Context().Value(callStateKey{}).(*callState)
	target := req.URL.Redacted()
	if st != nil {
		st.redirect = target
	}
	if first.Header.Get("Authorization") == "" && first.URL.User == nil {
		return nil
	}
	if req.URL.Scheme != "https" && (st == nil || !st.insecureAllowed) {
		return &RefusedError{Redirect: target, Reason: "the call carries credentials, which would follow it in clear over plain http"}
	}
	fh, fp := hostPort(first.URL)
	rh, rp := hostPort(req.URL)
	if fh != rh || fp != rp {
		req.Header.Del("Authorization")
	}
	return nil
}

// refusal returns the *RefusedError an error of a request carries (a destination denied at
// dial, a redirect refused), with its URL set, or nil.
func refusal(err error, target string, st *callState) *RefusedError {
	var refused *RefusedError
	if errors.As(err, &refused) {
		r := *refused
		r.URL = target
		return &r
	}
	var denied *DestinationError
	if errors.As(err, &denied) {
		return &RefusedError{URL: target, Redirect: st.redirect, Reason: denied.Error()}
	}
	return nil
}

// secretRef is one Secret or ConfigMap that TLS/auth options read.
type secretRef struct {
	field, kind, namespace, name string
}

// secretRefs lists what a (validated) config reads, in field order.
func secretRefs(a *v1alpha1.WebhookAuth) []secretRef {
	var refs []secretRef
	if ca := a.CABundle; ca != nil {
		if r := ca.SecretRef; r != nil {
			refs = append(refs, secretRef{"caBundle.secretRef", "Secret", r.Namespace, r.Name})
		}
		if r := ca.ConfigMapRef; r != nil {
			refs = append(refs, secretRef{"caBundle.configMapRef", "ConfigMap", r.Namespace, r.Name})
		}
	}
	if t := a.ClientTLS; t != nil {
		refs = append(refs, secretRef{"clientTLS.secretRef", "Secret", t.SecretRef.Namespace, t.SecretRef.Name})
	}
	if az := a.Authorization; az != nil {
		refs = append(refs, secretRef{"authorization.secretRef", "Secret", az.SecretRef.Namespace, az.SecretRef.Name})
	}
	if b := a.BasicAuth; b != nil {
		refs = append(refs, secretRef{"basicAuth.secretRef", "Secret", b.SecretRef.Namespace, b.SecretRef.Name})
	}
	return refs
}

// checkNamespaces refuses a config that references a Secret or ConfigMap in a namespace that
// Options.SecretNamespaceAllowed rejects, or a Secret Options.SecretAllowed rejects. where
// says whose options they are.
func (c *Client) checkNamespaces(a *v1alpha1.WebhookAuth, where, target string) error {
	for _, r := range secretRefs(a) {
		var err error
		if c.nsAllowed != nil {
			err = c.nsAllowed(r.namespace)
		}
		if err == nil && c.secretAllowed != nil && r.kind == "Secret" {
			err = c.secretAllowed(r.namespace, r.name)
		}
		if err != nil {
			return &RefusedError{URL: target, Reason: fmt.Sprintf("%s.%s: %s %s/%s: %v", where, r.field, r.kind, r.namespace, r.name, err)}
		}
	}
	return nil
}

// checkInsecureCredentials refuses to send credentials (authorization, basicAuth, or a
// user:password in the URL) to a plain http:// URL unless the webhook or the options that
// carry them set allowInsecureCredentials. A service reference counts as http unless its
// protocol is https: traffic inside the cluster is not encrypted by default either.
// clientTLS is not a credential sent over the wire (it only applies to https) and a caBundle
// is public.
func (c *Client) checkInsecureCredentials(u *url.URL, w *v1alpha1.Webhook, a *v1alpha1.WebhookAuth, where, target string) error {
	if u.Scheme == "https" || c.insecureAllowed(w, a) {
		return nil
	}
	var what string
	switch {
	case u.User != nil:
		what = "the user:password in the url"
	case a != nil && a.Authorization != nil:
		what = where + ".authorization"
	case a != nil && a.BasicAuth != nil:
		what = where + ".basicAuth"
	default:
		return nil
	}
	if c.noInsecure != "" {
		return &RefusedError{URL: target, Reason: fmt.Sprintf("%s would be sent in clear over plain http; use an https url "+
			"(or service protocol https): %s", what, c.noInsecure)}
	}
	return &RefusedError{URL: target, Reason: fmt.Sprintf("%s would be sent in clear over plain http; use an https url "+
		"(or service protocol https), or set allowInsecureCredentials: true on the webhook to allow it", what)}
}

// insecureAllowed reports whether credentials may go over plain http for a webhook whose
// credentials come from a (nil: none): it or a say allowInsecureCredentials, and the caller's
// policy honours that.
func (c *Client) insecureAllowed(w *v1alpha1.Webhook, a *v1alpha1.WebhookAuth) bool {
	return c.noInsecure == "" && (isTrue(w.AllowInsecureCredentials) || (a != nil && isTrue(a.AllowInsecureCredentials)))
}

func isTrue(b *bool) bool { return b != nil && *b }
