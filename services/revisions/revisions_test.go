package revisions

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/internal/testing/kubeenv"
	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/embeddednats"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/obs"
	"github.com/metabus/metabus/pkg/revision"
	"github.com/metabus/metabus/pkg/revstore"
)

// env is the control plane shared by the package's tests; nil with -short.
var (
	env *kubeenv.Env
	dyn dynamic.Interface
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	e, err := kubeenv.Start(ctx, kubeenv.Options{NoControllerManager: true, CRDs: []string{"../../deploy/crds/controllerrevisions.yaml", "../../deploy/crds/compositecontrollers.yaml"}})
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "revisions tests: start control plane: %v\n", err)
		os.Exit(1)
	}
	env = e
	dyn = dynamic.NewForConfigOrDie(env.Config)
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "revisions tests: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

func requireEnv(t *testing.T) {
	t.Helper()
	if testing.Short() || env == nil {
		t.Skip("needs a real kube-apiserver; skipped with -short")
	}
}

// newNamespace creates a namespace of its own for a test.
func newNamespace(t *testing.T) string {
	t.Helper()
	ns := &unstructured.Unstructured{}
	ns.SetAPIVersion("v1")
	ns.SetKind("Namespace")
	ns.SetGenerateName("rev-")
	created, err := dyn.Resource(corev1.SchemeGroupVersion.WithResource("namespaces")).Create(t.Context(), ns, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	return created.GetName()
}

// newService builds a service with its own metrics registry, optionally
// wrapping its API transport.
func newService(t *testing.T, wrap func(http.RoundTripper) http.RoundTripper) (*Service, *prometheus.Registry) {
	t.Helper()
	rc := rest.CopyConfig(env.Config)
	rc.WrapTransport = wrap
	reg := prometheus.NewRegistry()
	s, err := New(Config{}, Deps{REST: rc, Log: zaptest.NewLogger(t), Metrics: reg})
	if err != nil {
		t.Fatal(err)
	}
	return s, reg
}

// catSets returns a parent of resource catsets.example.com in ns.
func catSet(ns, name, uid string) revstore.Parent {
	return revstore.Parent{APIVersion: "example.com/v1", Kind: "CatSet", Resource: "catsets", Namespace: ns, Name: name, UID: uid, Selector: "app=" + name}
}

func controllerRef(p revstore.Parent) metav1.OwnerReference {
	yes := true
	return metav1.OwnerReference{APIVersion: p.APIVersion, Kind: p.Kind, Name: p.Name, UID: types.UID(p.UID), Controller: &yes, BlockOwnerDeletion: &yes}
}

// rev builds a revision of parent p (labels of its group and resource plus
// app=<parent name>, controlled by p) named name.
func rev(p revstore.Parent, name string, patch string, names ...string) v1alpha1.ControllerRevision {
	group, _, _ := strings.Cut(p.APIVersion, "/")
	if !strings.Contains(p.APIVersion, "/") {
		group = ""
	}
	return v1alpha1.ControllerRevision{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.ControllerRevisionKind},
		ObjectMeta: metav1.ObjectMeta{
			Name:            name,
			Namespace:       p.Namespace,
			Labels:          revision.Labels(map[string]string{"app": p.Name}, "", group, p.Resource),
			OwnerReferences: []metav1.OwnerReference{controllerRef(p)},
		},
		ParentPatch: json.RawMessage(patch),
		Children:    []v1alpha1.ControllerRevisionChildren{{APIGroup: "", Kind: "Pod", Names: names}},
	}
}

// orphan is rev without any controller reference.
func orphan(p revstore.Parent, name string, refs ...metav1.OwnerReference) v1alpha1.ControllerRevision {
	r := rev(p, name, `{"spec":{"v":"old"}}`)
	r.OwnerReferences = refs
	return r
}

