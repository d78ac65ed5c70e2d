package hooks

import (
	"fmt"
	"net/url"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// RefusedError is a call refused before any Secret or ConfigMap was read and before anything
// was sent: its TLS/auth options reference a namespace the caller may not read
// (Options.SecretNamespaceAllowed), or it would send credentials over plain HTTP without
// allowInsecureCredentials. Retrying cannot help until the controller or the caller's
// configuration changes.
type RefusedError struct {
	// URL is the webhook URL with any user:password removed. Error() leaves it out: Do wraps
	// every error with it.
	URL string
	// Reason says what was refused and how to allow it.
	Reason string
}

func (e *RefusedError) Error() string {
	return "refused, no request sent: " + e.Reason
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
// Options.SecretNamespaceAllowed rejects. where says whose options they are.
func (c *Client) checkNamespaces(a *v1alpha1.WebhookAuth, where, target string) error {
	if c.nsAllowed == nil {
		return nil
	}
	for _, r := range secretRefs(a) {
		if err := c.nsAllowed(r.namespace); err != nil {
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
func checkInsecureCredentials(u *url.URL, w *v1alpha1.Webhook, a *v1alpha1.WebhookAuth, where, target string) error {
	if u.Scheme == "https" || isTrue(w.AllowInsecureCredentials) || (a != nil && isTrue(a.AllowInsecureCredentials)) {
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
	return &RefusedError{URL: target, Reason: fmt.Sprintf("%s would be sent in clear over plain http; use an https url "+
		"(or service protocol https), or set allowInsecureCredentials: true on the webhook to allow it", what)}
}

func isTrue(b *bool) bool { return b != nil && *b }
