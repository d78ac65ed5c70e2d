package mapctl

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/snapshot"
)

// object builds a test object; mods adjust it.
func object(apiVersion, kind, namespace, name, uid string, mods ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind}}
	u.SetName(name)
	u.SetNamespace(namespace)
	u.SetUID(types.UID(uid))
	for _, m := range mods {
		m(u)
	}
	return u
}

func withLabels(l map[string]string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) { u.SetLabels(l) }
}

func withKey(key string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		l := u.GetLabels()
		if l == nil {
			l = map[string]string{}
		}
		l[MapKeyLabel] = key
		u.SetLabels(l)
	}
}

func controlledBy(uid string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		yes := true
		u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "ctl.example.com/v1", Kind: "SnapshotSchedule", Name: "p", UID: types.UID(uid), Controller: &yes}})
	}
}

func deleting(u *unstructured.Unstructured) {
	now := metav1.Now()
	u.SetDeletionTimestamp(&now)
}

func withField(value any, fields ...string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		if err := unstructured.SetNestedField(u.Object, value, fields...); err != nil {
			panic(err) // test setup only
		}
	}
}

// names lists objects as "namespace/name" (or "name"), for compact diffs.
func names(objs []*unstructured.Unstructured) []string {
	out := []string{}
	for _, o := range objs {
		out = append(out, objName(o))
	}
	return out
}

// groupNames lists each group's objects by name.
func groupNames(groups []snapshot.Group) [][]string {
	out := [][]string{}
	for _, g := range groups {
		out = append(out, names(g.Objects))
	}
	return out
}

// Two output resources, as a snapshot holds them.
func outputGroups(snaps, cms []*unstructured.Unstructured) []snapshot.Group {
	return []snapshot.Group{
		{APIVersion: "snapshot.storage.k8s.io/v1", Resource: "volumesnapshots", Kind: "VolumeSnapshot", Namespaced: true, Objects: snaps},
		{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true, Objects: cms},
	}
}