// create writes a revision directly (a fixture), returning it as stored.
func create(t *testing.T, r v1alpha1.ControllerRevision) v1alpha1.ControllerRevision {
	t.Helper()
	u, err := encode(r)
	if err != nil {
		t.Fatal(err)
	}
	out, err := dyn.Resource(v1alpha1.ControllerRevisionGVR).Namespace(r.Namespace).Create(t.Context(), u, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create fixture %s: %v", r.Name, err)
	}
	got, err := decode(out)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// get returns a revision as stored, or nil if it does not exist.
func get(t *testing.T, ns, name string) *v1alpha1.ControllerRevision {
	t.Helper()
	u, err := dyn.Resource(v1alpha1.ControllerRevisionGVR).Namespace(ns).Get(t.Context(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	r, err := decode(u)
	if err != nil {
		t.Fatal(err)
	}
	return &r
}

// storedNames lists every revision in ns.
func storedNames(t *testing.T, ns string) []string {
	t.Helper()
	list, err := dyn.Resource(v1alpha1.ControllerRevisionGVR).Namespace(ns).List(t.Context(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, u := range list.Items {
		out = append(out, u.GetName())
	}
	slices.Sort(out)
	return out
}

func names(rs []v1alpha1.ControllerRevision) []string {
	out := []string{}
	for _, r := range rs {
		out = append(out, r.Name)
	}
	return out
}

// call serves req; a request naming no controller is sent as the
// controller serving its parent's resource would send it (servedBy).
func call(t *testing.T, s revstore.Store, req revstore.Request) *revstore.Response {
	t.Helper()
	if req.Controller == (bus.ControllerRef{}) && req.Parent.Resource != "" {
		req.Controller = servedBy(t, req.Parent)
	}
	resp, err := s.Revisions(t.Context(), req)
	if err != nil {
		t.Fatalf("%s: %v", req.Op, err)
	}
	return resp
}

func mustOK(t *testing.T, resp *revstore.Response) {
	t.Helper()
	if resp.Result != revstore.OK {
		t.Fatalf("result %s (%s), want ok", resp.Result, resp.Message)
	}
}

func controllerUID(r *v1alpha1.ControllerRevision) string {
	if ref := metav1.GetControllerOfNoCopy(r); ref != nil {
		return string(ref.UID)
	}
	return ""
}

func TestLoadOnlyTheParentsRevisions(t *testing.T) {
	requireEnv(t)
	s, reg := newService(t, nil)
	ns, otherNS := newNamespace(t), newNamespace(t)
	a := catSet(ns, "cats", "uid-a")
	b := catSet(ns, "kittens", "uid-b")
	dogs := revstore.Parent{APIVersion: "example.com/v1", Kind: "DogSet", Resource: "dogsets", Namespace: ns, Name: "cats", UID: "uid-a"}
	elsewhere := a
	elsewhere.Namespace = otherNS
	create(t, rev(a, "catsets.example.com-2", `{"spec":{"v":2}}`, "cats-1"))
	create(t, rev(a, "catsets.example.com-1", `{"spec":{"v":1}}`, "cats-0"))
	create(t, rev(b, "catsets.example.com-b", `{"spec":{"v":1}}`))
	// Same UID as a, but the labels of another resource: not a's.
	create(t, rev(dogs, "dogsets.example.com-1", `{"spec":{"v":1}}`))
	create(t, rev(elsewhere, "catsets.example.com-3", `{"spec":{"v":3}}`))

	resp := call(t, s, revstore.Request{Op: revstore.OpLoad, Parent: a})
	mustOK(t, resp)
	if got, want := names(resp.Revisions), []string{"catsets.example.com-1", "catsets.example.com-2"}; !slices.Equal(got, want) {
		t.Fatalf("loaded %v, want %v (sorted, only parent a's in its namespace and resource)", got, want)
	}
	r := resp.Revisions[1]
	if string(r.ParentPatch) != `{"spec":{"v":2}}` || len(r.Children) != 1 || !slices.Equal(r.Children[0].Names, []string{"cats-1"}) {
		t.Errorf("decoded %s: parentPatch %s children %+v", r.Name, r.ParentPatch, r.Children)
	}
	if r.ResourceVersion == "" || r.UID == "" || r.Namespace != ns {
		t.Errorf("decoded %s lacks metadata: %+v", r.Name, r.ObjectMeta)
	}
	if got := names(call(t, s, revstore.Request{Op: revstore.OpLoad, Parent: b}).Revisions); !slices.Equal(got, []string{"catsets.example.com-b"}) {
		t.Errorf("parent b loaded %v", got)
	}
	if got := loadsServed(t, reg); got != 2 {
		t.Errorf("metabus_revisions_requests_total{op=load,result=ok} = %v, want 2", got)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(mfs, func(mf *dto.MetricFamily) bool {
		return mf.GetName() == "metabus_revisions_request_duration_seconds" && len(mf.GetMetric()) == 1 && mf.GetMetric()[0].GetHistogram().GetSampleCount() == 2
	}) {
		t.Error("no duration histogram with the 2 loads")
	}
}

// TestLoadAllowStale: a load that allows a stale answer asks the API server
// for its watch cache (resourceVersion=0) and filters the same way; a
// consistent load never does.
func TestLoadAllowStale(t *testing.T) {
	requireEnv(t)
	var mu sync.Mutex
	var rvs []string // resourceVersion of every ControllerRevision LIST
	s, _ := newService(t, func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/controllerrevisions") {
				mu.Lock()
				rvs = append(rvs, req.URL.Query().Get("resourceVersion"))
				mu.Unlock()
			}
			return rt.RoundTrip(req)
		})
	})
	ns := newNamespace(t)
	a := catSet(ns, "cats", "uid-a")
	create(t, rev(a, "catsets.example.com-1", `{"spec":{"v":1}}`, "cats-0"))
	create(t, rev(catSet(ns, "kittens", "uid-b"), "catsets.example.com-b", `{"spec":{"v":1}}`))

	mustOK(t, call(t, s, revstore.Request{Op: revstore.OpLoad, Parent: a}))
	var got []string
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) { // the watch cache may lag the creates by a moment
		resp := call(t, s, revstore.Request{Op: revstore.OpLoad, Parent: a, AllowStale: true})
		mustOK(t, resp)
		if got = names(resp.Revisions); len(got) == 1 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !slices.Equal(got, []string{"catsets.example.com-1"}) {
		t.Fatalf("stale load returned %v, want only parent a's revision", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(rvs) < 2 || rvs[0] != "" || slices.ContainsFunc(rvs[1:], func(rv string) bool { return rv != "0" }) {
		t.Errorf("LIST resourceVersions %q, want \"\" for the consistent load, then \"0\"", rvs)
	}
}

// A parent of the core group has revisions labelled with an empty API group.
func TestLoadCoreGroupParent(t *testing.T) {
	requireEnv(t)
	s, _ := newService(t, nil)
	ns := newNamespace(t)
	p := revstore.Parent{APIVersion: "v1", Kind: "ConfigMap", Resource: "configmaps", Namespace: ns, Name: "cm", UID: "uid-cm"}
	create(t, rev(p, "configmaps.core-1", `{}`))
	create(t, rev(catSet(ns, "cm", "uid-cm"), "catsets.example.com-1", `{}`))
	resp := call(t, s, revstore.Request{Op: revstore.OpLoad, Parent: p})
	mustOK(t, resp)
	if got := names(resp.Revisions); !slices.Equal(got, []string{"configmaps.core-1"}) {
		t.Errorf("loaded %v, want only the core-group revision", got)
	}
}

func TestLoadAdopts(t *testing.T) {
	requireEnv(t)
	s, _ := newService(t, nil)
	ns := newNamespace(t)
	p := catSet(ns, "cats", "uid-a")
	other := catSet(ns, "cats", "uid-other") // same labels, another parent
	owner := metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "keep", UID: "uid-keep"}
	stranger := catSet(ns, "dogs", "uid-stranger")
	create(t, rev(p, "owned", `{}`))
	create(t, orphan(p, "orphan-match", owner))
	create(t, orphan(stranger, "orphan-nomatch"))
	create(t, rev(other, "other-parent", `{}`))

	t.Run("without Adopt nothing is adopted", func(t *testing.T) {
		resp := call(t, s, revstore.Request{Op: revstore.OpLoad, Parent: p})
		mustOK(t, resp)
		if got := names(resp.Revisions); !slices.Equal(got, []string{"owned"}) {
			t.Errorf("loaded %v, want [owned]", got)
		}
		if uid := controllerUID(get(t, ns, "orphan-match")); uid != "" {
			t.Errorf("orphan-match adopted by %s", uid)
		}
	})
	t.Run("Adopt without a selector adopts nothing", func(t *testing.T) {
		noSel := p
		noSel.Selector = ""
		resp := call(t, s, revstore.Request{Op: revstore.OpLoad, Parent: noSel, Adopt: true})
		mustOK(t, resp)
		if got := names(resp.Revisions); !slices.Equal(got, []string{"owned"}) {
			t.Errorf("loaded %v, want [owned]", got)
		}
	})
	t.Run("Adopt adopts only matching orphans", func(t *testing.T) {
		resp := call(t, s, revstore.Request{Op: revstore.OpLoad, Parent: p, Adopt: true})
		mustOK(t, resp)
		if got := names(resp.Revisions); !slices.Equal(got, []string{"orphan-match", "owned"}) {
			t.Fatalf("loaded %v, want [orphan-match owned]", got)
		}
		adopted := get(t, ns, "orphan-match")
		if controllerUID(adopted) != p.UID {
			t.Fatalf("orphan-match has ownerReferences %+v, want a controller reference to %s", adopted.OwnerReferences, p.UID)
		}
		if len(adopted.OwnerReferences) != 2 || adopted.OwnerReferences[0].UID != owner.UID {
			t.Errorf("existing owner references not kept: %+v", adopted.OwnerReferences)
		}
		ref := metav1.GetControllerOfNoCopy(adopted)
		if ref.Kind != p.Kind || ref.Name != p.Name || ref.APIVersion != p.APIVersion || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
			t.Errorf("controller reference %+v", ref)
		}
		if resp.Revisions[0].ResourceVersion != adopted.ResourceVersion {
			t.Errorf("loaded resourceVersion %s, stored %s: the load must return the adopted object", resp.Revisions[0].ResourceVersion, adopted.ResourceVersion)
		}
		for _, tc := range []struct{ name, want, reason string }{
			{"orphan-nomatch", "", "its labels do not match the parent's selector"},
			{"other-parent", other.UID, "another parent controls it"},
		} {
			if got := controllerUID(get(t, ns, tc.name)); got != tc.want {
				t.Errorf("%s is controlled by %q, want %q: %s", tc.name, got, tc.want, tc.reason)
			}
		}
	})
	t.Run("malformed selector", func(t *testing.T) {
		bad := p
		bad.Selector = "app in (("
		if resp := call(t, s, revstore.Request{Op: revstore.OpLoad, Parent: bad, Adopt: true}); resp.Result != revstore.Invalid {
			t.Errorf("result %s (%s), want invalid", resp.Result, resp.Message)
		}
	})
}

// An orphan that changes between the LIST and the adoption patch is skipped
// (the patch carries the listed resourceVersion), not adopted over the
// change and not a failure of the load.
func TestLoadAdoptConflictSkips(t *testing.T) {
	requireEnv(t)
	ns := newNamespace(t)
	p := catSet(ns, "cats", "uid-a")
	thief := catSet(ns, "cats", "uid-thief")
	create(t, rev(p, "owned", `{}`))
	create(t, orphan(p, "contested"))
	create(t, orphan(p, "gone"))
	var raced atomic.Int32
	s, _ := newService(t, func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method == http.MethodPatch {
				// Someone else wins the race for each orphan first.
				raced.Add(1)
				switch name := req.URL.Path[strings.LastIndex(req.URL.Path, "/")+1:]; name {
				case "contested":
					adoptBy(t, ns, name, thief)
				case "gone":
					if err := dyn.Resource(v1alpha1.ControllerRevisionGVR).Namespace(ns).Delete(req.Context(), name, metav1.DeleteOptions{}); err != nil {
						t.Errorf("delete %s: %v", name, err)
					}
				}
			}
			return rt.RoundTrip(req)
		})
	})
	resp := call(t, s, revstore.Request{Op: revstore.OpLoad, Parent: p, Adopt: true})
	mustOK(t, resp)
	if raced.Load() != 2 {
		t.Fatalf("%d adoption patches, want 2", raced.Load())
	}
	if got := names(resp.Revisions); !slices.Equal(got, []string{"owned"}) {
		t.Errorf("loaded %v, want [owned]: the contested and deleted orphans are skipped", got)
	}
	if got := controllerUID(get(t, ns, "contested")); got != thief.UID {
		t.Errorf("contested is controlled by %q, want the winner %q", got, thief.UID)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// adoptBy sets p's controller reference on a revision, as a competing
// controller would.
func adoptBy(t *testing.T, ns, name string, p revstore.Parent) {
	t.Helper()
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": []metav1.OwnerReference{controllerRef(p)}}})
	if _, err := dyn.Resource(v1alpha1.ControllerRevisionGVR).Namespace(ns).Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Errorf("adopt %s by %s: %v", name, p.UID, err)
	}
}

