// Package identity is the contract of a controller's identity: the
// Kubernetes ServiceAccount whose authority a controller's writes and
// reads are made with, named by the controller or by the operator's
// default. It is plain data (a leaf: it imports nothing of metabus), read
// by the applier, which impersonates the account for every write of the
// controller, and by the watcher, which asks the API server what the
// account may read.
//
// A controller names its account with ServiceAccountAnnotation, a
// metabus extension that upstream Metacontroller's CRDs tolerate (an
// annotation, not a spec field). Without it the controller acts as the
// operator's default (--default-service-account), and with no default as
// the services themselves, which is upstream's behaviour. Which accounts
// may be named at all is the operator's choice, made in RBAC: the applier
// may impersonate only the accounts it is granted `impersonate` on.
package identity

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// ServiceAccountAnnotation on a CompositeController, DecoratorController
// or MapController names the ServiceAccount the controller acts as, as
// "<namespace>/<name>" (controllers are cluster-scoped, so the namespace
// is part of the name).
const ServiceAccountAnnotation = "metabus.dev/service-account"

// Identity is a ServiceAccount. The zero Identity is "none": the
// services' own authority (upstream's behaviour).
type Identity struct {
	Namespace string
	Name      string
}

// None reports whether i names no account.
func (i Identity) None() bool { return i.Name == "" }

// String is "<namespace>/<name>", the annotation's form ("" for none).
func (i Identity) String() string {
	if i.None() {
		return ""
	}
	return i.Namespace + "/" + i.Name
}

// Username is the account's user name as the API server authenticates it
// and as impersonation names it (rest.ImpersonationConfig.UserName,
// SubjectAccessReview's user).
func (i Identity) Username() string {
	if i.None() {
		return ""
	}
	return "system:serviceaccount:" + i.Namespace + ":" + i.Name
}

// Groups are the groups the API server puts a ServiceAccount in; an
// impersonated request that names a user without its groups would be
// judged without the bindings made to them.
func (i Identity) Groups() []string {
	if i.None() {
		return nil
	}
	return []string{"system:serviceaccounts", "system:serviceaccounts:" + i.Namespace, "system:authenticated"}
}

// Parse reads "<namespace>/<name>" ("" is none). Both parts must be DNS
// labels (a namespace) and DNS subdomains (a ServiceAccount name), so an
// annotation cannot smuggle another user name into Username.
func Parse(v string) (Identity, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return Identity{}, nil
	}
	ns, name, ok := strings.Cut(v, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return Identity{}, fmt.Errorf("service account %q: want <namespace>/<name>", v)
	}
	if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
		return Identity{}, fmt.Errorf("service account %q: namespace: %s", v, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return Identity{}, fmt.Errorf("service account %q: name: %s", v, strings.Join(errs, "; "))
	}
	return Identity{Namespace: ns, Name: name}, nil
}

// Of is the identity a controller acts as: the account its annotations
// name, else def (the operator's --default-service-account; none for
// upstream's behaviour). An annotation that does not parse is an error,
// never a fallback to def or to the services' authority: the controller
// is refused until it is fixed.
func Of(annotations map[string]string, def Identity) (Identity, error) {
	v, ok := annotations[ServiceAccountAnnotation]
	if !ok {
		return def, nil
	}
	id, err := Parse(v)
	if err != nil {
		return Identity{}, fmt.Errorf("annotation %s: %w", ServiceAccountAnnotation, err)
	}
	if id.None() {
		return def, nil
	}
	return id, nil
}
