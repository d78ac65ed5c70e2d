package revisions

import (
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/revstore"
)

func TestServes(t *testing.T) {
	ctrl := func(apiVersion, resource string) *v1alpha1.CompositeController {
		return &v1alpha1.CompositeController{
			ObjectMeta: metav1.ObjectMeta{Name: "catsets", UID: types.UID("ctrl-uid")},
			Spec: v1alpha1.CompositeControllerSpec{ParentResource: v1alpha1.CompositeControllerParentResourceRule{
				ResourceRule: v1alpha1.ResourceRule{APIVersion: apiVersion, Resource: resource}}},
		}
	}
	ref := bus.ControllerRef{Kind: v1alpha1.CompositeControllerKind, Name: "catsets", UID: "ctrl-uid"}
	cats := revstore.Parent{APIVersion: "example.com/v1", Kind: "CatSet", Resource: "catsets", Namespace: "team-a", Name: "c", UID: "p"}
	tests := []struct {
		reason string
		c      *v1alpha1.CompositeController
		ref    bus.ControllerRef
		parent revstore.Parent
		want   string // "" when served; else a part of the error
	}{
		{reason: "the controller of the parent's resource", c: ctrl("example.com/v1", "catsets"), ref: ref, parent: cats},
		{reason: "another version of the same group serves it too", c: ctrl("example.com/v1beta1", "catsets"), ref: ref, parent: cats},
		{reason: "a request without the controller's UID is checked on the rest", c: ctrl("example.com/v1", "catsets"),
			ref: bus.ControllerRef{Kind: v1alpha1.CompositeControllerKind, Name: "catsets"}, parent: cats},
		{reason: "a parent of another resource", c: ctrl("example.com/v1", "catsets"), ref: ref,
			parent: revstore.Parent{APIVersion: "apps/v1", Resource: "deployments", Namespace: "kube-system", Name: "coredns", UID: "x"},
			want:   `serves catsets.example.com, not the parent's deployments.apps`},
		{reason: "the same resource name in another group", c: ctrl("example.com/v1", "catsets"), ref: ref,
			parent: revstore.Parent{APIVersion: "other.example/v1", Resource: "catsets", Namespace: "a", Name: "c", UID: "x"},
			want:   `not the parent's catsets.other.example`},
		{reason: "a core-group parent against a controller of a named group", c: ctrl("example.com/v1", "configmaps"), ref: ref,
			parent: revstore.Parent{APIVersion: "v1", Resource: "configmaps", Namespace: "a", Name: "c", UID: "x"},
			want:   `not the parent's configmaps`},
		{reason: "a controller that does not exist", ref: ref, parent: cats, want: `no CompositeController "catsets" exists`},
		{reason: "a controller of the same name but another UID (deleted and made again)", c: ctrl("example.com/v1", "catsets"),
			ref: bus.ControllerRef{Kind: v1alpha1.CompositeControllerKind, Name: "catsets", UID: "old-uid"}, parent: cats,
			want: "has UID ctrl-uid, not the request's old-uid"},
		{reason: "a DecoratorController has no revisions", c: ctrl("example.com/v1", "catsets"),
			ref: bus.ControllerRef{Kind: "DecoratorController", Name: "catsets"}, parent: cats, want: `controller kind "DecoratorController" has no revisions`},
		{reason: "no controller at all", parent: cats, want: `controller kind "" has no revisions`},
		{reason: "a controller without a name", c: ctrl("example.com/v1", "catsets"),
			ref: bus.ControllerRef{Kind: v1alpha1.CompositeControllerKind}, parent: cats, want: "names no controller"},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			err := serves(tt.c, tt.ref, tt.parent)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if (tt.want == "") != (got == "") || !strings.Contains(got, tt.want) {
				t.Errorf("serves = %q, want %q", got, tt.want)
			}
		})
	}
}

// A request whose parent is not one its controller serves is refused
// before anything is read or written: a holder of a stage's NATS
// credentials naming a real controller cannot reach another resource's
// revisions, and one naming no controller, or one that does not exist,
// reaches none.
func TestRequestsOfUnservedParentsRefused(t *testing.T) {
	requireEnv(t)
	s, _ := newService(t, nil)
	ns := newNamespace(t)
	cats := catSet(ns, "cats", "uid-a")
	existing := create(t, rev(cats, "catsets.example.com-old", `{"spec":{"v":1}}`, "cats-0"))
	catsCtrl := servedBy(t, cats)
	dogs := revstore.Parent{APIVersion: "example.com/v1", Kind: "DogSet", Resource: "dogsets", Namespace: ns, Name: "dogs", UID: "uid-d"}
	dogsCtrl := compositeController(t, "dogsets-refusal.example.com", "example.com/v1", "dogsets")
	tests := []struct {
		reason string
		req    revstore.Request
		want   string
	}{
		{reason: "load with another resource's controller", want: "serves dogsets.example.com, not the parent's catsets.example.com",
			req: revstore.Request{Op: revstore.OpLoad, Controller: dogsCtrl, Parent: cats}},
		{reason: "delete with another resource's controller", want: "serves dogsets.example.com",
			req: revstore.Request{Op: revstore.OpCommit, Controller: dogsCtrl, Parent: cats, Deletes: []v1alpha1.ControllerRevision{existing}}},
		{reason: "load naming no controller", want: "has no revisions",
			req: revstore.Request{Op: revstore.OpLoad, Controller: bus.ControllerRef{Kind: "x"}, Parent: cats}},
		{reason: "load naming a controller that does not exist", want: `no CompositeController "nobody" exists`,
			req: revstore.Request{Op: revstore.OpLoad, Controller: bus.ControllerRef{Kind: v1alpha1.CompositeControllerKind, Name: "nobody"}, Parent: cats}},
		{reason: "a stale controller UID", want: "not the request's stale",
			req: revstore.Request{Op: revstore.OpLoad, Controller: bus.ControllerRef{Kind: v1alpha1.CompositeControllerKind, Name: catsCtrl.Name, UID: "stale"}, Parent: cats}},
		{reason: "a dog parent with the cats' controller", want: "serves catsets.example.com, not the parent's dogsets.example.com",
			req: revstore.Request{Op: revstore.OpLoad, Controller: catsCtrl, Parent: dogs}},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			resp := call(t, s, tt.req)
			got := []string{resp.Result, strings.Join(names(resp.Revisions), ",")}
			if diff := cmp.Diff([]string{revstore.Invalid, ""}, got); diff != "" || !strings.Contains(resp.Message, tt.want) {
				t.Errorf("(-want +got):\n%s\nmessage %q, want it to contain %q", diff, resp.Message, tt.want)
			}
			if got := storedNames(t, ns); !slices.Equal(got, []string{existing.Name}) {
				t.Errorf("stored %v, want only %s", got, existing.Name)
			}
		})
	}
	// The parent's own controller is served.
	mustOK(t, call(t, s, revstore.Request{Op: revstore.OpLoad, Controller: catsCtrl, Parent: cats}))
}