func TestCommit(t *testing.T) {
	requireEnv(t)
	s, _ := newService(t, nil)
	ns := newNamespace(t)
	p := catSet(ns, "cats", "uid-a")
	ctrl := servedBy(t, p)
	old := create(t, rev(p, "catsets.example.com-old", `{"spec":{"v":1}}`, "cats-0", "cats-1"))
	stale := create(t, rev(p, "catsets.example.com-stale", `{"spec":{"v":0}}`))

	// A rollout step: a new revision takes cats-1, the old keeps cats-0,
	// and an empty revision is pruned.
	latest := rev(p, "catsets.example.com-new", `{"spec":{"v":2}}`, "cats-1")
	moved := old
	moved.Children = []v1alpha1.ControllerRevisionChildren{{Kind: "Pod", Names: []string{"cats-0"}}}
	resp := call(t, s, revstore.Request{Op: revstore.OpCommit, Controller: ctrl, Parent: p,
		Creates: []v1alpha1.ControllerRevision{latest}, Updates: []v1alpha1.ControllerRevision{moved}, Deletes: []v1alpha1.ControllerRevision{stale}})
	mustOK(t, resp)

	if got, want := storedNames(t, ns), []string{"catsets.example.com-new", "catsets.example.com-old"}; !slices.Equal(got, want) {
		t.Fatalf("stored %v, want %v", got, want)
	}
	created, updated := get(t, ns, "catsets.example.com-new"), get(t, ns, "catsets.example.com-old")
	if string(created.ParentPatch) != `{"spec":{"v":2}}` || !slices.Equal(created.Children[0].Names, []string{"cats-1"}) || controllerUID(created) != p.UID {
		t.Errorf("created %+v", created)
	}
	if !slices.Equal(updated.Children[0].Names, []string{"cats-0"}) || string(updated.ParentPatch) != `{"spec":{"v":1}}` {
		t.Errorf("updated %+v", updated)
	}
	if want := maxRV(t, created.ResourceVersion, updated.ResourceVersion); resp.ResourceVersion != want {
		t.Errorf("commit resourceVersion %q, want the highest written %q", resp.ResourceVersion, want)
	}

	// What was committed is what the next load returns.
	load := call(t, s, revstore.Request{Op: revstore.OpLoad, Parent: p})
	mustOK(t, load)
	if got := names(load.Revisions); !slices.Equal(got, []string{"catsets.example.com-new", "catsets.example.com-old"}) {
		t.Errorf("loaded %v after the commit", got)
	}

	t.Run("empty commit", func(t *testing.T) {
		resp := call(t, s, revstore.Request{Op: revstore.OpCommit, Parent: p})
		if resp.Result != revstore.OK || resp.ResourceVersion != "" {
			t.Errorf("empty commit: %+v", resp)
		}
	})
	t.Run("deleting a revision that is already gone", func(t *testing.T) {
		resp := call(t, s, revstore.Request{Op: revstore.OpCommit, Parent: p, Deletes: []v1alpha1.ControllerRevision{stale}})
		mustOK(t, resp)
	})
}

