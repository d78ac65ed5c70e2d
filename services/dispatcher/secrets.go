package dispatcher

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/metabus/metabus/pkg/kubeapi"
	"github.com/metabus/metabus/pkg/natsx"
)

// DefaultNamespace is the dispatcher's namespace when POD_NAMESPACE is unset.
const DefaultNamespace = "metabus"

// ownNamespace is the namespace the dispatcher runs in: POD_NAMESPACE, else DefaultNamespace.
func ownNamespace() string {
	if ns := strings.TrimSpace(os.Getenv("POD_NAMESPACE")); ns != "" {
		return ns
	}
	return DefaultNamespace
}

// AllNamespaces in --secret-namespaces lets webhooks reference Secrets and ConfigMaps in any
// namespace (the RBAC must then grant a cluster-wide get).
const AllNamespaces = "*"

// secretScope is where webhook TLS/auth options may read Secrets and ConfigMaps: the
// dispatcher's own namespace plus --secret-namespaces. Anyone who may create a controller
// chooses the Secrets its webhooks reference and where the credentials are sent, so the
// namespaces are the admin's deliberate choice, checked before any read.
type secretScope struct {
	own   string
	extra []string // sorted, without own
	all   bool
	// ownSecrets are the Secrets of own that may be hook credentials
	// (--hook-credential-secrets); no other Secret there may.
	ownSecrets []string
}

// newSecretScope is own plus extra; a nil extra (--secret-namespaces unset)
// allows every namespace, as upstream.
func newSecretScope(own string, extra []string) secretScope {
	s := secretScope{own: own, all: extra == nil}
	for _, ns := range extra {
		switch {
		case ns == AllNamespaces:
			s.all = true
		case ns != own && !slices.Contains(s.extra, ns):
			s.extra = append(s.extra, ns)
		}
	}
	slices.Sort(s.extra)
	return s
}

// String lists the allowed namespaces, for logs and messages.
func (s secretScope) String() string {
	if s.all {
		return "all namespaces"
	}
	return strings.Join(append([]string{s.own}, s.extra...), ", ")
}

// check returns nil when namespace may be read, else the reason, naming the flag.
func (s secretScope) check(namespace string) error {
	if s.all || namespace == s.own || slices.Contains(s.extra, namespace) {
		return nil
	}
	return fmt.Errorf("namespace %q is outside the namespaces this dispatcher may read Secrets and ConfigMaps from (%s); "+
		"an admin can allow it with the dispatcher flag --secret-namespaces=%s (Helm value dispatcher.secretNamespaces), "+
		"which also needs a Role granting get on secrets and configmaps in it", namespace, s, namespace)
}

// parseNamespaces parses a --secret-namespaces value: comma-separated namespace names, or *.
func parseNamespaces(v string) ([]string, error) {
	return parseList(v, func(ns string) error {
		if ns == AllNamespaces {
			return nil
		}
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return fmt.Errorf("invalid namespace %q: %s", ns, strings.Join(errs, "; "))
		}
		return nil
	})
}

// parseList splits a comma-separated flag value, dropping blanks, and
// checks each item.
func parseList(v string, check func(string) error) ([]string, error) {
	var out []string
	for _, item := range strings.Split(v, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		if err := check(item); err != nil {
			return nil, err
		}
		out = append(out, item)
	}
	return out, nil
}

// kubeSecrets reads Secrets and ConfigMaps for webhook TLS and auth options (one GET each,
// into the core/v1 structs). It enforces the scope again (the hook client checks it first,
// before reading anything).
type kubeSecrets struct {
	kube  *kubeapi.Client
	scope secretScope
}

var (
	secretsGVR    = corev1.SchemeGroupVersion.WithResource("secrets")
	configMapsGVR = corev1.SchemeGroupVersion.WithResource("configmaps")
)

func (k kubeSecrets) Secret(ctx context.Context, namespace, name string) (map[string][]byte, error) {
	if err := k.scope.check(namespace); err != nil {
		return nil, err
	}
	if err := k.scope.checkSecretName(namespace, name); err != nil {
		return nil, err
	}
	var s corev1.Secret
	if err := k.kube.Get(ctx, &s, kubeapi.Path(secretsGVR, namespace, name, "")...); err != nil {
		return nil, fmt.Errorf("read secret %s/%s: %w", namespace, name, err)
	}
	if err := k.scope.checkSecretRead(namespace, name, s.Labels, s.Type); err != nil {
		return nil, err
	}
	return s.Data, nil
}

// HookCredentialSecretsSetting names where the Secrets of the dispatcher's
// own namespace that may be hook credentials are listed, for refusals.
const HookCredentialSecretsSetting = "the dispatcher flag --hook-credential-secrets (Helm value dispatcher.hookCredentialSecrets)"

// helmReleasePrefix is the name prefix of the Secrets Helm keeps a
// release in (its rendered manifests and values: whatever a chart
// generated, a CA key included).
const helmReleasePrefix = "sh.helm.release.v1."

// helmReleaseType is the type of those Secrets.
const helmReleaseType corev1.SecretType = "helm.sh/release.v1"

