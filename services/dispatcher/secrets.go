package dispatcher

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// kubeSecrets reads Secrets and ConfigMaps for webhook TLS and auth options.
type kubeSecrets struct{ kube kubernetes.Interface }

func (k kubeSecrets) Secret(ctx context.Context, namespace, name string) (map[string][]byte, error) {
	s, err := k.kube.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read secret %s/%s: %w", namespace, name, err)
	}
	return s.Data, nil
}

func (k kubeSecrets) ConfigMap(ctx context.Context, namespace, name string) (map[string]string, error) {
	c, err := k.kube.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("read configmap %s/%s: %w", namespace, name, err)
	}
	return c.Data, nil
}