func maxRV(t *testing.T, a, b string) string {
	t.Helper()
	c, err := resourceversion.CompareResourceVersion(a, b)
	if err != nil {
		t.Fatal(err)
	}
	if c >= 0 {
		return a
	}
	return b
}

// A commit computed from an outdated view stops at the first conflicting
// write: what came before it is written, nothing after it is.
func TestCommitConflicts(t *testing.T) {
	requireEnv(t)
	s, _ := newService(t, nil)
	cases := []struct {
		name, reason string
		// build outdates the loaded fixtures a and b as the case needs
		// and returns the commit to try.
		build func(t *testing.T, p revstore.Parent, a, b v1alpha1.ControllerRevision) revstore.Request
		// stored is what must be in the namespace afterwards; a and b
		// keep the resourceVersions they had before the commit.
		stored []string
	}{
		{
			name:   "stale update",
			reason: "a changed after it was loaded; b's later update and the delete must not happen",
			build: func(t *testing.T, p revstore.Parent, a, b v1alpha1.ControllerRevision) revstore.Request {
				touch(t, a)
				a.Children = nil
				b.Children = nil
				return revstore.Request{Op: revstore.OpCommit, Parent: p,
					Creates: []v1alpha1.ControllerRevision{rev(p, "c", `{"v":"c"}`)},
					Updates: []v1alpha1.ControllerRevision{a, b}, Deletes: []v1alpha1.ControllerRevision{b}}
			},
			stored: []string{"a", "b", "c"},
		},
		{
			name:   "create of an existing revision",
			reason: "someone else created it; the updates after it must not happen",
			build: func(t *testing.T, p revstore.Parent, a, b v1alpha1.ControllerRevision) revstore.Request {
				b.Children = nil
				return revstore.Request{Op: revstore.OpCommit, Parent: p,
					Creates: []v1alpha1.ControllerRevision{rev(p, "c", `{}`), rev(p, "a", `{}`), rev(p, "d", `{}`)},
					Updates: []v1alpha1.ControllerRevision{b}}
			},
			stored: []string{"a", "b", "c"},
		},
		{
			name:   "update of a deleted revision",
			reason: "it was pruned by someone else: the view is outdated",
			build: func(t *testing.T, p revstore.Parent, a, b v1alpha1.ControllerRevision) revstore.Request {
				if err := dyn.Resource(v1alpha1.ControllerRevisionGVR).Namespace(p.Namespace).Delete(t.Context(), "a", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				return revstore.Request{Op: revstore.OpCommit, Parent: p,
					Updates: []v1alpha1.ControllerRevision{a}, Deletes: []v1alpha1.ControllerRevision{b}}
			},
			stored: []string{"b"},
		},
		{
			name:   "stale delete",
			reason: "b changed after it was loaded (a child moved into it): deleting it would lose that",
			build: func(t *testing.T, p revstore.Parent, a, b v1alpha1.ControllerRevision) revstore.Request {
				touch(t, b)
				return revstore.Request{Op: revstore.OpCommit, Parent: p, Deletes: []v1alpha1.ControllerRevision{b, a}}
			},
			stored: []string{"a", "b"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := newNamespace(t)
			p := catSet(ns, "cats", "uid-a")
			a := create(t, rev(p, "a", `{"v":"a"}`, "cats-0"))
			b := create(t, rev(p, "b", `{"v":"b"}`, "cats-1"))
			req := tc.build(t, p, a, b)
			before := map[string]string{}
			for _, n := range []string{"a", "b"} {
				if r := get(t, ns, n); r != nil {
					before[n] = r.ResourceVersion
				}
			}
			resp := call(t, s, req)
			if resp.Result != revstore.Conflict || resp.Message == "" {
				t.Fatalf("result %s (%q), want conflict: %s", resp.Result, resp.Message, tc.reason)
			}
			if got := storedNames(t, ns); !slices.Equal(got, tc.stored) {
				t.Errorf("stored %v, want %v: %s", got, tc.stored, tc.reason)
			}
			for n, rv := range before {
				if r := get(t, ns, n); r != nil && r.ResourceVersion != rv {
					t.Errorf("%s was written after the conflict (resourceVersion %s → %s): %s", n, rv, r.ResourceVersion, tc.reason)
				}
			}
		})
	}
}

// touch changes a stored revision, outdating every loaded copy.
func touch(t *testing.T, r v1alpha1.ControllerRevision) {
	t.Helper()
	patch := []byte(`{"metadata":{"annotations":{"touched":"yes"}}}`)
	if _, err := dyn.Resource(v1alpha1.ControllerRevisionGVR).Namespace(r.Namespace).Patch(t.Context(), r.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// Commits that would write revisions the parent does not own (or that a
// later load would not find) are rejected whole: nothing is written, not
// even the valid writes before the bad one.
func TestCommitInvalid(t *testing.T) {
	requireEnv(t)
	s, _ := newService(t, nil)
	ns := newNamespace(t)
	p := catSet(ns, "cats", "uid-a")
	existing := create(t, rev(p, "existing", `{}`))
	valid := rev(p, "valid", `{}`)
	noRV := existing
	noRV.ResourceVersion = ""
	cases := []struct {
		name, reason string
		req          revstore.Request
	}{
		{"wrong namespace", "revisions live in the parent's namespace", revstore.Request{
			Creates: []v1alpha1.ControllerRevision{valid, with(rev(p, "x", `{}`), func(r *v1alpha1.ControllerRevision) { r.Namespace = "default" })}}},
		{"no owner", "a create without a controller reference would be an orphan", revstore.Request{
			Creates: []v1alpha1.ControllerRevision{valid, orphan(p, "x")}}},
		{"another owner", "it would create a revision of another parent", revstore.Request{
			Creates: []v1alpha1.ControllerRevision{valid, rev(catSet(ns, "cats", "uid-b"), "x", `{}`)}}},
		{"no owner on update", "the update would release the revision", revstore.Request{
			Creates: []v1alpha1.ControllerRevision{valid},
			Updates: []v1alpha1.ControllerRevision{with(existing, func(r *v1alpha1.ControllerRevision) { r.OwnerReferences = nil })}}},
		{"missing labels", "a later load would not find it", revstore.Request{
			Creates: []v1alpha1.ControllerRevision{valid, with(rev(p, "x", `{}`), func(r *v1alpha1.ControllerRevision) { delete(r.Labels, revision.LabelResource) })}}},
		{"update without resourceVersion", "writes are conditional on the loaded version", revstore.Request{
			Creates: []v1alpha1.ControllerRevision{valid}, Updates: []v1alpha1.ControllerRevision{noRV}}},
		{"delete without resourceVersion", "writes are conditional on the loaded version", revstore.Request{
			Creates: []v1alpha1.ControllerRevision{valid}, Deletes: []v1alpha1.ControllerRevision{noRV}}},
		{"delete without name", "nothing to delete", revstore.Request{
			Creates: []v1alpha1.ControllerRevision{valid},
			Deletes: []v1alpha1.ControllerRevision{with(existing, func(r *v1alpha1.ControllerRevision) { r.Name = "" })}}},
		{"delete of another parent's revision", "never touch revisions controlled by someone else", revstore.Request{
			Creates: []v1alpha1.ControllerRevision{valid},
			Deletes: []v1alpha1.ControllerRevision{with(existing, func(r *v1alpha1.ControllerRevision) {
				r.OwnerReferences = []metav1.OwnerReference{controllerRef(catSet(ns, "cats", "uid-b"))}
			})}}},
		{"cluster-scoped parent", "ControllerRevisions are namespaced", revstore.Request{
			Parent: withParent(p, func(p *revstore.Parent) { p.Namespace = "" })}},
		{"no parent UID", "revisions are found by their controller's UID", revstore.Request{
			Parent: withParent(p, func(p *revstore.Parent) { p.UID = "" }), Creates: []v1alpha1.ControllerRevision{valid}}},
		{"unknown op", "only load and commit exist", revstore.Request{Op: "prune"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := tc.req
			if req.Op == "" {
				req.Op = revstore.OpCommit
			}
			if req.Parent.Resource == "" {
				req.Parent = p
			}
			resp := call(t, s, req)
			if resp.Result != revstore.Invalid || resp.Message == "" {
				t.Fatalf("result %s (%q), want invalid: %s", resp.Result, resp.Message, tc.reason)
			}
			if got := storedNames(t, ns); !slices.Equal(got, []string{"existing"}) {
				t.Errorf("stored %v after an invalid commit, want only [existing]", got)
			}
			if r := get(t, ns, "existing"); r.ResourceVersion != existing.ResourceVersion {
				t.Errorf("existing was written")
			}
		})
	}
}

func with(r v1alpha1.ControllerRevision, f func(*v1alpha1.ControllerRevision)) v1alpha1.ControllerRevision {
	r.ObjectMeta = *r.ObjectMeta.DeepCopy()
	f(&r)
	return r
}

func withParent(p revstore.Parent, f func(*revstore.Parent)) revstore.Parent {
	f(&p)
	return p
}

// startNATS starts an embedded server on a loopback port for the test and
// returns how to connect to it (connections are closed before it stops).
func startNATS(t *testing.T) func(name string) *nats.Conn {
	t.Helper()
	srv, err := embeddednats.Start(embeddednats.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return func(name string) *nats.Conn {
		nc, _, err := natsx.Connect(natsx.ConnOptions{URL: srv.ClientURL(), Name: name})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
}

// The micro service: two replicas in the queue group serve the same
// protocol through revstore.Client, and stop cleanly.
func TestOverNATS(t *testing.T) {
	requireEnv(t)
	connect := startNATS(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	type replica struct {
		reg    *prometheus.Registry
		health *obs.Health
		done   chan error
	}
	var replicas []replica
	for i := range 2 {
		r := replica{reg: prometheus.NewRegistry(), health: &obs.Health{}, done: make(chan error, 1)}
		svc, err := New(Config{}, Deps{REST: env.Config, NC: connect(fmt.Sprintf("metabus-revisions-%d", i)), Log: zaptest.NewLogger(t), Metrics: r.reg, Health: r.health})
		if err != nil {
			t.Fatal(err)
		}
		go func() { r.done <- svc.Run(ctx) }()
		replicas = append(replicas, r)
	}
	nc := connect("test-client")
	client := jsbus.RevisionsClient{NC: nc, Timeout: 10 * time.Second}

	// Wait until both replicas serve (micro's $SRV.PING answers per replica).
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := pingCount(t, nc)
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d replicas answer $SRV.PING.%s, want 2", n, bus.RevisionsServiceName)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Replicas share the queue group of bus.RevisionsQueue (not micro's
	// default), on the protocol's subject.
	infoMsg, err := nc.Request("$SRV.INFO."+bus.RevisionsServiceName, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(infoMsg.Data, &info); err != nil {
		t.Fatal(err)
	}
	if len(info.Endpoints) != 1 || info.Endpoints[0].Subject != bus.RevisionsSubject || info.Endpoints[0].QueueGroup != bus.RevisionsQueue {
		t.Errorf("service endpoints %+v, want one on %s in queue group %s", info.Endpoints, bus.RevisionsSubject, bus.RevisionsQueue)
	}
	for i, r := range replicas {
		if err := r.health.Ready(); err != nil {
			t.Errorf("replica %d not ready: %v", i, err)
		}
	}

	ns := newNamespace(t)
	p := catSet(ns, "cats", "uid-a")
	ctrl := servedBy(t, p)
	create(t, orphan(p, "orphan"))
	load, err := client.Revisions(t.Context(), revstore.Request{Controller: ctrl, Op: revstore.OpLoad, Parent: p, Adopt: true})
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, load)
	if got := names(load.Revisions); !slices.Equal(got, []string{"orphan"}) || controllerUID(&load.Revisions[0]) != p.UID {
		t.Fatalf("loaded %v over NATS, want the adopted orphan", got)
	}
	adopted := load.Revisions[0]
	updated := with(adopted, func(r *v1alpha1.ControllerRevision) {})
	updated.Children = []v1alpha1.ControllerRevisionChildren{{Kind: "Pod", Names: []string{"cats-0"}}}
	commit, err := client.Revisions(t.Context(), revstore.Request{Controller: ctrl, Op: revstore.OpCommit, Parent: p,
		Creates: []v1alpha1.ControllerRevision{rev(p, "latest", `{"v":2}`)}, Updates: []v1alpha1.ControllerRevision{updated}})
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, commit)
	if commit.ResourceVersion == "" {
		t.Error("commit over NATS returned no resourceVersion")
	}
	if got := storedNames(t, ns); !slices.Equal(got, []string{"latest", "orphan"}) {
		t.Errorf("stored %v", got)
	}
	// The same update again is outdated now.
	again, err := client.Revisions(t.Context(), revstore.Request{Controller: ctrl, Op: revstore.OpCommit, Parent: p, Updates: []v1alpha1.ControllerRevision{updated}})
	if err != nil {
		t.Fatal(err)
	}
	if again.Result != revstore.Conflict {
		t.Errorf("replayed update: %s (%s), want conflict", again.Result, again.Message)
	}
	// The queue group spreads requests over both replicas.
	for range 30 {
		if resp, err := client.Revisions(t.Context(), revstore.Request{Controller: ctrl, Op: revstore.OpLoad, Parent: p}); err != nil || resp.Result != revstore.OK {
			t.Fatalf("load: %v %+v", err, resp)
		}
	}
	// Each request is served once (a queue group), by either replica.
	var total float64
	for i, r := range replicas {
		n := loadsServed(t, r.reg)
		if n == 0 {
			t.Errorf("replica %d served none of the 31 loads", i)
		}
		total += n
	}
	if total != 31 {
		t.Errorf("the replicas served %v loads for 31 requests: not one queue group", total)
	}
	// Garbage gets a service error, not a hang.
	msg, err := nc.Request(bus.RevisionsSubject, []byte("{not json"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code := msg.Header.Get("Nats-Service-Error-Code"); code != "400" {
		t.Errorf("malformed request: error code %q, want 400", code)
	}

	cancel()
	for i, r := range replicas {
		select {
		case err := <-r.done:
			if err != nil {
				t.Errorf("replica %d: Run returned %v", i, err)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("replica %d did not stop", i)
		}
	}
	// The endpoint's unsubscription reaches the server asynchronously.
	for start := time.Now(); ; time.Sleep(20 * time.Millisecond) {
		_, err = client.Revisions(context.Background(), revstore.Request{Controller: ctrl, Op: revstore.OpLoad, Parent: p})
		if errors.Is(err, nats.ErrNoResponders) {
			break
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("after stop: %v, want no responders", err)
		}
	}
}

// Stopping lets the requests a replica took finish (their API calls are
// not cancelled with Run's context), and Run returns only after they are
// answered.
func TestOverNATSStopFinishesInFlight(t *testing.T) {
	requireEnv(t)
	connect := startNATS(t)
	entered, release := make(chan struct{}), make(chan struct{})
	rc := rest.CopyConfig(env.Config)
	rc.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			// The load's LIST (the controller's GET before it passes).
			if req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/controllerrevisions") {
				close(entered)
				<-release
			}
			return rt.RoundTrip(req)
		})
	}
	svc, err := New(Config{}, Deps{REST: rc, NC: connect("metabus-revisions"), Log: zaptest.NewLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- svc.Run(ctx) }()
	client := jsbus.RevisionsClient{NC: connect("test-client")}
	for deadline := time.Now().Add(10 * time.Second); pingCount(t, client.NC) != 1; {
		if time.Now().After(deadline) {
			t.Fatal("the service does not answer pings")
		}
	}
	p := catSet(newNamespace(t), "cats", "uid-a")
	ctrl := servedBy(t, p)
	type result struct {
		resp *revstore.Response
		err  error
	}
	answered := make(chan result, 1)
	go func() {
		resp, err := client.Revisions(context.Background(), revstore.Request{Controller: ctrl, Op: revstore.OpLoad, Parent: p})
		answered <- result{resp, err}
	}()
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the load never reached the API server")
	}
	cancel()
	select {
	case err := <-done:
		close(release)
		t.Fatalf("Run returned (%v) while a request was in flight", err)
	case <-time.After(300 * time.Millisecond):
	}
	close(release)
	select {
	case r := <-answered:
		if r.err != nil || r.resp.Result != revstore.OK {
			t.Errorf("in-flight load: %v %+v, want ok", r.err, r.resp)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the in-flight load was not answered")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the in-flight request")
	}
}

// loadsServed reads metabus_revisions_requests_total{op="load",result="ok"}.
func loadsServed(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "metabus_revisions_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			if l["op"] == revstore.OpLoad && l["result"] == revstore.OK {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// pingCount counts the instances of the revisions micro service that answer
// a ping.
func pingCount(t *testing.T, nc *nats.Conn) int {
	t.Helper()
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest("$SRV.PING."+bus.RevisionsServiceName, inbox, nil); err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		if _, err := sub.NextMsg(200 * time.Millisecond); err != nil {
			return n
		}
		n++
	}
}

// Run needs a connection; Revisions alone does not.
func TestRunWithoutNATS(t *testing.T) {
	s, err := New(Config{}, Deps{REST: &rest.Config{Host: "https://127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Run(context.Background()); err == nil {
		t.Error("Run without a NATS connection succeeded")
	}
	if _, err := New(Config{}, Deps{}); err == nil {
		t.Error("New without a REST config succeeded")
	}
}

// Validation alone needs no API server: nothing is called for an invalid
// commit.
func TestValidateCommitShort(t *testing.T) {
	s, err := New(Config{}, Deps{REST: &rest.Config{Host: "https://127.0.0.1:1"}})
	if err != nil {
		t.Fatal(err)
	}
	p := catSet("ns", "cats", "uid-a")
	resp, _ := s.Revisions(t.Context(), revstore.Request{Op: revstore.OpCommit, Parent: p, Creates: []v1alpha1.ControllerRevision{orphan(p, "x")}})
	if resp.Result != revstore.Invalid {
		t.Errorf("result %s (%s), want invalid", resp.Result, resp.Message)
	}
	// A valid request against an unreachable API server is an Error, not a
	// panic or a Go error.
	ctrl := bus.ControllerRef{Kind: v1alpha1.CompositeControllerKind, Name: "catsets.example.com"}
	resp, err = s.Revisions(t.Context(), revstore.Request{Op: revstore.OpLoad, Controller: ctrl, Parent: p})
	if err != nil || resp.Result != revstore.Error || !strings.Contains(resp.Message, "read CompositeController") {
		t.Errorf("unreachable API server: %v %+v", err, resp)
	}
}

// servedBy returns the CompositeController whose parent resource is p's,
// creating it the first time (named <resource>.<group>, shared by the
// tests: parents are told apart by namespace).
func servedBy(t *testing.T, p revstore.Parent) bus.ControllerRef {
	t.Helper()
	gv, err := schema.ParseGroupVersion(p.APIVersion)
	if err != nil {
		t.Fatal(err)
	}
	name := p.Resource + "." + gv.Group
	if gv.Group == "" {
		name = p.Resource + ".core"
	}
	return compositeController(t, name, p.APIVersion, p.Resource)
}

// compositeController returns the CompositeController name, creating it
// with that parent resource if it does not exist yet.
func compositeController(t *testing.T, name, apiVersion, resource string) bus.ControllerRef {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": v1alpha1.CompositeControllerKind,
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"parentResource": map[string]any{"apiVersion": apiVersion, "resource": resource}},
	}}
	c := dyn.Resource(v1alpha1.CompositeControllerGVR)
	got, err := c.Create(context.Background(), u, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		got, err = c.Get(context.Background(), name, metav1.GetOptions{})
	}
	if err != nil {
		t.Fatalf("CompositeController %s: %v", name, err)
	}
	return bus.ControllerRef{Kind: v1alpha1.CompositeControllerKind, Name: name, UID: string(got.GetUID())}
}
