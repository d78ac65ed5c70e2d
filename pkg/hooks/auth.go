package hooks

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// Defaults of the TLS/auth options, as upstream.
const (
	defaultCAKey       = "ca.crt"
	defaultCertKey     = "tls.crt"
	defaultKeyKey      = "tls.key"
	defaultUsernameKey = "username"
	defaultPasswordKey = "password"
	// defaultTokenKey is used when authorization.secretRef.key is empty. Upstream has no
	// default (the lookup of "" always fails); "token" is the key of service-account token
	// Secrets, so the default only turns an error into the obvious meaning.
	defaultTokenKey = "token"
	defaultAuthType = "Bearer"
)

// effectiveAuth returns the TLS/auth options that apply to a call and where they come from:
// the webhook's own when it sets any of them (never merged with an endpoint config, as
// upstream), else those of the first matching endpointConfigs entry, else nil.
func effectiveAuth(w *v1alpha1.Webhook, configs []v1alpha1.EndpointConfig, u *url.URL) (*v1alpha1.WebhookAuth, string) {
	if !authEmpty(&w.WebhookAuth) {
		return &w.WebhookAuth, "webhook"
	}
	if ec := matchEndpointConfig(u, configs); ec != nil && !authEmpty(&ec.WebhookAuth) {
		return &ec.WebhookAuth, fmt.Sprintf("endpointConfigs[host=%q]", ec.Host)
	}
	return nil, ""
}

func authEmpty(a *v1alpha1.WebhookAuth) bool {
	return a.CABundle == nil && a.ClientTLS == nil && a.Authorization == nil && a.BasicAuth == nil
}

// validateAuth reports configuration errors that no Secret content can fix.
func validateAuth(a *v1alpha1.WebhookAuth) error {
	if a.Authorization != nil && a.BasicAuth != nil {
		return errors.New("authorization and basicAuth are mutually exclusive")
	}
	if ca := a.CABundle; ca != nil {
		n := 0
		if ca.Inline != nil {
			n++
		}
		if ca.SecretRef != nil {
			n++
			if err := checkRef("caBundle.secretRef", ca.SecretRef.Namespace, ca.SecretRef.Name); err != nil {
				return err
			}
		}
		if ca.ConfigMapRef != nil {
			n++
			if err := checkRef("caBundle.configMapRef", ca.ConfigMapRef.Namespace, ca.ConfigMapRef.Name); err != nil {
				return err
			}
		}
		if n != 1 {
			return fmt.Errorf("caBundle must set exactly one of inline, secretRef and configMapRef (%d set)", n)
		}
	}
	if t := a.ClientTLS; t != nil {
		if err := checkRef("clientTLS.secretRef", t.SecretRef.Namespace, t.SecretRef.Name); err != nil {
			return err
		}
	}
	if az := a.Authorization; az != nil {
		typ := strings.TrimSpace(az.Type)
		if strings.EqualFold(typ, "basic") {
			return errors.New(`authorization type "Basic" is not supported: use basicAuth`)
		}
		for _, r := range typ {
			if r <= ' ' || r >= 0x7f {
				return fmt.Errorf("authorization type %q is not a valid HTTP auth scheme", typ)
			}
		}
		if err := checkRef("authorization.secretRef", az.SecretRef.Namespace, az.SecretRef.Name); err != nil {
			return err
		}
	}
	if b := a.BasicAuth; b != nil {
		if err := checkRef("basicAuth.secretRef", b.SecretRef.Namespace, b.SecretRef.Name); err != nil {
			return err
		}
	}
	return nil
}

func checkRef(field, namespace, name string) error {
	if namespace == "" || name == "" {
		return fmt.Errorf("%s: name and namespace are required", field)
	}
	return nil
}

