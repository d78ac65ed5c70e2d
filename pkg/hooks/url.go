package hooks

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// DefaultTimeout is the webhook timeout when webhook.timeout is unset or not positive, as upstream.
const DefaultTimeout = 10 * time.Second

// MaxTimeout bounds every webhook timeout (webhook.timeout and Options.DefaultTimeout): a hook
// call holds its work item, and with it the other parents of its partition, until it ends, so
// one slow controller must not stall the others for longer.
const MaxTimeout = 60 * time.Second

// URL resolves the effective URL of a webhook. A non-empty url overrides service and path;
// otherwise the URL is <protocol>://<name>.<namespace>:<port><path> with protocol "http" and
// port 80 by default, resolved through cluster DNS.
//
// Unlike upstream, a service without a path is accepted (the root path is used) and a path
// without a leading slash gets one, since neither can mean anything else.
func URL(w *v1alpha1.Webhook) (string, error) {
	u, err := parseWebhookURL(w)
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

// parseWebhookURL is URL returning the parsed form, which Do needs for host matching.
func parseWebhookURL(w *v1alpha1.Webhook) (*url.URL, error) {
	if w == nil {
		return nil, errors.New("hook has no webhook")
	}
	if w.URL != nil && *w.URL != "" {
		return parseHookURL(*w.URL)
	}
	s := w.Service
	if s == nil {
		return nil, errors.New("invalid webhook: must specify either url or service")
	}
	if s.Name == "" || s.Namespace == "" {
		return nil, errors.New("invalid webhook: service name and namespace are required")
	}
	protocol := "http"
	if s.Protocol != nil && *s.Protocol != "" {
		protocol = strings.ToLower(*s.Protocol)
	}
	port := int32(80)
	if s.Port != nil {
		port = *s.Port
	}
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("invalid webhook: service port %d out of range", port)
	}
	path := ""
	if w.Path != nil && *w.Path != "" {
		path = *w.Path
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
	}
	host := net.JoinHostPort(s.Name+"."+s.Namespace, strconv.Itoa(int(port)))
	return parseHookURL(protocol + "://" + host + path)
}

func parseHookURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		// url.Parse quotes the input, which may carry a password: report only the reason.
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return nil, fmt.Errorf("invalid webhook url: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("invalid webhook url %s: scheme must be http or https", u.Redacted())
	}
	if u.Host == "" {
		return nil, fmt.Errorf("invalid webhook url %s: no host", u.Redacted())
	}
	return u, nil
}

// Timeout returns the effective timeout of a webhook: webhook.timeout, or DefaultTimeout when
// it is unset or not positive, at most MaxTimeout.
func Timeout(w *v1alpha1.Webhook) time.Duration {
	return timeoutOr(w, DefaultTimeout)
}

func timeoutOr(w *v1alpha1.Webhook, def time.Duration) time.Duration {
	d := def
	if w != nil && w.Timeout != nil && w.Timeout.Duration > 0 {
		d = w.Timeout.Duration
	}
	return min(d, MaxTimeout)
}

// hostPort returns the lower-cased host and the effective port of u, folding the scheme's
// default port in, so that "example.com", "EXAMPLE.com:443" and "example.com:443" compare equal
// for https.
func hostPort(u *url.URL) (host, port string) {
	host = strings.ToLower(u.Hostname())
	port = u.Port()
	if port == "" {
		port = defaultPort(u.Scheme)
	}
	return host, port
}

func defaultPort(scheme string) string {
	if scheme == "https" {
		return "443"
	}
	return "80"
}

// matchEndpointConfig returns the first entry whose host matches u: case-insensitively, given
// as host (meaning the scheme's default port) or host:port.
func matchEndpointConfig(u *url.URL, configs []v1alpha1.EndpointConfig) *v1alpha1.EndpointConfig {
	host, port := hostPort(u)
	for i := range configs {
		h, p := splitConfigHost(configs[i].Host)
		if p == "" {
			p = defaultPort(u.Scheme)
		}
		if strings.EqualFold(h, host) && p == port {
			return &configs[i]
		}
	}
	return nil
}

// splitConfigHost splits an endpointConfigs host ("example.com", "example.com:8443",
// "[::1]:443", "::1") into host and port ("" when absent).
func splitConfigHost(s string) (host, port string) {
	s = strings.TrimSpace(s)
	if h, p, err := net.SplitHostPort(s); err == nil {
		return h, p
	}
	return strings.TrimSuffix(strings.TrimPrefix(s, "["), "]"), ""
}
