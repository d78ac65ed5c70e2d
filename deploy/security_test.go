package deploy

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestNATSMonitoringPortClosed (issue #14): the monitoring port 8222 is
// unauthenticated (/connz, /jsz name connections, subjects and streams), so
// no NetworkPolicy rule opens it to every peer: kustomize opens it to none,
// the Helm chart only to nats.monitoring.allowFrom (empty by default).
func TestNATSMonitoringPortClosed(t *testing.T) {
	var policy map[string]any
	for _, o := range readDocs(t, filepath.Join("nats", "statefulset.yaml")) {
		if str(o, "kind") == "NetworkPolicy" {
			policy = o
		}
	}
	if policy == nil {
		t.Fatal("nats/statefulset.yaml has no NetworkPolicy")
	}
	client := false
	for _, r := range slice(policy, "spec", "ingress") {
		rule := r.(map[string]any)
		var ports []string
		for _, p := range slice(rule, "ports") {
			ports = append(ports, fmt.Sprint(p.(map[string]any)["port"]))
		}
		if slices.Contains(ports, "8222") {
			t.Errorf("NetworkPolicy nats opens 8222: %v", rule)
		}
		client = client || (slices.Contains(ports, "4222") && len(slice(rule, "from")) == 0)
	}
	if !client {
		t.Error("NetworkPolicy nats no longer lets clients reach 4222")
	}

	values := readDocs(t, filepath.Join(chartDir, "values.yaml"))[0]
	if v, found, _ := unstructured.NestedSlice(values, "nats", "monitoring", "allowFrom"); !found || len(v) != 0 {
		t.Errorf("values nats.monitoring.allowFrom = %v, want [] (no one)", v)
	}
	tpl := readFile(t, filepath.Join(chartDir, "templates", "nats.yaml"))
	policyTpl := tpl[strings.Index(tpl, "kind: NetworkPolicy"):]
	if n := strings.Count(policyTpl, "port: 8222"); n != 1 || !strings.Contains(policyTpl, "{{- with .Values.nats.monitoring.allowFrom }}") {
		t.Errorf("templates/nats.yaml NetworkPolicy: 8222 must appear once, inside {{- with .Values.nats.monitoring.allowFrom }}:\n%s", policyTpl)
	}
}

// TestHelmNATSTLS: the chart's NATS TLS (nats.tls) is on by default, with
// certificates the NATS pods' init container makes, and uses a
// byte-identical copy of the shipped tls.conf; TestHelmRender checks what
// it renders.
func TestHelmNATSTLS(t *testing.T) {
	if readFile(t, filepath.Join(chartDir, "files", "nats-tls.conf")) != readFile(t, filepath.Join("nats", "tls.conf")) {
		t.Error("helm/metabus/files/nats-tls.conf differs from nats/tls.conf; copy it: cp deploy/nats/tls.conf deploy/helm/metabus/files/nats-tls.conf")
	}
	values := readDocs(t, filepath.Join(chartDir, "values.yaml"))[0]
	if on, _, _ := unstructured.NestedBool(values, "nats", "tls", "enabled"); !on {
		t.Error("values nats.tls.enabled is false; TLS is on by default, plaintext an explicit choice")
	}
	if got, _, _ := unstructured.NestedString(values, "nats", "tls", "certificates"); got != "generate" {
		t.Errorf("values nats.tls.certificates = %q, want generate", got)
	}
}