// reservedSecret says why a Secret name can never be a hook credential, or
// "" when it may be one. metabus's namespace holds its NATS seeds, TLS keys
// and CA (all named natsx.CredentialsSecretPrefix...) and Helm's release
// Secrets; naming one of them in --hook-credential-secrets is refused too.
func reservedSecret(name string) string {
	switch {
	case strings.HasPrefix(name, natsx.CredentialsSecretPrefix):
		return fmt.Sprintf("holds metabus's own NATS credentials (name prefix %s or label %s)", natsx.CredentialsSecretPrefix, natsx.CredentialsLabel)
	case strings.HasPrefix(name, helmReleasePrefix):
		return fmt.Sprintf("is a Helm release (name prefix %s or type %s), whose values and manifests may hold generated keys", helmReleasePrefix, helmReleaseType)
	}
	return ""
}

// checkSecretName refuses, before anything is read, a Secret that may not
// be a hook credential by its name: whoever may create a controller picks
// the Secret its webhook sends and the URL it goes to, and the dispatcher
// can read every Secret of its own namespace. There only the Secrets the
// operator lists may be sent, and never metabus's own (reservedSecret);
// a Helm release is refused in any namespace.
func (s secretScope) checkSecretName(namespace, name string) error {
	own := namespace == s.own
	if why := reservedSecret(name); why != "" && (own || strings.HasPrefix(name, helmReleasePrefix)) {
		return fmt.Errorf("Secret %s/%s %s and is never sent to a hook", namespace, name, why)
	}
	if own && !slices.Contains(s.ownSecrets, name) {
		return fmt.Errorf("Secret %s/%s is in metabus's own namespace, whose Secrets are never sent to a hook unless the operator lists them "+
			"(%s); put the hook's credentials in a namespace of --secret-namespaces, or list it there", namespace, name, HookCredentialSecretsSetting)
	}
	return nil
}

// checkSecretRead refuses, once read, a Secret that may not be a hook
// credential by what it is: labelled as metabus's NATS credentials (in any
// namespace: a copy is as good as the original), a Helm release, or a
// ServiceAccount token of metabus's own namespace (a service's identity).
// Its data is then dropped, never used.
func (s secretScope) checkSecretRead(namespace, name string, labels map[string]string, typ corev1.SecretType) error {
	if _, ok := labels[natsx.CredentialsLabel]; ok {
		return ownCredentials(namespace, name)
	}
	switch {
	case typ == helmReleaseType:
		return fmt.Errorf("Secret %s/%s %s and is never sent to a hook", namespace, name, reservedSecret(helmReleasePrefix))
	case typ == corev1.SecretTypeServiceAccountToken && namespace == s.own:
		return fmt.Errorf("Secret %s/%s is a ServiceAccount token of metabus's own namespace and is never sent to a hook", namespace, name)
	}
	return nil
}

// parseSecretNames parses a --hook-credential-secrets value: comma-separated
// Secret names, none of them reserved.
func parseSecretNames(v string) ([]string, error) {
	return parseList(v, func(name string) error {
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return fmt.Errorf("invalid Secret name %q: %s", name, strings.Join(errs, "; "))
		}
		if why := reservedSecret(name); why != "" {
			return fmt.Errorf("Secret %q %s: it can never be a hook credential", name, why)
		}
		return nil
	})
}

// ownCredentials refuses one of metabus's own NATS credential Secrets as a
// hook credential: whoever may create a controller picks the Secret its
// webhook sends and the URL it goes to, and a service's nkey seed would let
// them act as that service on the bus. No setting allows it.
func ownCredentials(namespace, name string) error {
	return fmt.Errorf("Secret %s/%s holds metabus's own NATS credentials (name prefix %s or label %s) and is never sent to a hook",
		namespace, name, natsx.CredentialsSecretPrefix, natsx.CredentialsLabel)
}

func (k kubeSecrets) ConfigMap(ctx context.Context, namespace, name string) (map[string]string, error) {
	if err := k.scope.check(namespace); err != nil {
		return nil, err
	}
	var c corev1.ConfigMap
	if err := k.kube.Get(ctx, &c, kubeapi.Path(configMapsGVR, namespace, name, "")...); err != nil {
		return nil, fmt.Errorf("read configmap %s/%s: %w", namespace, name, err)
	}
	return c.Data, nil
}

// RefuseHookCredential applies the dispatcher's rule to one Secret named
// as a hook credential, as a dispatcher running in ownNamespace with
// --hook-credential-secrets=listed would (the namespace scope of
// --secret-namespaces aside): nil when it may be sent, else why not. The
// deploy tests hold every Secret an install creates to it.
func RefuseHookCredential(ownNamespace string, listed []string, s *corev1.Secret) error {
	scope := secretScope{own: ownNamespace, all: true, ownSecrets: listed}
	if err := scope.checkSecretName(s.Namespace, s.Name); err != nil {
		return err
	}
	return scope.checkSecretRead(s.Namespace, s.Name, s.Labels, s.Type)
}
