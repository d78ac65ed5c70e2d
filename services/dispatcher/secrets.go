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
	var out []string
	for _, ns := range strings.Split(v, ",") {
		ns = strings.TrimSpace(ns)
		if ns == "" {
			continue
		}
		if ns != AllNamespaces {
			if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
				return nil, fmt.Errorf("invalid namespace %q: %s", ns, strings.Join(errs, "; "))
			}
		}
		out = append(out, ns)
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
	if namespace == k.scope.own && strings.HasPrefix(name, natsx.CredentialsSecretPrefix) {
		return nil, ownCredentials(namespace, name)
	}
	var s corev1.Secret
	if err := k.kube.Get(ctx, &s, kubeapi.Path(secretsGVR, namespace, name, "")...); err != nil {
		return nil, fmt.Errorf("read secret %s/%s: %w", namespace, name, err)
	}
	if _, ok := s.Labels[natsx.CredentialsLabel]; ok {
		return nil, ownCredentials(namespace, name)
	}
	return s.Data, nil
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