// resolveMaterial reads the Secrets and ConfigMaps that a (validated) config refers to.
func (c *Client) resolveMaterial(ctx context.Context, a *v1alpha1.WebhookAuth) (*material, error) {
	m := &material{}
	if ca := a.CABundle; ca != nil {
		var err error
		switch {
		case ca.Inline != nil:
			m.caPEM = []byte(*ca.Inline)
		case ca.SecretRef != nil:
			m.caPEM, err = c.secretKey(ctx, ca.SecretRef.Namespace, ca.SecretRef.Name, orDefault(ca.SecretRef.Key, defaultCAKey))
		case ca.ConfigMapRef != nil:
			m.caPEM, err = c.configMapKey(ctx, ca.ConfigMapRef.Namespace, ca.ConfigMapRef.Name, orDefault(ca.ConfigMapRef.Key, defaultCAKey))
		}
		if err != nil {
			return nil, fmt.Errorf("caBundle: %w", err)
		}
		if len(m.caPEM) == 0 {
			return nil, errors.New("caBundle: empty")
		}
	}
	if t := a.ClientTLS; t != nil {
		data, err := c.secret(ctx, t.SecretRef.Namespace, t.SecretRef.Name)
		if err != nil {
			return nil, fmt.Errorf("clientTLS: %w", err)
		}
		if m.certPEM, err = key(data, t.SecretRef.Namespace, t.SecretRef.Name, orDefault(t.CertKey, defaultCertKey)); err != nil {
			return nil, fmt.Errorf("clientTLS: %w", err)
		}
		if m.keyPEM, err = key(data, t.SecretRef.Namespace, t.SecretRef.Name, orDefault(t.PrivateKeyKey, defaultKeyKey)); err != nil {
			return nil, fmt.Errorf("clientTLS: %w", err)
		}
	}
	switch {
	case a.Authorization != nil:
		az := a.Authorization
		tok, err := c.secretKey(ctx, az.SecretRef.Namespace, az.SecretRef.Name, orDefault(az.SecretRef.Key, defaultTokenKey))
		if err != nil {
			return nil, fmt.Errorf("authorization: %w", err)
		}
		token := strings.TrimSpace(string(tok))
		if err := checkHeaderValue(token); err != nil {
			return nil, fmt.Errorf("authorization: token in Secret %s/%s %w", az.SecretRef.Namespace, az.SecretRef.Name, err)
		}
		m.authHeader = orDefault(strings.TrimSpace(az.Type), defaultAuthType) + " " + token
	case a.BasicAuth != nil:
		b := a.BasicAuth
		data, err := c.secret(ctx, b.SecretRef.Namespace, b.SecretRef.Name)
		if err != nil {
			return nil, fmt.Errorf("basicAuth: %w", err)
		}
		user, err := key(data, b.SecretRef.Namespace, b.SecretRef.Name, orDefault(b.UsernameKey, defaultUsernameKey))
		if err != nil {
			return nil, fmt.Errorf("basicAuth: %w", err)
		}
		pass, err := key(data, b.SecretRef.Namespace, b.SecretRef.Name, orDefault(b.PasswordKey, defaultPasswordKey))
		if err != nil {
			return nil, fmt.Errorf("basicAuth: %w", err)
		}
		// Trimmed as upstream: Secrets written with `echo` end in a newline.
		cred := strings.TrimSpace(string(user)) + ":" + strings.TrimSpace(string(pass))
		m.authHeader = "Basic " + base64.StdEncoding.EncodeToString([]byte(cred))
	}
	return m, nil
}

// checkHeaderValue rejects what net/http would refuse to send. The message never contains
// the value.
func checkHeaderValue(v string) error {
	if v == "" {
		return errors.New("is empty")
	}
	for i := 0; i < len(v); i++ {
		if b := v[i]; (b < ' ' && b != '\t') || b == 0x7f {
			return errors.New("contains control characters")
		}
	}
	return nil
}

var errNoSecrets = errors.New("no Secrets resolver configured (hooks.Options.Secrets is nil)")

func (c *Client) secret(ctx context.Context, namespace, name string) (map[string][]byte, error) {
	if c.secrets == nil {
		return nil, fmt.Errorf("cannot read Secret %s/%s: %w", namespace, name, errNoSecrets)
	}
	data, err := c.secrets.Secret(ctx, namespace, name)
	if err != nil {
		return nil, fmt.Errorf("cannot read Secret %s/%s: %w", namespace, name, err)
	}
	return data, nil
}

func (c *Client) secretKey(ctx context.Context, namespace, name, k string) ([]byte, error) {
	data, err := c.secret(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return key(data, namespace, name, k)
}

func (c *Client) configMapKey(ctx context.Context, namespace, name, k string) ([]byte, error) {
	if c.secrets == nil {
		return nil, fmt.Errorf("cannot read ConfigMap %s/%s: %w", namespace, name, errNoSecrets)
	}
	data, err := c.secrets.ConfigMap(ctx, namespace, name)
	if err != nil {
		return nil, fmt.Errorf("cannot read ConfigMap %s/%s: %w", namespace, name, err)
	}
	v, ok := data[k]
	if !ok {
		return nil, fmt.Errorf("ConfigMap %s/%s has no key %q", namespace, name, k)
	}
	return []byte(v), nil
}

func key(data map[string][]byte, namespace, name, k string) ([]byte, error) {
	v, ok := data[k]
	if !ok {
		return nil, fmt.Errorf("Secret %s/%s has no key %q", namespace, name, k)
	}
	if len(v) == 0 {
		return nil, fmt.Errorf("Secret %s/%s: key %q is empty", namespace, name, k)
	}
	return v, nil
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
